"""streampass: stream dependency tracking for PyTorch FX graphs.

Read where each node runs, build the cross-stream DAG, find races, insert the fewest
record/wait pairs, and encode the ordering so later passes cannot break it.

>>> import torch, streampass as sp
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def f(x):
...     with sp.stream(1):
...         y = x.sin()
...     return y + x.cos()
>>> gm = make_fx(f)(torch.ones(4))
>>> sp.verify(gm).ok, sp.run(gm).ok, sp.verify(gm).ok
(False, True, True)
"""

import importlib
import sys
import types

# Public names and the module each lives in. Nothing is imported until first use, so that
# `streampass --help` (and anything else that needs no graph) does not wait for torch.
_EXPORTS = {
    "stream": "annotate",
    "Comparison": "compare",
    "compare": "compare",
    "StreamDAG": "dag",
    "StreamPassError": "errors",
    "StreamSyncPass": "fx_pass",
    "RunResult": "pipeline",
    "run": "pipeline",
    "SyncPlan": "plan",
    "plan_syncs": "plan",
    "StreamAssignment": "reading",
    "read_streams": "reading",
    "execute": "runtime",
    "Schedule": "simulate",
    "simulate": "simulate",
    "Hazard": "verify",
    "Report": "verify",
    "verify": "verify",
    # StreamPass lives with torch._inductor. TORCH_LOGS="+streampass" makes torch import this
    # package while torch itself is half-loaded: nothing here may import torch eagerly.
    "StreamPass": "inductor",
    "GraphReport": "inductor",
}

__all__ = [
    "Comparison",
    "GraphReport",
    "Hazard",
    "Report",
    "RunResult",
    "Schedule",
    "StreamAssignment",
    "StreamDAG",
    "StreamPass",
    "StreamPassError",
    "StreamSyncPass",
    "SyncPlan",
    "compare",
    "execute",
    "plan_syncs",
    "read_streams",
    "run",
    "simulate",
    "stream",
    "verify",
]
__version__ = "0.1.0"


class _Package(types.ModuleType):
    """The package, whose public ``verify``, ``compare`` and ``simulate`` are functions named
    like the modules that define them: importing a submodule binds its name on the package,
    and here that binds the function instead (as ``from .verify import verify`` used to)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    try:  # a submodule: sp.runtime, sp.ops, ...
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module 'streampass' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

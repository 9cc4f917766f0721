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

# Public names and the module each lives in. Nothing is imported until first use, so that
# `streampass --help` (and anything else that needs no graph) does not wait for torch.
_EXPORTS = {
    "stream": "annotate",
    "Comparison": "view.compare",
    "compare": "view.compare",
    "StreamDAG": "analysis.dag",
    "StreamPassError": "errors",
    "StreamPassWarning": "errors",
    "StreamSyncPass": "transform.fx_pass",
    "RunResult": "transform.pipeline",
    "run": "transform.pipeline",
    "SyncPlan": "transform.plan",
    "plan_syncs": "transform.planner",
    "StreamAssignment": "analysis.reading",
    "StreamChoice": "assign.choose",
    "assign_streams": "assign.choose",
    "capture": "dynamo_capture",
    "read_streams": "analysis.reading",
    "execute": "runtime",
    "Schedule": "sim.simulate",
    "simulate": "sim.simulate",
    "Hazard": "analysis.hazards",
    "Report": "analysis.verify",
    "verify": "analysis.verify",
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
    "StreamChoice",
    "StreamDAG",
    "StreamPass",
    "StreamPassError",
    "StreamPassWarning",
    "StreamSyncPass",
    "SyncPlan",
    "assign_streams",
    "capture",
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

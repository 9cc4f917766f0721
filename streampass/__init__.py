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

from .annotate import stream
from .compare import Comparison, compare
from .dag import StreamDAG
from .errors import StreamPassError
from .pipeline import RunResult, run
from .plan import SyncPlan, plan_syncs
from .reading import StreamAssignment, read_streams
from .runtime import execute
from .simulate import Schedule, simulate
from .verify import Hazard, Report, verify

__all__ = [
    "Comparison",
    "Hazard",
    "Report",
    "RunResult",
    "Schedule",
    "StreamAssignment",
    "StreamDAG",
    "StreamPass",
    "StreamPassError",
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


def __getattr__(name: str):
    # StreamPass lives with torch._inductor; import it on first use only. TORCH_LOGS="+streampass"
    # makes torch import this package while torch itself is half-loaded.
    if name in ("StreamPass", "GraphReport"):
        from . import inductor

        return getattr(inductor, name)
    raise AttributeError(f"module 'streampass' has no attribute {name!r}")

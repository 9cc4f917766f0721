"""streampass: stream dependency tracking for PyTorch FX graphs.

Read where each node runs, build the cross-stream DAG, find races, insert the fewest
record/wait pairs, and encode the ordering so later passes cannot break it.
"""

from .annotate import stream
from .dag import StreamDAG
from .errors import StreamPassError
from .pipeline import RunResult, run
from .plan import SyncPlan, plan_syncs
from .runtime import execute
from .reading import StreamAssignment, read_streams
from .verify import Hazard, Report, verify

__all__ = [
    "Hazard",
    "Report",
    "StreamAssignment",
    "StreamDAG",
    "RunResult",
    "StreamPassError",
    "SyncPlan",
    "plan_syncs",
    "run",
    "execute",
    "read_streams",
    "stream",
    "verify",
]
__version__ = "0.1.0"

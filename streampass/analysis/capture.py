"""Whether a graph can be captured in a CUDA graph as it stands (a static check; pure).

``torch.cuda.graph`` and ``mode="reduce-overhead"`` capture from the ambient stream; every side
stream the capture forks must be joined back into it before the capture ends, or capture fails
("operation not permitted when stream is capturing" / un-joined work). Statically: every op a
side stream issues (a kernel, a record, a wait) must happen before the ambient stream's end, by
the graph's own syncs.

:func:`unjoined` lists the ops that are not. ``streampass.run`` returns graphs for which the
list is empty (docs/plan.md §6): its deferred-free waits on side streams are followed by one
join per stream into the ambient stream.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.fx

from streampass import ops
from streampass.analysis.dag import vector_clocks
from streampass.analysis.reading import read_streams
from streampass.ops import AMBIENT


def unjoined(g: torch.fx.GraphModule | torch.fx.Graph, external_events: Iterable[int] = ()) -> list[str]:
    """Names of the side-stream ops issued after the last point the ambient stream waits for
    their stream (empty: capturable).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + 1
    >>> gm = make_fx(f)(torch.ones(2))
    >>> unjoined(gm)  # nothing joins stream 1 back
    ['sin']
    >>> _ = sp.run(gm); unjoined(gm)
    []
    """
    a = read_streams(g, external_events=external_events)
    slot, clock = vector_clocks(a)
    output = next((n for n in reversed(a.nodes) if n.op == "output"), None)
    if output is None:
        return []
    known = clock[output]
    out = []
    for n in a.nodes:
        s = a.stream[n]
        if s == AMBIENT or not _issues(a, n):
            continue
        if clock[n][slot[s]] > known[slot[s]]:
            out.append(n.name)
    return out


def _issues(a, n: torch.fx.Node) -> bool:
    """A node that puts something on its stream: a kernel, or a record or wait."""
    call = a.syncs.get(n)
    if call is not None:
        return call.target not in ops.HOST_SIDE_OPS
    return a.is_compute(n)

"""What the edit's ``encode`` step makes each sync depend on (docs/plan.md §3), shared with the
assigner's pricing (``assign.price``), which must know what those dependencies hold alive."""

from __future__ import annotations

import operator

import torch.fx

from streampass import ops

Node = torch.fx.Node

#: the stream ops the edit wraps in ``control_deps`` (the others: fork/join, which it erases, and
#: ``record_stream``/``sync_dealloc``, which take their tensor as an argument of their own)
WRAPPABLE = frozenset(
    {ops.RECORD_EVENT, ops.WAIT_EVENT, ops.WAIT_STREAM, ops.SYNC_EVENT, ops.SYNC_STREAM, ops.SYNC_DEVICE}
)


def last_work(work: list[Node]) -> list[Node]:
    """The nodes of ``work`` (a stream's work since its last sync, in graph order) that no other
    node of ``work`` reads, directly or through a getitem: a sync ordered after these is ordered
    after all of ``work`` by data dependence, and holds only their tensors until it is issued.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> a = g.call_function(torch.sin, (x,)); b = g.call_function(torch.cos, (a,)); c = g.call_function(torch.tan, (x,))
    >>> [n.name for n in last_work([a, b, c])]
    ['cos', 'tan']
    """
    inside = set(work)
    getitem = operator.getitem

    def read_later(n: Node) -> bool:
        return any(u in inside or (u.target is getitem and any(v in inside for v in u.users)) for u in n.users)

    return [n for n in work if not read_later(n)]

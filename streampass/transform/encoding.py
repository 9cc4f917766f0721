"""What the edit's ``encode`` step makes each sync depend on (docs/plan.md §3), shared with the
assigner's pricing (``assign.price``), which must know what those dependencies hold alive."""

from __future__ import annotations

import operator

import torch
import torch.fx

from streampass import ops

Node = torch.fx.Node

#: the stream ops the edit wraps in ``control_deps`` (the others: fork/join, which it erases, and
#: ``record_stream``/``sync_dealloc``, which take their tensor as an argument of their own)
WRAPPABLE = frozenset(
    {ops.RECORD_EVENT, ops.WAIT_EVENT, ops.WAIT_STREAM, ops.SYNC_EVENT, ops.SYNC_STREAM, ops.SYNC_DEVICE}
)


def readers(n: Node) -> frozenset[Node]:
    """The nodes that read ``n``, directly or through a getitem (what :func:`last_work` tests).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> pair = g.call_function(torch.ops.aten.sort.default, (x,)); v = g.call_function(operator.getitem, (pair, 0))
    >>> c = g.call_function(torch.cos, (v,))
    >>> sorted(u.name for u in readers(pair))
    ['cos', 'getitem']
    """
    out = set(n.users)
    for u in n.users:
        if u.target is operator.getitem:
            out.update(u.users)
    return frozenset(out)


def last_work(work: list[Node], known: dict[Node, frozenset[Node]] | None = None) -> list[Node]:
    """The nodes of ``work`` (a stream's work since its last sync, in graph order) that no other
    node of ``work`` reads, directly or through a getitem: a sync ordered after these is ordered
    after all of ``work`` by data dependence, and holds only their tensors until it is issued.
    ``known``: :func:`readers` of the nodes, where a caller asks about one graph many times.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> a = g.call_function(torch.sin, (x,)); b = g.call_function(torch.cos, (a,)); c = g.call_function(torch.tan, (x,))
    >>> [n.name for n in last_work([a, b, c])]
    ['cos', 'tan']
    """
    inside = set(work)
    if known is None:
        return [n for n in work if inside.isdisjoint(readers(n))]
    return [n for n in work if inside.isdisjoint(known[n])]


def output_value_to_thread(out: Node, last: Node, index: dict[Node, int]) -> tuple[Node, Node] | None:
    """The use ``(user, value)`` that should read ``value`` through ``last``, the ambient
    stream's last sync, so that the output follows ``last``; None if data already orders the
    output after ``last`` (or nothing it reads is made before it: ``index`` is the graph order).
    The output itself reads through ``last`` when it can; else the first node of its tail (the
    nodes after ``last`` it depends on, all on the ambient stream: ``last`` ends every side
    stream) with an input made before ``last``.

    The per-stream chains and the exit joins make every sync an ancestor of ``last``; reading
    through it makes every sync an ancestor of the output. Otherwise a sort that places the
    output as soon as its inputs are (``legalize_graph``) leaves the final joins and free-point
    waits after FX's ``return``.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.sin, (x,)); w = g.call_function(torch.cos, (x,))
    >>> z = g.call_function(torch.tan, (y,)); out = g.output((y, z))
    >>> order = {n: i for i, n in enumerate(g.nodes)}
    >>> output_value_to_thread(out, w, order) == (out, y)  # w stands for the last sync
    True
    >>> out.args = (z,)
    >>> output_value_to_thread(out, w, order) == (z, y)  # z, made after w, reads y through it
    True
    """
    at = index[last]
    seen, tail = {out}, [out]
    for node in tail:  # breadth first: only nodes after ``last`` in graph order can read it
        for x in node.all_input_nodes:
            if x is last:
                return None
            if x not in seen and index.get(x, len(index)) >= at:
                seen.add(x)
                tail.append(x)
    for user in tail:
        value = next((x for x in user.all_input_nodes if index.get(x, len(index)) < at and _tensor_like(x)), None)
        if value is not None:
            return user, value
    return None


def _tensor_like(n: Node) -> bool:
    val = n.meta.get("val")
    return isinstance(val, torch.Tensor) or ("val" not in n.meta and n.op != "get_attr")

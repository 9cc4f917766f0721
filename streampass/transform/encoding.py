"""What the edit's ``encode`` step makes each sync depend on (docs/plan.md §3), shared with the
assigner's pricing (``assign.price``), which must know what those dependencies hold alive."""

from __future__ import annotations

import operator

import torch
import torch.fx

from streampass import ops, values

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
    nodes after ``last`` it depends on: the ambient stream's work, since ``last`` ends every side
    stream's, and views) with a tensor input made before ``last``. A tail whose every input is
    made after ``last`` (a factory), or reached only through a multi-output op's getitems, gets
    None: nothing it reads can carry the order.

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
        if user.target is operator.getitem and not values.indexes_a_tensor(user):
            continue  # one result of a multi-output op: what it reads is the op's list, not a tensor
        value = next((x for x in user.all_input_nodes if index.get(x, len(index)) < at and _tensor_like(x)), None)
        if value is not None:
            return user, value
    return None


def _tensor_like(n: Node) -> bool:
    val = n.meta.get("val")
    if n.op == "get_attr":  # a module's tensor (a graph returning only that still follows the syncs)
        owner = n.graph.owning_module
        return isinstance(val, torch.Tensor) or isinstance(ops.attribute(owner, n.target), torch.Tensor)
    return isinstance(val, torch.Tensor) or "val" not in n.meta


def reads_an_input(node: Node, memo: dict[Node, bool]) -> bool:
    """Whether ``node`` depends on a placeholder. FX re-traces a module's code when it is
    unpickled, with module tensors as plain tensors: a node that depends on no placeholder is
    computed at trace time, and a sync on it runs then and vanishes. ``memo`` carries answers
    between calls.

    >>> g = torch.fx.Graph(); x = g.placeholder("x"); w = g.get_attr("w")
    >>> y = g.call_function(torch.sin, (w,)); z = g.call_function(torch.add, (y, x))
    >>> memo = {}
    >>> reads_an_input(y, memo), reads_an_input(z, memo)
    (False, True)
    """
    todo = [node]
    while todo:
        n = todo[-1]
        if n in memo:
            todo.pop()
        elif n.op == "placeholder":
            memo[todo.pop()] = True
        elif pending := [i for i in n.all_input_nodes if i not in memo]:
            todo.extend(pending)
        else:
            memo[todo.pop()] = any(memo[i] for i in n.all_input_nodes)
    return memo[node]

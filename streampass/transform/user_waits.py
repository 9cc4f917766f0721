"""The order a program's own waits give: a stream's reads of graph inputs after it waits stay
after the wait (docs/plan.md §3)."""

from __future__ import annotations

import operator

import torch
import torch.fx

from streampass import ops
from streampass.analysis.requirements import is_tensor_value

Node = torch.fx.Node


#: the syncs of a user's program a stream's later work waits behind: its own waits, and the host
#: barriers, which hold back every later launch
USER_WAITS = frozenset({ops.WAIT_EVENT, ops.WAIT_STREAM})
HOST_BARRIERS = frozenset({ops.SYNC_EVENT, ops.SYNC_STREAM, ops.SYNC_DEVICE})


def _input_behind(x: Node, root: dict[Node, Node]) -> Node | None:
    """The graph input (a placeholder or module tensor) whose storage ``x`` is, looking through
    views and passthroughs; None for a tensor the graph makes, and for what is no tensor (a
    ``torch.cond`` branch, a SymInt)."""
    while x is not None:
        x = root.get(x, x)
        if x.op in ("placeholder", "get_attr"):
            return x if is_tensor_value(x) else None
        x = ops.passthrough_source(x)
    return None


def input_reads_after_user_waits(order: list[Node], stream: dict, calls: dict, root: dict, hidden: dict) -> dict:
    """consumer -> ``[(wait, input)]``: a node on stream ``s`` that reads a graph input after a
    wait of ``s`` the program had (not one streampass added: :func:`ops.added_by_streampass`)
    or a host barrier must stay after it, since the wait may be for a write of that input before
    the graph, which no analysis of the graph sees (``cur.wait_stream(side); buf.add_(1)`` with
    ``side``'s write of ``buf`` in an earlier step). ``order``: the graph's nodes; ``calls``:
    its stream ops; ``root``: each view's storage, and ``hidden``: what each ``call_module``
    reads without taking it as an argument (``StreamAssignment.root``, ``.hidden``).

    One input per consumer is enough: the encoding reads it through the latest such wait of its
    stream, which the per-stream chain orders after the earlier ones, and through the latest host
    barrier too when that is on another stream's chain (the ambient one). A ``copy_``
    (functionalization's epilogue) whose source is made before the wait reads the source through
    it, so that it still writes the input itself (what AOT autograd asks of a graph it partitions).

    >>> g = torch.fx.Graph(); buf = g.placeholder("buf")
    >>> wait = g.call_function(ops.WAIT_STREAM, (0, 1)); add = g.call_function(torch.add, (buf, 1))
    >>> _ = g.output(add); order = list(g.nodes)
    >>> input_reads_after_user_waits(order, {}, {wait: ops.as_sync_call(wait)}, {}, {}) == {add: [(wait, buf)]}
    True
    """
    latest: dict[int, Node] = {}
    barrier: Node | None = None
    seen: dict[Node, int] = {}
    out: dict[Node, list[tuple[Node, Node]]] = {}
    for i, n in enumerate(order):
        seen[n] = i
        call = calls.get(n)
        if call is not None:
            if call.target in USER_WAITS and not ops.added_by_streampass(n):
                latest[stream.get(n, ops.AMBIENT)] = n
            elif call.target in HOST_BARRIERS and not ops.added_by_streampass(n):
                barrier = n
            continue
        if n.op not in ops.CALL_OPS or n.target is operator.getitem:
            continue
        s = stream.get(n, ops.AMBIENT)
        waits = [w for w in (latest.get(s), barrier) if w is not None]
        if len(waits) == 2 and stream.get(barrier, ops.AMBIENT) == s:
            waits = [max(waits, key=seen.__getitem__)]  # one chain: the later follows the other
        if not waits:
            continue
        last = max(waits, key=seen.__getitem__)
        src = n.args[1] if n.target is torch.ops.aten.copy_.default and len(n.args) > 1 else None
        if isinstance(src, Node) and seen[src] < seen[last] and is_tensor_value(src):
            found = _input_behind(src, root) or root.get(src, src)  # keeps the copy's destination
        else:
            found = next((v for v in (_input_behind(x, root) for x in ops.input_nodes(n)) if v is not None), None)
        if found is None:  # a call_module reads its own parameters and buffers
            found = next((r for roots in hidden.get(n, ()) for r in roots), None)
        if found is not None:
            out[n] = [(w, found) for w in waits]
    return out

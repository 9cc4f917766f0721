"""The reading of a graph after :mod:`streampass.transform.apply` edited it, from the edit's own
bookkeeping instead of a second :func:`~streampass.analysis.reading.read_streams`, and the
region check that the bookkeeping says what the edited nodes say.

The edit knows every stream, sync and storage root it made or changed; everything else is as
the reading before the edit found it. So the reading after costs one walk of the node list,
and :func:`check_region` re-reads only the nodes the edit touched. The property tests compare
this reading with a fresh ``read_streams`` of the edited graph, field by field.
"""

from __future__ import annotations

import torch
import torch.fx

from streampass import ops, values
from streampass.analysis.reading import StreamAssignment, annotated_stream, named_stream
from streampass.errors import StreamPassError
from streampass.ops import AMBIENT

Node = torch.fx.Node


def reading_after(
    before: StreamAssignment,
    graph: torch.fx.Graph,
    stream: dict[Node, int],
    calls: dict[Node, ops.SyncCall],
    root: dict[Node, Node],
) -> StreamAssignment:
    """The :class:`StreamAssignment` of ``graph`` as edited, given the edit's bookkeeping.

    ``stream`` and ``root`` are the reading's maps with the edit's new nodes added; ``calls``
    every stream op, new ones included, as first made (a plain op the edit then wrapped in
    ``control_deps`` reads here as the wrapper it became). Erased nodes (fork/join) drop out.
    Raises :class:`StreamPassError` if the graph holds a node the bookkeeping cannot place.
    :func:`streampass.transform.apply.apply_and_read` calls it:

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from streampass.transform.apply import apply_and_read
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> changed, after = apply_and_read(gm, sp.plan_syncs(sp.read_streams(gm)))
    >>> fresh = sp.read_streams(gm)  # what a second reading would find
    >>> changed, after.nodes == fresh.nodes, after.stream == fresh.stream, after.root == fresh.root
    (True, True, True, True)
    """
    nodes = list(graph.nodes)
    out_stream: dict[Node, int] = {}
    out_root: dict[Node, Node] = {}
    syncs: dict[Node, ops.SyncCall] = {}
    named: set[int] = set()
    for n in nodes:
        call = calls.get(n)
        if call is not None:
            if n.target is ops.CONTROL_DEPS and call.wrapper is not n:
                call = ops.SyncCall(call.target, call.args, n, n)
            syncs[n] = call
            other = named_stream(call)
            if other is not None:
                named.add(other)
            out_root[n] = n
        elif n in root:
            out_root[n] = root[n]
        elif n.op == "get_attr":  # a subgraph the edit added: an input, like any attribute
            out_root[n] = n
        else:
            raise StreamPassError(f"internal error: the edit made {n.name} without recording it", n.name)
        out_stream[n] = stream.get(n, AMBIENT)
    return StreamAssignment(
        graph=graph,
        nodes=nodes,
        stream=out_stream,
        syncs=syncs,
        root=out_root,
        external_events=before.external_events,
        position={n: i for i, n in enumerate(nodes)},
        compute=before.compute,
        producer=before.producer,
        named=frozenset(named),
        hidden=before.hidden,
    )


def check_region(a: StreamAssignment, edited) -> None:
    """Re-read the nodes an edit made or changed, and compare with the reading ``a`` built for
    them: the stream op each performs, its stream annotation and its storage root.

    Raises :class:`StreamPassError` (an internal error, naming the node) on any difference.
    Nodes the edit did not touch read as they did before it, which needs no check.

    >>> import torch, streampass as sp
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.sin(x))
    >>> a = sp.read_streams(gm)
    >>> sin = a.node_named("sin")
    >>> check_region(a, [sin])  # as read: nothing to say
    >>> sin.meta["custom"] = {"stream": 2}
    >>> check_region(a, [sin])
    Traceback (most recent call last):
      ...
    streampass.errors.StreamPassError: node 'sin': internal error: sin is annotated 2, planned 0
    """
    for n in dict.fromkeys(edited):
        if n not in a.position:
            continue  # erased since (a fork/join)
        want, got = a.syncs.get(n), ops.as_sync_call(n)
        if (want is None) != (got is None) or (
            got is not None and (got.target, got.args, got.wrapper) != (want.target, want.args, want.wrapper)
        ):
            raise StreamPassError(f"internal error: the edit left {n.name} performing {got}, planned {want}", n.name)
        if got is None and n.op in ops.CALL_OPS:
            s = annotated_stream(n)
            if (AMBIENT if s is None else s) != a.stream[n]:
                raise StreamPassError(f"internal error: {n.name} is annotated {s}, planned {a.stream[n]}", n.name)
            src = values.aliases_input(n)
            expected = a.root[src] if src is not None else n
            if a.root[n] is not expected:
                raise StreamPassError(f"internal error: {n.name} reads storage {a.root[n].name}, not {expected.name}")


def check_order(graph: torch.fx.Graph, edited) -> None:
    """Every node the edit made or re-pointed (``edited``) comes after its inputs.

    What ``Graph.lint`` would catch of the edit, in time proportional to it (lint re-checks the
    whole graph: 6% of the pass on 16k nodes).

    >>> g = torch.fx.Graph(); x = g.placeholder("x"); y = g.call_function(torch.sin, (x,))
    >>> check_order(g, [y])
    >>> x.args = (y,)
    >>> check_order(g, [x])
    Traceback (most recent call last):
      ...
    streampass.errors.StreamPassError: node 'x': internal error: the edit made x read sin before it is defined
    """
    pos = {n: i for i, n in enumerate(graph.nodes)}
    for n in edited:
        for x in ops.input_nodes(n):
            if pos.get(x, len(pos)) >= pos[n]:
                raise StreamPassError(
                    f"internal error: the edit made {n.name} read {x.name} before it is defined", n.name
                )

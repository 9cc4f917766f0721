"""The bodies of higher-order ops: ``torch.cond``'s branches, ``while_loop``'s and ``map``'s
bodies, ``wrap_with_set_grad_enabled``, ``invoke_subgraph`` and the like. Each is a graph of its
own that runs, on the stream that calls it, when the op runs: the calling graph reads the op as
one kernel, and a body's streams are read (and planned) in the body, as inductor does when it
hands each body to its post-grad passes on its own. ``control_deps`` bodies are not among them:
they are streampass's syncs, read as part of the graph that calls them. Nor are the subgraphs
inductor inlines into the calling op (:data:`INLINING_OPS`): they run where the op runs, as part
of it, and are never planned."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch.fx

from streampass import ops
from streampass.analysis.reading import AMBIENT, StreamAssignment, annotated_stream, read_streams
from streampass.errors import StreamPassError

#: Higher-order ops whose subgraphs inductor lowers into the op: into its own kernel as pointwise
#: code (``PointwiseSubgraphLowering``, which creates no buffer) for flex attention's score and
#: mask functions, a pointwise ``associative_scan``'s combine function and ``foreach_map``'s
#: function; node by node into the calling graph, each node on its annotated stream (dynamo gives
#: them the op's), for ``invoke_quant``'s function. A sync planned inside would be lowered in the
#: caller, under the caller's attribute names.
INLINING_OPS = frozenset({"flex_attention", "flex_attention_backward", "associative_scan", "foreach_map"})
#: those of them whose subgraph inductor lowers into the calling graph node by node
NODE_BY_NODE_OPS = frozenset({"invoke_quant", "invoke_quant_packed"})
INLINING_OPS |= NODE_BY_NODE_OPS
#: the ``GraphModule.meta`` key that marks such a subgraph (:func:`inlined`, :func:`is_inlined`)
INLINED_KEY = "streampass_inlined_into"


def _higher_order_users(gm: torch.fx.GraphModule):
    """``(getter, module, op)`` for each higher-order op (``control_deps`` aside) that takes a
    subgraph of ``gm`` (directly or inside a tuple, as flex attention's block mask holds its
    mask function)."""
    for getter in gm.graph.find_nodes(op="get_attr"):
        module = ops.attribute(gm, getter.target)
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for user in getter.users:
            if (
                user.op == "call_function"
                and isinstance(user.target, torch._ops.HigherOrderOperator)
                and user.target is not ops.CONTROL_DEPS
            ):
                yield getter, module, user


def inlines(op: torch.fx.Node, kinds: frozenset[str] = INLINING_OPS) -> bool:
    """Whether inductor lowers the subgraphs ``op`` takes into ``op`` (:data:`INLINING_OPS`, or
    ``kinds``)."""
    return isinstance(op.target, torch._ops.HigherOrderOperator) and op.target.name() in kinds


@dataclass(frozen=True)
class Body:
    """One body: the higher-order op's node that calls it first, its attribute's name, and
    every op that calls it (a body can be shared: a graph traced again names a module once per
    use, dynamo reuses one ``invoke_subgraph`` body for repeated calls)."""

    op: torch.fx.Node
    name: str
    module: torch.fx.GraphModule
    callers: tuple[torch.fx.Node, ...] = ()


def bodies(gm: torch.fx.GraphModule) -> list[Body]:
    """The bodies ``gm``'s higher-order ops call, each once, in the order of their ``get_attr``
    nodes (not the bodies' own bodies).

    >>> import torch
    >>> def f(x):
    ...     return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> [(b.op.name, b.name) for b in bodies(make_fx(f)(torch.ones(2)))]
    [('cond', 'true_graph_0'), ('cond', 'false_graph_0')]
    """
    found: dict[int, Body] = {}
    for getter, module, user in _higher_order_users(gm):
        if inlines(user):
            continue
        first = found.setdefault(id(module), Body(user, getter.target, module))
        if user not in first.callers:
            found[id(module)] = dataclasses.replace(first, callers=(*first.callers, user))
    return list(found.values())


def inlined(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.GraphModule, str]]:
    """Every subgraph under ``gm`` that an :data:`INLINING_OPS` op takes and no other op runs as
    a body, each once, with the op's name. Inductor hands those subgraphs to its post-grad passes
    on their own too, before ``gm``: the compile hook marks them (``module.meta[INLINED_KEY]``),
    and the mark is how StreamPass knows one there (:func:`is_inlined`).

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from torch.nn.attention.flex_attention import flex_attention
    >>> q = torch.ones(1, 1, 4, 8)
    >>> gm = make_fx(lambda q: flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s * 2))(q)
    >>> [op for _, op in inlined(gm)], bodies(gm)
    (['flex_attention', 'flex_attention'], [])
    """
    found: dict[int, tuple[torch.fx.GraphModule, str]] = {}
    for module in [gm, *nested(gm)]:
        users = [(sub, user) for _, sub, user in _higher_order_users(module)]
        runs = {id(sub) for sub, user in users if not inlines(user)}
        for sub, user in users:
            if inlines(user) and id(sub) not in runs:
                found.setdefault(id(sub), (sub, user.target.name()))
    return list(found.values())


def is_inlined(gm: torch.fx.GraphModule | None) -> bool:
    """Whether the compile hook marked ``gm`` as a subgraph inductor inlines (:func:`inlined`)."""
    return gm is not None and INLINED_KEY in gm.meta


def nested(gm: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    """Every body under ``gm``, its bodies' bodies included, each once."""
    out: dict[int, torch.fx.GraphModule] = {}
    todo = [gm]
    while todo:
        for b in bodies(todo.pop()):
            if id(b.module) not in out:
                out[id(b.module)] = b.module
                todo.append(b.module)
    return list(out.values())


def indices_used(gm: torch.fx.GraphModule) -> int:
    """The largest stream or event index ``gm`` or any body under it names (0 if none): a
    body shares the stream and event table of the graph that calls it, so new events of one
    must stay clear of every index of the others."""
    largest = 0
    for module in [gm, *nested(gm)]:
        for node in module.graph.nodes:
            k = annotated_stream(node)
            if isinstance(k, int) and not isinstance(k, bool):
                largest = max(largest, k)
            call = ops.as_sync_call(node)
            if call is not None:
                largest = max([largest, *(x for x in call.args if isinstance(x, int) and not isinstance(x, bool))])
    return largest


def external_events(a: StreamAssignment) -> frozenset[int]:
    """The events a body of the graph read into ``a`` may wait on without recording them: the
    calling graph's, recorded before the op runs, or by code outside it."""
    return a.events() | a.external_events


def tree_streams(module: torch.fx.GraphModule, ext, planned: bool) -> list[int]:
    """The streams ``module`` and every body under it use; ``ext``: the events it may wait on
    unrecorded (:func:`external_events` of its caller). ``planned``: as its last plan recorded
    them (``runtime.state(module)["streams"]``; inductor hands each body to the pass, and lowers
    it, before the graph that calls it), where there is such a record; else as read now.

    >>> import torch, streampass as sp
    >>> def f(x):
    ...     with sp.stream(3):
    ...         return x.sin()
    >>> tree_streams(torch.fx.symbolic_trace(f), (), planned=False)
    [0, 3]
    """
    record = module.meta.get("streampass", {})
    if planned and "streams" in record:
        return list(record["streams"])
    a = read_streams(module, ext)
    out = set(a.streams)
    for body in bodies(module):
        out.update(tree_streams(body.module, external_events(a), planned))
    return sorted(out)


def streams_below(gm: torch.fx.GraphModule, a: StreamAssignment) -> set[int]:
    """The streams the bodies under ``gm`` use, as their last plans recorded them (a body never
    planned: as read now); ``a`` is ``gm``'s reading. What ``gm``'s own record must add, so that
    a caller of ``gm`` sees them (``StreamPass`` on a graph with nothing of its own to plan)."""
    return {s for body in bodies(gm) for s in tree_streams(body.module, external_events(a), True)}


def ops_with_streams(gm: torch.fx.GraphModule, a: StreamAssignment) -> dict[torch.fx.Node, tuple[str, list[int]]]:
    """Each op of ``gm`` (read into ``a``) that calls a body whose tree places work on a side
    stream: op -> (the body's name, its streams). Such an op runs on the ambient stream
    (:func:`off_ambient`); the assigner leaves it there."""
    out: dict[torch.fx.Node, tuple[str, list[int]]] = {}
    for body in bodies(gm):
        inner = tree_streams(body.module, external_events(a), True)
        if set(inner) - {AMBIENT}:
            for op in body.callers or (body.op,):
                out.setdefault(op, (body.name, inner))
    return out


def off_ambient(body: Body, caller: StreamAssignment, body_streams: list[int]) -> list[torch.fx.Node]:
    """The ops calling ``body`` that run on a side stream ``k`` while the body puts work on
    streams other than ``k`` and the ambient one. A body's streams are read (and planned) from
    the ambient stream, so such an op must run there (:func:`streampass.run` moves it). A body
    on ``k`` alone (strict export copies the op's annotation onto its nodes) is planned with
    syncs between ``k`` and the ambient stream: more order than needed, never less."""
    return [
        op
        for op in body.callers or (body.op,)
        if caller.stream.get(op, AMBIENT) != AMBIENT and not set(body_streams) <= {AMBIENT, caller.stream[op]}
    ]


def check_caller(body: Body, caller: StreamAssignment, body_streams: list[int]) -> None:
    """Refuse a body that :func:`off_ambient` says cannot run where its op does."""
    for op in off_ambient(body, caller, body_streams)[:1]:
        raise StreamPassError(
            f"runs on stream {caller.stream[op]}, and its body {body.name} places work on streams {body_streams}: "
            "streampass reads a body's streams only when the op that calls it runs on the ambient stream "
            "(streampass.run moves it there)",
            op.name,
        )

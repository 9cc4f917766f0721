"""The bodies of higher-order ops: ``torch.cond``'s branches, ``while_loop``'s and ``map``'s
bodies, ``wrap_with_set_grad_enabled``, ``invoke_subgraph`` and the like. Each is a graph of its
own that runs, on the stream that calls it, when the op runs: the calling graph reads the op as
one kernel, and a body's streams are read (and planned) in the body, as inductor does when it
hands each body to its post-grad passes on its own. ``control_deps`` bodies are not among them:
they are streampass's syncs, read as part of the graph that calls them."""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx

from streampass import ops
from streampass.analysis.reading import AMBIENT, StreamAssignment, annotated_stream
from streampass.errors import StreamPassError


@dataclass(frozen=True)
class Body:
    """One body: the higher-order op's node that calls it, and its attribute's name."""

    op: torch.fx.Node
    name: str
    module: torch.fx.GraphModule


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
    for getter in gm.graph.find_nodes(op="get_attr"):
        module = ops.attribute(gm, getter.target)
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for user in getter.users:
            if (
                user.op == "call_function"
                and isinstance(user.target, torch._ops.HigherOrderOperator)
                and user.target is not ops.CONTROL_DEPS
                and id(module) not in found
            ):
                found[id(module)] = Body(user, getter.target, module)
    return list(found.values())


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


def check_caller(body: Body, caller: StreamAssignment, body_streams: list[int]) -> None:
    """Refuse a body that puts work on other streams while its op runs on a side stream ``k``.
    A body on ``k`` alone (strict export copies the op's annotation onto its nodes) is planned
    with syncs between ``k`` and the ambient stream: more order than needed, never less."""
    k = caller.stream.get(body.op, AMBIENT)
    if k != AMBIENT and not set(body_streams) <= {AMBIENT, k}:
        raise StreamPassError(
            f"runs on stream {k}, and its body {body.name} places work on streams {body_streams}: streampass "
            "plans a body's streams only when the op that calls it runs on the ambient stream",
            body.op.name,
        )

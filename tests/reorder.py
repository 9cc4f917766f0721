"""Random topological orders of a GraphModule: what a later pass is allowed to do to it."""

from __future__ import annotations

import random

import torch
import torch.fx

from streampass import modules, ops, values


def _mutation_order(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, set[torch.fx.Node]]:
    """Extra predecessors that keep the order of accesses to storage written in place.

    A legal reordering (inductor's, ``legalize_graph``'s) keeps a write after earlier reads
    and writes of its storage and later reads after it; data edges alone do not say that. A
    module's tensors are one storage however a ``get_attr`` names them, and a ``call_module``
    uses its module's (``modules.module_state``) without taking them as arguments.
    """
    owner = nodes[0].graph.owning_module if nodes else None
    root: dict[torch.fx.Node, object] = {}
    for n in nodes:
        if n.op == "get_attr" and owner is not None:
            root[n] = values.attribute_storage(n.target, ops.attribute(owner, n.target))
            continue
        src = values.aliases_input(n)
        root[n] = root.get(src, src) if src is not None else n
    extra: dict[torch.fx.Node, set[torch.fx.Node]] = {n: set() for n in nodes}
    accesses: dict[object, list[torch.fx.Node]] = {}
    last_write: dict[object, torch.fx.Node] = {}
    for n in nodes:
        written = {root[x] for x in values.written_arguments(n)}
        state = modules.module_state(n) if n.op == "call_module" else []
        hidden = [values.attribute_storage(name, t) for name, t, _ in state]
        written |= {key for key, (_, _, w) in zip(hidden, state) if w}
        for r in [root[inp] for inp in n.all_input_nodes] + hidden:
            if r in last_write and last_write[r] is not n:
                extra[n].add(last_write[r])
            if r in written:
                extra[n].update(a for a in accesses.get(r, []) if a is not n)
            accesses.setdefault(r, []).append(n)
        for r in written:
            last_write[r] = n
    return extra


def random_topological_copy(gm: torch.fx.GraphModule, seed: int) -> torch.fx.GraphModule:
    """A copy of ``gm`` with its nodes in a random legal order: data dependencies and the
    order of accesses to storage written in place are kept, nothing else.

    Placeholders stay first. The output is drawn like any node once its inputs are placed, so
    it may come before nodes it does not depend on, as in ``legalize_graph``'s sort (FX's code
    returns there: a sync after it never runs). It stays after the program's own writes in place
    that it does not depend on (``copy_`` into an input, a write whose result only an unused view
    reads): a pass that put the output first would drop them, with or without streams, and
    reading refuses a node after the output.
    """
    rng = random.Random(seed)
    nodes = list(gm.graph.nodes)
    extra = _mutation_order(nodes)
    output = next(n for n in nodes if n.op == "output")
    needed, todo = set(), [output]  # what the output depends on
    while todo:
        for x in todo.pop().all_input_nodes:
            if x not in needed:
                needed.add(x)
                todo.append(x)
    extra[output].update(n for n in nodes if n not in needed and values.written_arguments(n))
    users: dict[torch.fx.Node, set[torch.fx.Node]] = {n: set(n.users) for n in nodes}
    for n, before in extra.items():
        for b in before:
            users[b].add(n)
    pending = {n: len(set(n.all_input_nodes) | extra[n]) for n in nodes}
    ready = [n for n in nodes if pending[n] == 0]
    order = [n for n in ready if n.op == "placeholder"]
    ready = [n for n in ready if n.op != "placeholder"]
    for n in order:
        for u in users[n]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    while ready:
        n = ready.pop(rng.randrange(len(ready)))
        order.append(n)
        for u in users[n]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    assert len(order) == len(nodes), "graph has a cycle"
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in order:
        env[n] = g.node_copy(n, lambda x: env[x])
    return torch.fx.GraphModule(gm, g)

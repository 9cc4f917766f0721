"""The ``control_deps`` sync bodies: small GraphModules, held as submodules of the graph, that
run one stream op; made fresh, or copied so that one sync can change its own."""

from __future__ import annotations

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from streampass import ops

Node = torch.fx.Node


def sync_subgraph(owner: torch.nn.Module, target, n_int: int, n_pass: int) -> torch.fx.GraphModule:
    """A body running ``target(*ints)`` and passing ``n_pass`` values through."""
    g = torch.fx.Graph()
    ints = [g.placeholder(f"index_{i}") for i in range(n_int)]
    phs = [g.placeholder(f"dep_{i}") for i in range(n_pass)]
    result = g.call_function(target, tuple(ints))
    result.meta["val"] = None  # what dynamo gives a stream op; inductor's lowering reads it (2.11)
    g.output((result, *phs))
    # Lazy: the subgraph's Python code is generated on first call, not for every sync we add.
    return _LazyGraphModule(owner, g, class_name="StreamSync")


def set_wrapper_val(wrapper: Node) -> None:
    """Give a ``control_deps`` sync the fake value of what it returns, ``(None, *passthroughs)``:
    inductor's ``FakeTensorUpdater`` re-derives each getitem from it (torch 2.12 indexes it, and
    a wrapper that gained a passthrough kept a tuple one short)."""
    wrapper.meta["val"] = (None, *(p.meta.get("val") for p in ops.passthrough_values(wrapper)))


def drop_unused_body(gm: torch.fx.GraphModule, body) -> bool:
    """Erase ``body`` (a ``control_deps``' subgraph argument) if it is a ``get_attr`` of a
    top-level submodule that nothing uses any more, and the submodule once no ``get_attr`` names
    it (a re-traced graph has one per use); returns whether it erased the node."""
    if not (isinstance(body, Node) and body.op == "get_attr" and "." not in body.target and not body.users):
        return False
    gm.graph.erase_node(body)
    if not gm.graph.find_nodes(op="get_attr", target=body.target):
        delattr(gm, body.target)
    return True


def own_sync_body(gm: torch.fx.GraphModule, node: Node, base: str, edit=None) -> Node:
    """Give the ``control_deps`` node ``node`` a copy of its subgraph of its own, first passed to
    ``edit(graph)`` if given; returns the new ``get_attr`` (inserted before ``node``), which the
    caller puts in ``node.args[1]``. Subgraphs may be shared; this is how one sync's changes."""
    body = torch.fx.Graph()
    body.output(body.graph_copy(ops.subgraph_module(node).graph, {}))
    if edit is not None:
        edit(body)
    attr = free_attr(gm, f"{base}_{node.name}")
    gm.add_submodule(attr, torch.fx.GraphModule(gm, body, class_name="StreamSync"))
    with gm.graph.inserting_before(node):
        return gm.graph.get_attr(attr)


def free_attr(gm: torch.nn.Module, base: str) -> str:
    """An attribute name on ``gm`` starting with ``base`` that is not taken yet."""
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name

"""Helpers for building small multi-stream graphs by hand (the fixtures are in conftest.py)."""

from __future__ import annotations

import torch
import torch.fx

from streampass import ops

aten = torch.ops.aten


class GraphBuilder:
    """Build an FX graph node by node: ``b.op(aten.sin.default, x, stream=1)``."""

    def __init__(self, device: str = "cpu", size: int = 4):
        self.g = torch.fx.Graph()
        self.device, self.size = device, size

    def input(self, name: str) -> torch.fx.Node:
        n = self.g.placeholder(name)
        n.meta["val"] = torch.empty(self.size, self.size, device=self.device)
        return n

    def op(self, target, *args, stream: int | None = None, name: str | None = None, **meta) -> torch.fx.Node:
        n = self.g.call_function(target, args, name=name)
        n.meta["val"] = torch.empty(self.size, self.size, device=self.device)
        if stream is not None:
            n.meta["custom"] = {"stream": stream}
        n.meta.update(meta)
        return n

    def sync(self, target, *args, name: str | None = None) -> torch.fx.Node:
        return self.g.call_function(target, args, name=name)

    def output(self, *values) -> torch.fx.GraphModule:
        self.g.output(tuple(values))
        return torch.fx.GraphModule(torch.nn.Module(), self.g)


def wrap_syncs_in_control_deps(gm: torch.fx.GraphModule) -> None:
    """Wrap every sync of ``gm`` in ``control_deps``, as AOT autograd does with user syncs:
    torch's own ``wrap_all_sync_nodes_with_control_deps`` (torch >= 2.13), or on torch 2.11,
    which has none, inductor's ``preserve_node_ordering`` with each sync after the node before it."""
    from torch._functorch._aot_autograd import streams as aot_streams

    if hasattr(aot_streams, "wrap_all_sync_nodes_with_control_deps"):
        aot_streams.wrap_all_sync_nodes_with_control_deps(gm)
        return
    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    deps = {n: OrderedSet([n.prev]) for n in gm.graph.nodes if ops.as_sync_call(n) is not None and n.prev.op != "root"}
    preserve_node_ordering(gm.graph, deps)
    gm.recompile()


def reserve_stream_indices(n: int) -> None:
    """Start dynamo's object table afresh with streams at indices 0..n-1.

    torch's own stream passes allocate events in that table. Under dynamo the streams are
    registered first, so event indices never equal stream indices; outside dynamo a test has
    to do that itself (streampass refuses an index used as both).
    """
    from torch._dynamo import graph_bytecode_inputs as table

    table.reset_user_object_tracking()
    for _ in range(n):
        table.register_graph_created_object(torch.Stream("cpu"), lambda index, cg: None)


def ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    """Every node ``node`` depends on through its inputs (what any topological order puts first)."""
    seen, todo = set(), [node]
    while todo:
        for i in todo.pop().all_input_nodes:
            if i not in seen:
                seen.add(i)
                todo.append(i)
    return seen


def wrapped_work(graph: torch.fx.Graph) -> dict[str, list[str]]:
    """The ``control_deps`` around work (not a stream op) in ``graph``, as a user's
    ``preserve_node_ordering`` makes them: name -> the names of its dependencies."""
    return {
        n.name: [d.name for d in n.args[0]]
        for n in graph.find_nodes(op="call_function", target=ops.CONTROL_DEPS)
        if not ops.is_sync_subgraph(ops.subgraph_module(n).graph)
    }

"""Shared helpers for building small multi-stream graphs by hand."""

from __future__ import annotations

import operator

import pytest
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


@pytest.fixture
def builder():
    return GraphBuilder()


def names(nodes):
    return [n.name for n in nodes]


def getitem(node, i):
    return operator.getitem(node, i)


__all__ = ["GraphBuilder", "aten", "ops"]


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


@pytest.fixture
def fresh_caches(tmp_path, monkeypatch):
    """torch's FX-graph and AOT-autograd caches on, as by default, in a directory of this test's
    own (so no cache entry of one test serves another), dynamo and its counters reset."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    counters.clear()
    with (
        inductor_config.patch(fx_graph_cache=True, fx_graph_remote_cache=False),
        functorch_config.patch(enable_autograd_cache=True),
    ):
        yield
    torch._dynamo.reset()


@pytest.fixture
def fanout_graph():
    """A backward-tagged graph where one producer on stream 1 is read on streams 0 and 2.

    The shape torch 2.13's ``insert_backward_syncs`` handles (meta device, every node tagged
    ``is_backward`` and annotated), to reproduce its one-wait-per-producer miss.
    """

    def build() -> torch.fx.GraphModule:
        reserve_stream_indices(3)
        b = GraphBuilder(device="meta")
        tag = {"partitioner_tag": "is_backward"}
        x = b.input("x")
        x.meta.update(tag)
        p = b.op(aten.sin.default, x, stream=1, name="producer", **tag)
        ra = b.op(aten.cos.default, p, stream=0, name="reader_a", **tag)
        rb = b.op(aten.neg.default, p, stream=2, name="reader_b", **tag)
        out = b.op(aten.add.Tensor, ra, rb, stream=0, name="total", **tag)
        return b.output(out)

    return build

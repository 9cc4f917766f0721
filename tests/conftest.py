"""Fixtures shared by the tests (graph-building helpers are in graphs.py)."""

from __future__ import annotations

import pytest
import torch
import torch.fx

from graphs import GraphBuilder, aten, reserve_stream_indices


@pytest.fixture
def builder():
    return GraphBuilder()


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

"""StreamSyncPass inside torch.fx's PassManager, next to torch's own passes."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.infra.pass_base import PassResult
from torch.fx.passes.infra.pass_manager import PassManager

import streampass as sp
from streampass.transform.fx_pass import StreamSyncPass
from streampass.transform.plan import EVENT_BASE


def branches(x, w):
    with sp.stream(1):
        a = (x @ w).relu()
    with sp.stream(2):
        b = (x * 2).sin()
    unused = x.exp()  # noqa: F841  (dead code for torch's DCE)
    return a + b


def _dce(gm: torch.fx.GraphModule) -> PassResult:
    changed = gm.graph.eliminate_dead_code()
    gm.recompile()
    return PassResult(gm, changed)


def _stable_sort(gm: torch.fx.GraphModule) -> PassResult:
    from torch._inductor.pattern_matcher import stable_topological_sort

    before = list(gm.graph.nodes)
    stable_topological_sort(gm.graph)
    gm.recompile()
    return PassResult(gm, list(gm.graph.nodes) != before)


def test_composes_with_torch_passes_until_nothing_changes():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(branches)(x, w)
    sync = StreamSyncPass()
    pm = PassManager([_dce, sync, _dce, _stable_sort], steps=3)
    result = pm(gm)
    out = result.graph_module
    assert result.modified and sp.verify(out).ok
    assert sync.last is not None and not sync.last.changed  # the last round found nothing to add
    assert "exp" not in out.code  # torch's DCE ran, and kept every sync
    torch.testing.assert_close(out(x, w), branches(x, w))


def test_refusal_names_the_pass_and_leaves_the_graph_as_it_was():
    x = torch.randn(4)
    gm = make_fx(lambda x: x.sin() + 1)(x)
    g = gm.graph
    add = next(n for n in g.nodes if n.op == "call_function" and "add" in str(n.target))
    with g.inserting_before(add):
        g.call_function(torch.ops.streams.wait_event.default, (EVENT_BASE + 3, 0))  # never recorded
    gm.recompile()
    code = gm.code
    with pytest.raises(Exception, match="StreamSyncPass") as info:  # PassManager names the pass
        PassManager([StreamSyncPass()])(gm)
    assert isinstance(info.value.__cause__, sp.StreamPassError)
    assert "no earlier node records" in str(info.value.__cause__)
    assert gm.code == code


def test_ensures_refuses_a_graph_left_with_hazards():
    """``ensures`` alone is the postcondition: a multi-stream graph without syncs fails it,
    naming a node of the first hazard; the pass's own result passes it."""
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(branches)(x, w)
    with pytest.raises(sp.StreamPassError, match=r"hazard\(s\) left") as info:
        StreamSyncPass().ensures(gm)
    assert info.value.node in {n.name for n in gm.graph.nodes}
    StreamSyncPass()(gm)
    StreamSyncPass().ensures(gm)


def test_a_whole_call_reads_the_graph_once(monkeypatch):
    """``PassManager`` calls the pass as a whole: one reading, handed to ``run``, whose final
    check stands in for ``ensures``' verify; what it leaves verifies clean."""
    import streampass.transform.fx_pass as fx_pass

    reads, verifies = [], []
    real_read, real_verify = fx_pass.read_streams, fx_pass.verify
    monkeypatch.setattr(fx_pass, "read_streams", lambda *a, **k: reads.append(1) or real_read(*a, **k))
    monkeypatch.setattr(fx_pass, "verify", lambda *a, **k: verifies.append(1) or real_verify(*a, **k))
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(branches)(x, w)
    sync = StreamSyncPass()
    result = PassManager([sync])(gm)
    assert (len(reads), len(verifies)) == (1, 0)
    assert result.modified and sync.last.ok and sync.last.waits_added > 0
    assert sp.verify(result.graph_module).ok
    torch.testing.assert_close(result.graph_module(x, w), branches(x, w))


def test_a_subclass_that_overrides_a_hook_gets_torchs_sequence():
    calls = []

    class Logged(StreamSyncPass):
        def ensures(self, graph_module):
            calls.append("ensures")
            super().ensures(graph_module)

    x, w = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(branches)(x, w)
    result = PassManager([Logged()])(gm)
    assert calls == ["ensures"] and result.modified and sp.verify(result.graph_module).ok

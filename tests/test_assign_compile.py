"""``assign="auto"`` under torch.compile as users run it: inference and training (backward after
the block), torch's caches on in a fresh directory (``fresh_caches``), cold and warm."""

from __future__ import annotations

import contextlib

import pytest
import torch

import streampass as sp
import streampass.inductor as spi
from streampass import compat
from streampass.assign.fusion import fusion_groups
from streampass.assign.in_compile import AUTO_STREAMS
from streampass.errors import StreamPassError
from streampass.sim.cost import CostModel

from graphs import wrapped_work
from test_compile_use import _job, _users_ordering_pass
from training_job import aten_100us

pytestmark = pytest.mark.usefixtures("fresh_caches")

#: every aten kernel 100 us: side streams pay on test-sized models
BIG = CostModel("h100", overrides=aten_100us)


class Towers(torch.nn.Module):
    """Three independent towers joined at the end: nothing on a side stream until assigned."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.towers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
            for _ in range(3)
        )

    def forward(self, x):
        a, b, c = (t(x) for t in self.towers)
        return (a * b + c).sum(-1)


def _compile(model, x, pass_, training):
    before = sum(spi.RUNTIME_SYNCS.values())
    with spi.enabled(pass_), torch.set_grad_enabled(training):
        got = torch.compile(model)(x)
    if training:
        got.sum().backward()  # after the block, as a training loop does
    return got, sum(spi.RUNTIME_SYNCS.values()) - before


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_auto_streams_compile_equal_eager_and_are_verified(training):
    torch.manual_seed(0)
    model, x = Towers(), torch.randn(8, 32)
    with torch.set_grad_enabled(training):
        want = model(x)
    if training:
        want.sum().backward()
        want_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
    p = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost=BIG)
    got, ran = _compile(model, x, p, training)
    torch.testing.assert_close(got, want)
    if training:
        for g, w in zip((q.grad for q in model.parameters()), want_grads):
            torch.testing.assert_close(g, w)
    assert [r.graph for r in p.reports] == (["forward", "backward"] if training else ["inference"])
    for r in p.reports:
        assert r.assigned["side_streams"] >= 1, r.line()
        assert r.assigned["predicted_us"] < r.assigned["one_stream_us"]
        assert len(r.streams) == r.assigned["side_streams"] + 1 == r.assigned["new_streams"] + 1
        assert all(s == 0 or s >= AUTO_STREAMS for s in r.streams)  # clear of dynamo's table
        assert sp.verify(r.verified_graph).ok and r.waits_added > 0
        # What inductor will fuse is on one stream: it never fuses across streams.
        a = sp.read_streams(r.verified_graph)
        for group in fusion_groups(a):
            assert len({a.stream[n] for n in group}) == 1, [(n.name, a.stream[n]) for n in group]
    assert ran > 0  # the planned syncs ran (CPU: as counted no-ops)


def test_auto_with_dynamic_shapes_prices_symbolic_graphs_once_for_every_size():
    """``dynamic=True`` (and torch's automatic dynamic after a second size): the graphs inductor
    gets have symbolic batch sizes, which the cost model prices by their hints; one compile of
    forward and backward then serves every batch size, each equal to eager."""
    torch.manual_seed(0)
    model = Towers()
    p = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost=BIG)
    step = torch.compile(model, dynamic=True)
    for i, n in enumerate([8, 5, 13]):
        x = torch.randn(n, 32)
        want = model(x)
        want.sum().backward()
        want_grads = [q.grad.clone() for q in model.parameters()]
        model.zero_grad()
        with spi.enabled(p) if i == 0 else contextlib.nullcontext():
            got = step(x)
        got.sum().backward()
        torch.testing.assert_close(got, want)
        for q, w in zip(model.parameters(), want_grads):
            torch.testing.assert_close(q.grad, w)
        model.zero_grad()
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    for r in p.reports:
        symbolic = [
            n
            for n in r.verified_graph.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)
        ]
        assert symbolic, f"{r.graph}: no symbolic size, so this did not test dynamic shapes"
        assert r.assigned["side_streams"] >= 1 and sp.verify(r.verified_graph).ok, r.line()


def test_auto_keeps_the_programs_own_streams():
    def f(x, w):
        with sp.stream(1):
            a = (x @ w).relu()
        b = (x @ w.t()).sigmoid()
        c = (x * 2) @ w
        return a + b + c

    x, w = torch.randn(16, 16), torch.randn(16, 16)
    p = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost=BIG)
    with spi.enabled(p):
        got = torch.compile(f)(x, w)
    torch.testing.assert_close(got, f(x, w))
    (r,) = p.reports
    kept = sp.read_streams(r.verified_graph)
    mine = [n for n in kept.nodes if n.meta.get("custom", {}).get("stream") == 1 and kept.is_compute(n)]
    assert {n.target for n in mine} >= {torch.ops.aten.mm.default, torch.ops.aten.relu.default}
    assert 1 in r.streams and r.assigned["side_streams"] >= 1
    # The log line tells the program's stream from the ones the choice added.
    added = r.assigned["new_streams"]
    assert r.assigned["side_streams"] == added + 1 and len(r.streams) == added + 2
    assert f": {added} new side stream(s) next to the program's 1, predicted" in r.line()


def test_auto_leaves_small_kernels_on_one_stream():
    """With the real H100 costs, 8x8 matmuls do not pay for a sync: nothing moves."""
    model, x = Towers(width=8), torch.randn(4, 8)
    p = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost="h100")
    got, _ = _compile(model, x, p, training=False)
    torch.testing.assert_close(got, model(x))
    (r,) = p.reports
    assert r.assigned["side_streams"] == r.assigned["new_streams"] == 0 and r.streams == [0] and r.waits_added == 0


def test_auto_keeps_a_cpu_graph_on_one_stream_unless_given_a_gpu_cost_model():
    """CPU streams run one after another: a side stream overlaps nothing there, and its syncs
    are fusion barriers. So with the default cost (the device's own) a CPU graph stays on one
    stream, and the report says why, even where an H100 would gain (priced that way on request)."""
    torch.manual_seed(0)
    model, x = Towers(width=1024), torch.randn(1024, 1024)  # an H100 halves its time on 3 streams
    with torch.no_grad():
        want = model(x)
    for cost, side in ((None, 0), ("h100", 1)):
        torch._dynamo.reset()
        p = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost=cost)
        with torch.no_grad():
            got, _ = _compile(model, x, p, training=False)
        torch.testing.assert_close(got, want)
        (r,) = p.reports
        assert (r.assigned["new_streams"] >= 1) == bool(side), (cost, r.line())
        if cost is None:
            assert r.streams == [0] and r.waits_added == 0
            assert "assign=auto placed nothing: on CPU, streams run one after another" in r.line()
        else:
            assert r.assigned["predicted_us"] < r.assigned["one_stream_us"], r.line()


def test_the_options_are_in_the_cache_key():
    plain, auto = spi.StreamPass(), spi.StreamPass(assign="auto")
    assert plain.uuid() != auto.uuid() == spi.StreamPass(assign="auto").uuid()
    assert auto.uuid() != spi.StreamPass(assign="auto", assign_cost=BIG).uuid()
    assert auto.uuid() != spi.StreamPass(assign="auto", max_streams=2).uuid()
    assert (
        spi.StreamPass(assign="auto", assign_cost=BIG).uuid() == spi.StreamPass(assign="auto", assign_cost=BIG).uuid()
    )


def test_bad_options_are_refused():
    with pytest.raises(StreamPassError, match="auto"):
        spi.StreamPass(assign="yes")
    with pytest.raises(StreamPassError, match="not both"):
        with spi.enabled(spi.StreamPass(), assign="auto"):
            pass
    # when the pass is made, not at its first compile inside torch's InductorError
    for bad in (0, 1.5, None, True):
        with pytest.raises(StreamPassError, match="max_streams must be an int >= 1"):
            spi.StreamPass(assign="auto", max_streams=bad)
    for bad in ("nosuch", "", 5):
        with pytest.raises(StreamPassError, match="cost must be a device profile name"):
            spi.StreamPass(assign="auto", assign_cost=bad)
    spi.StreamPass(max_streams=0)  # not used without assign


@pytest.mark.slow
def test_auto_training_loop_cold_then_warm(tmp_path):
    cache = str(tmp_path / "cache")
    eager = _job("eager", cache)
    cold = _job("auto", cache)
    warm = _job("auto", cache)
    for run in (cold, warm):
        assert run["losses"] == pytest.approx(eager["losses"], rel=1e-5)
        assert run["checksum"] == pytest.approx(eager["checksum"], rel=1e-5)
    assert [r[0] for r in cold["reports"]] == ["forward", "backward"] and all(r[3] for r in cold["reports"])
    assert all(r[4]["side_streams"] >= 1 and {1, 2} <= set(r[5]) for r in cold["reports"])  # the model's own kept
    assert warm["aot_hit"] == 1 and warm["reports"] == [] and warm["syncs"] == cold["syncs"] > 0


def test_auto_streams_plan_around_work_a_users_pass_wrapped_in_control_deps():
    """A user's post-grad pass before StreamPass orders the first tower's first ``addmm`` after the
    last tower's ``relu`` (torch's ``preserve_node_ordering``): the assignment and the plan see the
    op, not its wrapper, and inductor gets the wrapper back (before, the added streams made the
    compile fail, "control_deps runs aten.addmm.default")."""
    mine = _users_ordering_pass(torch.ops.aten.addmm.default, torch.ops.aten.relu.default, nth_after=-1)
    torch.manual_seed(0)
    model, x = Towers(), torch.randn(8, 32)
    p, seen = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost=BIG), []
    passes = compat.post_grad_config([mine, p, lambda g: seen.append(wrapped_work(g))])
    with torch.no_grad():
        got = torch.compile(model, options={"post_grad_custom_post_pass": passes})(x)
        torch.testing.assert_close(got, model(x))
    (r,) = p.reports
    assert r.assigned["side_streams"] >= 1 and sp.verify(r.verified_graph).ok, r.line()
    ((name, deps),) = seen[0].items()
    assert name.startswith("addmm") and deps == ["relu_2"], seen

"""Tests for streampass.sim.simulate: the discrete-event schedule of a multi-stream graph."""

from __future__ import annotations

import dataclasses
import itertools
import json
import types

import pytest
import torch
import torch.fx
from event_sim import play_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import ops
from streampass.sim.cost import PROFILES, CostModel
from streampass.sim.player import Item, ideal_makespan, run_items
from streampass.sim.simulate import Schedule, simulate
from streampass.synthetic import random_stream_graph

aten = torch.ops.aten
US = 1e-6
H100 = PROFILES["h100"]


# -- hand-built graphs with exact durations ------------------------------------------------------


class G:
    """A tiny graph builder: kernels with fixed durations on chosen streams, plus stream ops."""

    def __init__(self):
        self.g = torch.fx.Graph()
        self.times: dict[str, float] = {}
        self.x = self.g.placeholder("x")
        self.x.meta["val"] = torch.empty(8, device="meta")

    def k(self, name, stream, us, *inputs):
        args = inputs or (self.x,)
        n = self.g.call_function(aten.add.Tensor if len(args) == 2 else aten.sin.default, args)
        n.name = name
        n.meta["val"] = torch.empty(8, device="meta")
        n.meta["custom"] = {"stream": stream}
        self.times[name] = us * US
        return n

    def op(self, target, *args):
        n = self.g.call_function(target, args)
        self.times[n.name] = 0.0
        return n

    def done(self, *outs):
        self.g.output(tuple(outs))
        gm = torch.fx.GraphModule(torch.nn.Module(), self.g)
        # stream ops streampass.run adds cost nothing: times stay exact
        return gm, CostModel(dataclasses.replace(H100, sync_cost=0.0), overrides=self.times)


def test_one_stream_makespan_is_serial():
    b = G()
    a = b.k("a", 0, 10)
    c = b.k("c", 0, 20, a)
    d = b.k("d", 0, 5, c, a)
    gm, cost = b.done(d)
    s = simulate(gm, cost)
    assert s.makespan == pytest.approx(35 * US)
    assert s.serial_time == pytest.approx(35 * US)
    assert s.critical_path_time == pytest.approx(35 * US)
    assert s.critical_path == ["a", "c", "d"]
    assert [x.node for x in s.on(0)] == ["a", "c", "d"]
    assert s.ok and s.utilisation == {0: pytest.approx(1.0)}


def test_wait_event_blocks_until_the_record_completes():
    b = G()
    a = b.k("a", 1, 30)
    rec = b.op(ops.RECORD_EVENT, 5, 1)
    b.k("early", 0, 4)  # independent ambient work runs at once
    w = b.op(ops.WAIT_EVENT, 5, 0)
    c = b.k("c", 0, 10, a)
    gm, cost = b.done(c)
    s = simulate(gm, cost)
    assert s.slots["early"].start == 0.0
    assert s.slots[w.name].start == pytest.approx(30 * US)  # the record completes with `a`
    assert s.slots["c"].start == pytest.approx(30 * US)
    assert s.makespan == pytest.approx(40 * US)
    assert s.ok, s.races
    assert s.slots[w.name].waited_on == (rec.name,)


def test_record_only_covers_work_before_it():
    b = G()
    b.k("a", 1, 10)
    b.op(ops.RECORD_EVENT, 5, 1)
    late = b.k("late", 1, 100)  # after the record: not waited for
    b.op(ops.WAIT_EVENT, 5, 0)
    c = b.k("c", 0, 1)
    gm, cost = b.done(c, late)
    s = simulate(gm, cost)
    assert s.slots["c"].start == pytest.approx(10 * US)
    # `late` is returned but the ambient stream never waited for it: an exit race.
    assert {(r.kind, r.before) for r in s.races} == {("exit", "late")}


def test_wait_matches_the_latest_record_issued_before_it():
    b = G()
    b.k("a", 1, 10)
    b.op(ops.RECORD_EVENT, 5, 1)
    b.k("a2", 1, 50)
    b.op(ops.RECORD_EVENT, 5, 1)  # re-recorded: the wait below sees this one
    b.op(ops.WAIT_EVENT, 5, 0)
    c = b.k("c", 0, 1)
    gm, cost = b.done(c)
    assert simulate(gm, cost).slots["c"].start == pytest.approx(60 * US)


def test_wait_before_any_record_does_not_block():
    b = G()
    b.k("a", 1, 50)
    b.op(ops.WAIT_EVENT, 9, 0)  # event 9 recorded outside the graph
    c = b.k("c", 0, 1)
    b.op(ops.RECORD_EVENT, 9, 1)
    gm, cost = b.done(c)
    s = simulate(gm, cost, external_events=[9])
    assert s.slots["c"].start == 0.0


def test_wait_stream_blocks_until_work_issued_so_far():
    b = G()
    b.k("a", 1, 20)
    b.op(ops.WAIT_STREAM, 0, 1)
    c = b.k("c", 0, 1)
    b.k("after", 1, 100)  # issued after the wait_stream: not waited for
    gm, cost = b.done(c)
    s = simulate(gm, cost)
    assert s.slots["c"].start == pytest.approx(20 * US)
    assert s.makespan == pytest.approx(120 * US)


def test_synchronize_blocks_the_cpu():
    b = G()
    b.k("a", 1, 40)
    b.op(ops.SYNC_STREAM, 1)
    c = b.k("c", 0, 1)
    gm, cost = b.done(c)
    s = simulate(gm, cost)
    # c is issued only when the CPU gets past the synchronize, at 40 us
    assert s.slots["c"].issued == pytest.approx(40 * US)
    assert s.slots["c"].start == pytest.approx(40 * US)
    sync = [x for x in s.cpu if x.kind == "sync"]
    assert len(sync) == 1 and sync[0].end == pytest.approx(40 * US)


def test_synchronize_costs_its_cpu_time_even_when_held():
    launch = H100.launch_overhead / US
    b = G()
    b.k("a", 1, launch + 2)  # with cpu_launch: launched by `launch` us, then 2 us on stream 1
    sync = b.op(ops.SYNC_STREAM, 1)
    c = b.k("c", 0, 1)
    gm, cost = b.done(c)
    cost.overrides[sync.name] = 5 * US  # the call's own CPU time
    s = simulate(gm, cost, cpu_launch=True)
    # called at `launch`, a ends 2 us later; the call returns 5 us after it was made (it used to
    # return when a ended, so a gate that ended later made the CPU resume earlier)
    assert s.slots["c"].issued == pytest.approx((launch + 5) * US)


def test_synchronize_device_waits_for_every_stream():
    b = G()
    b.k("a", 1, 40)
    b.k("b", 2, 70)
    b.op(ops.SYNC_DEVICE, "cuda", 0)
    c = b.k("c", 0, 1)
    gm, cost = b.done(c)
    assert simulate(gm, cost).slots["c"].start == pytest.approx(70 * US)


def test_unsynchronized_graph_reports_races_and_can_beat_the_critical_path():
    b = G()
    a = b.k("a", 1, 50)
    c = b.k("c", 0, 50, a)  # reads a on another stream, no wait
    gm, cost = b.done(c)
    s = simulate(gm, cost)
    assert s.makespan == pytest.approx(50 * US)
    assert s.critical_path_time == pytest.approx(100 * US)
    assert s.below_critical_path and not s.ok
    assert ("raw", "a", "c") in {(r.kind, r.before, r.after) for r in s.races}
    assert not sp.verify(gm).ok

    sp.run(gm)
    s = simulate(gm, cost)
    assert s.ok and not s.below_critical_path
    assert s.makespan == pytest.approx(100 * US)


def test_cpu_launch_makes_tiny_kernels_launch_bound():
    def f(x):
        for _ in range(20):
            x = x.sin()
        return x

    gm = make_fx(f)(torch.empty(16, device="meta"))
    gpu_only = simulate(gm, "h100")
    launch_bound = simulate(gm, "h100", cpu_launch=True)
    # each tiny kernel: ~0 device time + 5 us launch
    assert gpu_only.makespan == pytest.approx(20 * H100.launch_overhead, rel=0.01)
    assert launch_bound.makespan == pytest.approx(20 * H100.launch_overhead, rel=0.01)
    launches = [x for x in launch_bound.cpu if x.kind == "launch"]
    assert len(launches) == 20
    # the device is mostly idle, waiting for launches
    assert launch_bound.utilisation[0] < 0.05
    assert launch_bound.critical_path_time <= launch_bound.makespan


# -- branches on streams, after streampass.run ------------------------------------------------------


def branches(k: int, depth: int = 3, n: int = 2048):
    def f(x, w):
        outs = []
        for i in range(k):
            with sp.stream(i):
                y = x
                for _ in range(depth):
                    y = y @ w
            outs.append(y)
        return tuple(outs)

    m = torch.empty(n, n, dtype=torch.bfloat16, device="meta")
    return make_fx(f)(m, m)


def test_k_equal_branches_with_hand_placed_syncs():
    """The simulator's side of the claim: fork at entry, join at exit, nothing else."""
    k, t = 4, 100
    b = G()
    b.op(ops.RECORD_EVENT, 10, 0)
    outs = []
    for i in range(k):
        if i:
            b.op(ops.WAIT_EVENT, 10, i)
        y = b.k(f"b{i}_0", i, t)
        y = b.k(f"b{i}_1", i, t, y)
        if i:
            b.op(ops.RECORD_EVENT, 10 + i, i)
        outs.append(y)
    for i in range(1, k):
        b.op(ops.WAIT_EVENT, 10 + i, 0)
    gm, cost = b.done(*outs)
    assert sp.verify(gm).by_kind()["raw"] == 0
    s = simulate(gm, cost)
    assert s.ok
    assert s.makespan == pytest.approx(2 * t * US) == pytest.approx(s.serial_time / k)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_equal_branches_run_k_times_faster(k):
    # 4096^2 bf16 matmuls (~140 us each on h100): the 2 us syncs stay well inside the 15%
    gm = branches(k, n=4096)
    result = sp.run(gm)
    assert result.ok
    s = simulate(gm, "h100")
    assert s.ok
    assert s.serial_time / k <= s.makespan <= 1.15 * s.serial_time / k, s.summary()
    assert s.critical_path_time == pytest.approx(s.serial_time / k, rel=1e-6)
    for st_ in s.streams:
        assert s.utilisation[st_] > 0.85


def test_branches_on_one_stream_do_not_overlap():
    gm = branches(3)
    for n in gm.graph.nodes:
        n.meta.pop("custom", None)
    s = simulate(gm, "h100")
    assert s.makespan == pytest.approx(s.serial_time)
    assert s.critical_path_time == pytest.approx(s.serial_time / 3, rel=1e-6)


@pytest.mark.parametrize("cpu_launch", [False, True])
def test_cpu_streams_run_one_after_another(cpu_launch):
    """CPU streams are no-ops: every op runs on the calling thread, so the "cpu" profile's
    branches on three streams take as long as on one, where a GPU's overlap."""
    gm = branches(3)
    sp.run(gm)
    cpu, gpu = simulate(gm, "cpu", cpu_launch=cpu_launch), simulate(gm, "h100", cpu_launch=cpu_launch)
    assert cpu.ok and len(cpu.streams) == 3
    assert cpu.makespan == pytest.approx(cpu.serial_time)
    assert gpu.makespan < 0.7 * gpu.serial_time
    kernels = sorted((s.start, s.end) for s in cpu.slots.values() if s.kind == "kernel")
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(kernels))  # none overlap


def test_profiles_and_cost_arguments():
    gm = branches(2)
    sp.run(gm)
    h100, a100 = simulate(gm, "h100"), simulate(gm, PROFILES["a100"])
    assert a100.makespan > 2 * h100.makespan  # 312 vs 989 TFLOP/s bf16
    assert simulate(gm).makespan == h100.makespan  # default profile is h100
    assert simulate(gm, CostModel("h200")).profile.name == "h200"
    with pytest.raises(TypeError):
        simulate(gm, 3)
    with pytest.raises(ValueError):
        simulate(gm, "tpu")


def test_simulate_does_not_edit_the_graph():
    gm = random_stream_graph(40, 3, seed=3)
    before = str(gm.graph)
    simulate(gm)
    assert str(gm.graph) == before


# -- the Chrome trace ---------------------------------------------------------------------------------


def test_chrome_trace_structure():
    gm = branches(3, depth=2)
    sp.run(gm)
    s = simulate(gm, "h100")
    trace = json.loads(json.dumps(s.to_chrome_trace()))
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    device = [e for e in slices if e["pid"] == 0]
    assert {e["tid"] for e in device} == set(s.streams) == {0, 1, 2}
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0
    }
    assert names[0] == "stream 0 (ambient)" and names[2] == "stream 2"
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in slices)
    # every kernel of the graph is on its stream's track
    mm = [e for e in device if e["name"].startswith("mm")]
    assert len(mm) == 6
    assert max(e["ts"] + e["dur"] for e in slices) == pytest.approx(s.makespan * 1e6)
    # one flow arrow per wait that blocked on something: start at the record, end at the wait
    waits = [x for x in s.slots.values() if x.kind == "wait" and x.waited_on]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert waits and len(starts) == len(ends) == len(waits)
    assert starts.keys() == ends.keys()
    cross = 0
    for i, f in ends.items():
        src = starts[i]
        assert src["ts"] <= f["ts"]
        cross += src["tid"] != f["tid"]
    assert cross == len(waits)  # every wait is on another stream than its record


def test_chrome_trace_shows_cpu_thread():
    b = G()
    b.k("a", 1, 40)
    b.op(ops.SYNC_STREAM, 1)
    c = b.k("c", 0, 1)
    gm, cost = b.done(c)
    trace = simulate(gm, cost).to_chrome_trace()
    cpu = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert [e["cat"] for e in cpu] == ["sync"]
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert {(e["ph"], e["pid"]) for e in flows} == {("s", 0), ("f", 1)}


# -- properties on random graphs --------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    n_streams=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    style=st.sampled_from(["annotate", "fork_join", "mixed"]),
    profile=st.sampled_from(["h100", "a100", "cpu"]),
    cpu_launch=st.booleans(),
)
def test_verified_graphs_never_beat_the_critical_path(n, n_streams, seed, style, profile, cpu_launch):
    gm = random_stream_graph(n, n_streams, seed=seed, style=style)
    assert sp.run(gm).ok
    assert sp.verify(gm).ok
    s: Schedule = simulate(gm, profile, cpu_launch=cpu_launch)
    assert s.ok, s.races
    assert s.makespan >= s.critical_path_time * (1 - 1e-9)
    assert s.critical_path_time <= s.serial_time * (1 + 1e-9)
    assert all(0.0 <= u <= 1.0 for u in s.utilisation.values())
    # stream order: a stream never runs two things at once, and runs them in issue order
    for stream in s.streams:
        slots = sorted((x for x in s.slots.values() if x.stream == stream), key=lambda x: x.issued)
        for prev, nxt in itertools.pairwise(slots):
            assert nxt.start >= prev.end - 1e-15
    for x in s.slots.values():
        assert x.start >= x.issued - 1e-15 and x.end >= x.start
    if not cpu_launch:
        # work-conserving: some stream is always busy, so no more than all the work in a row
        total = sum(x.duration for x in s.slots.values() if x.stream is not None)
        assert s.makespan <= total * (1 + 1e-9) + 1e-15
    if n_streams == 1:
        assert s.makespan == pytest.approx(s.serial_time)
    json.dumps(s.to_chrome_trace())


@settings(max_examples=15, deadline=None)
@given(n=st.integers(5, 40), seed=st.integers(0, 10_000))
def test_races_found_before_run_are_gone_after(n, seed):
    gm = random_stream_graph(n, 3, seed=seed)
    before = simulate(gm, "h100")
    if before.below_critical_path:
        assert not before.ok  # beating the bound needs a broken dependency
    sp.run(gm)
    after = simulate(gm, "h100")
    assert after.ok


def _named(name):
    return types.SimpleNamespace(name=name)


def _random_items(draw):
    """Kernels and syncs on up to 3 streams, each gated on earlier items, and CPU-blocking
    syncs; whole microseconds (zero included), so that many events fall on the same instant."""
    us = st.integers(0, 3).map(lambda k: k * US)
    items = []
    for i in range(draw(st.integers(1, 30))):
        earlier = st.lists(st.sampled_from(items), max_size=3, unique_by=id) if items else st.just([])
        if draw(st.integers(0, 5)) == 0:
            it = Item(_named(f"sync{i}"), None, 0.0, draw(us), "sync", block_cpu=True)
        else:
            it = Item(_named(f"k{i}"), draw(st.integers(0, 2)), draw(us), draw(us), "kernel")
        it.gates = [g for g in draw(earlier) if g.stream is not None]
        items.append(it)
    return items


@settings(max_examples=300, deadline=None)
@given(st.data(), st.booleans())
def test_one_pass_player_equals_the_event_driven_one(data, one_lane):
    """``one_lane``: streams that do not overlap (the "cpu" profile) queue in one lane; the
    oracle, which knows no lanes, plays them as one stream."""
    items = _random_items(data.draw)
    if one_lane:
        for it in items:
            it.lane = 0 if it.stream is not None else None
    twin_stream = {id(it): 0 if one_lane and it.stream is not None else it.stream for it in items}
    twins = {
        id(it): Item(it.node, twin_stream[id(it)], it.dur, it.cpu, it.kind, block_cpu=it.block_cpu) for it in items
    }
    for it in items:
        twins[id(it)].gates = [twins[id(g)] for g in it.gates]
    copies = [twins[id(it)] for it in items]
    assert run_items(items) == play_events(copies, [0, 1, 2])
    for a, b in zip(items, copies):
        assert (a.issued, a.start, a.end) == (b.issued, b.start, b.end), a.node


@settings(max_examples=200, deadline=None)
@given(st.data(), st.booleans())
def test_ideal_makespan_is_the_player_s_with_every_cross_stream_dependency_as_a_gate(data, cpu_launch):
    n = data.draw(st.integers(1, 25))
    stream = {i: data.draw(st.integers(0, 2)) for i in range(n)}
    times = {i: data.draw(st.integers(0, 12)) * US for i in range(n)}
    preds = {i: data.draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else [] for i in range(n)}
    items = {}
    for i in range(n):
        cpu = min(times[i], H100.launch_overhead) if cpu_launch else 0.0
        items[i] = Item(_named(str(i)), stream[i], times[i] - cpu, cpu, "kernel")
        items[i].gates = [items[u] for u in preds[i] if stream[u] != stream[i]]
    cpu_end = play_events(list(items.values()), [0, 1, 2])
    expected = max([cpu_end] + [it.end for it in items.values()])
    assert ideal_makespan(range(n), stream, preds, times, H100, cpu_launch) == expected


def test_a_gate_issued_later_is_refused():
    late = Item(_named("late"), 0, 1 * US, 0.0, "kernel")
    early = Item(_named("early"), 1, 1 * US, 0.0, "kernel", gates=[late])
    with pytest.raises(AssertionError, match="early is gated on late"):
        run_items([early, late])


def test_doctests():
    import doctest
    import importlib

    # not `import streampass.sim.simulate as mod`: that binds the function streampass exports
    mod = importlib.import_module("streampass.sim.simulate")

    assert doctest.testmod(mod).failed == 0

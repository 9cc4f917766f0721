"""The assigner prices a candidate without building it (streampass.assign.price): the same
makespan, syncs and peak memory as annotating a copy, running streampass.run on it and
simulating the result; and the lower bound it skips candidates by is one."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streampass as sp
from streampass.assign.choose import ANY_OTHER
from streampass.assign.dag import work_graph
from streampass.assign.evaluate import evaluate
from streampass.assign.price import Pricer, hoisted, restreamed
from streampass.sim.cost import CostModel
from streampass.sim.player import ideal_makespan
from streampass.synthetic import random_stream_graph
from streampass.transform.assign_apply import annotated_copy
from streampass.transform.pipeline import hoist_attributes

from training_job import aten_100us

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

graphs = st.builds(
    random_stream_graph,
    n_nodes=st.integers(4, 80),
    n_streams=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    style=st.sampled_from(["annotate", "fork_join", "mixed"]),
    inplace=st.sampled_from([0.0, 0.15]),
    run_length=st.sampled_from([1, 4]),
    views=st.sampled_from([0.0, 0.2]),
    multi_output=st.sampled_from([0.0, 0.15]),
    attributes=st.sampled_from([0.0, 0.3]),
)


def _by_name(a, field):
    value = getattr(a, field)
    if isinstance(value, dict):
        return {k.name: getattr(v, "name", v) if field != "syncs" else (v.target, v.args) for k, v in value.items()}
    if isinstance(value, list):
        return [n.name for n in value]
    if isinstance(value, frozenset) and value and not isinstance(next(iter(value)), int):
        return {n.name for n in value}
    return value


def _random_streams(a, seed: int, streams: int) -> dict:
    """A random stream for about half of the free compute nodes (free: not placed by the graph)."""
    from streampass.assign.dag import fixed_streams

    rng = random.Random(seed)
    fixed = fixed_streams(a)
    return {n: rng.randrange(streams) for n in a.nodes if a.is_compute(n) and n not in fixed and rng.random() < 0.5}


@SETTINGS
@given(
    gm=graphs, seed=st.integers(0, 1000), streams=st.integers(1, 4), cpu_launch=st.booleans(), already_run=st.booleans()
)
def test_pricing_equals_run_and_simulate_on_a_copy(gm, seed, streams, cpu_launch, already_run):
    """``already_run``: the graph holds run's syncs (in control_deps) and its annotations; the
    ambient nodes are free and the new plan builds on the old syncs."""
    model = CostModel("h100")
    if already_run:
        sp.run(gm)
    a = sp.read_streams(gm)
    chosen = _random_streams(a, seed, streams)
    named = {n.name: s for n, s in chosen.items()}

    # The reading it plans on is the one run reads from the annotated, hoisted copy.
    copy = annotated_copy(gm, named)
    hoist_attributes(copy)
    b = sp.read_streams(copy)
    mine = hoisted(restreamed(a, chosen))
    for field in ("nodes", "stream", "syncs", "root", "compute", "producer", "named", "external_events"):
        assert _by_name(mine, field) == _by_name(b, field), field

    priced = Pricer(a, model, cpu_launch)(chosen)
    real = evaluate(
        gm, "real", {n.name: a.stream[n] for n in a.nodes if a.is_compute(n)} | named, set(named), model, cpu_launch
    )
    assert priced.makespan == pytest.approx(real.makespan, rel=1e-12, abs=1e-15)
    assert (priced.waits, priced.records, priced.peak_bytes) == (real.waits, real.records, real.peak_bytes)
    assert real.schedule.ok

    w = work_graph(a, model)
    stream = {n: chosen.get(n, a.stream[n]) for n in w.nodes}
    ideal = ideal_makespan(w.nodes, stream, w.preds, w.time, model.profile, cpu_launch)
    pricer = Pricer(a, model, cpu_launch)
    bound, tight = pricer.bound(w, stream), pricer.tight_bound(w, stream)
    assert ideal <= bound <= tight <= priced.makespan * (1 + 1e-12)


def test_a_priced_choice_builds_its_real_schedule_on_first_use():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    gm = make_fx(lambda x, w: (x @ w).relu() + (x @ w.t()).sigmoid() + (x @ w).tanh())(m, m)
    choice = sp.assign_streams(gm)
    assert choice.evaluation.built is None
    assert choice.schedule.makespan == pytest.approx(choice.makespan) and choice.schedule.ok
    assert choice.evaluation.built is choice.schedule  # built once


def test_candidates_that_cannot_win_are_skipped_not_priced():
    """A graph where streams do not pay: the multi-stream candidates' lower bounds already lose."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, *ws):
        return sum((x @ w).relu() for w in ws)

    x = torch.empty(8, 8, device="meta")
    choice = sp.assign_streams(make_fx(f)(x, *[torch.empty(8, 8, device="meta") for _ in range(6)]), "h100")
    assert choice.used == [0]
    assert choice.skipped, choice.explain()
    assert all(bound > choice.single_stream for _, bound in choice.skipped)
    assert "not priced" in choice.explain()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gm=graphs, max_streams=st.integers(2, 4), big=st.booleans())
def test_skipping_by_lower_bound_changes_no_choice(gm, max_streams, big):
    model = CostModel("h100", overrides=aten_100us) if big else CostModel("h100")
    quick = sp.assign_streams(gm, model, max_streams=max_streams)
    every = sp.assign_streams(gm, model, max_streams=max_streams, exhaustive=True)
    assert not every.skipped
    assert (quick.streams, quick.candidate) == (every.streams, every.candidate)
    assert (quick.makespan, quick.waits, quick.peak_bytes) == (every.makespan, every.waits, every.peak_bytes)
    if [name for name, _ in quick.skipped] == [ANY_OTHER]:  # none could beat one stream: none built
        assert quick.candidate == "one stream" and len(quick.candidates) == 1
        assert all(e.makespan >= quick.skipped[0][1] * (1 - 1e-9) for e in every.candidates if e.name != "one stream")
    else:
        assert len(quick.candidates) + len(quick.skipped) == len(every.candidates)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gm=graphs, seed=st.integers(0, 1000), streams=st.integers(2, 4), cpu_launch=st.booleans())
def test_the_floor_is_below_every_assignment_but_one_stream(gm, seed, streams, cpu_launch):
    """``Pricer.floor``: no assignment that moves a free node can cost less (random streams for
    random nodes, including ones that only move work onto the program's own streams)."""
    a = sp.read_streams(gm)
    w = work_graph(a, CostModel("h100"))
    price = Pricer(a, CostModel("h100"), cpu_launch, known=w.time)
    moved = {n: s for n, s in _random_streams(a, seed, streams).items() if s != sp.ops.AMBIENT or n in w.free}
    if not any(s != sp.ops.AMBIENT for s in moved.values()):
        return  # the single-stream assignment: the floor does not bound it
    assert price(moved).makespan >= price.floor(w) * (1 - 1e-9)


def test_when_nothing_can_beat_one_stream_no_other_candidate_is_built():
    """Kernels shorter than their launch: the CPU's launches are the makespan on one stream, and
    any side stream adds a record and a wait to them."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, *ws):
        return sum((x @ w).relu() for w in ws)

    m = torch.empty(8, 8, device="meta")
    gm = make_fx(f)(m, *[m] * 4)
    choice = sp.assign_streams(gm)
    assert choice.used == [0] and [e.name for e in choice.candidates] == ["one stream"]
    assert [name for name, _ in choice.skipped] == [ANY_OTHER] and "lower bounds" in choice.explain()
    every = sp.assign_streams(gm, exhaustive=True)
    assert every.streams == choice.streams and len(every.candidates) > 1
    assert min(e.makespan for e in every.candidates if e.name != "one stream") >= choice.skipped[0][1]

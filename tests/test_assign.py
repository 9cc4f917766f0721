"""Automatic stream assignment (streampass.assign_streams): correct after run, never slower than
one stream, fixed annotations kept, streams only where they pay."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import pickle
import random
import re

import networkx as nx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass.assign.choose import ANY_OTHER, generate
from streampass.assign.dag import longest_path, transitive_reduction, work_graph
from streampass.assign.fusion import fused_cost, fusion_groups
from streampass.assign.memory import peak_bytes
from streampass.assign.search import Search
from streampass.assign.select import MEM_TIE, TIE
from streampass.serial import run_serial
from streampass.sim.cost import PROFILES, CostModel
from streampass.synthetic import random_inputs, random_stream_graph

from training_job import aten_100us

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


#: every aten kernel 100 us (stream ops keep their sync cost): side streams pay on the random graphs
BIG = CostModel("h100", overrides=aten_100us)


def _strip(gm: torch.fx.GraphModule, keep: float, seed: int) -> dict[str, int]:
    """Drop the stream annotations, keeping about ``keep`` of them; returns those kept."""
    import random

    rng = random.Random(seed)
    kept = {}
    for n in gm.graph.nodes:
        custom = n.meta.get("custom")
        if isinstance(custom, dict) and "stream" in custom:
            if rng.random() < keep:
                kept[n.name] = custom["stream"]
            else:
                n.meta["custom"] = {k: v for k, v in custom.items() if k != "stream"}
    return kept


graphs = st.builds(
    random_stream_graph,
    n_nodes=st.integers(4, 100),
    n_streams=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    style=st.sampled_from(["annotate", "fork_join", "mixed"]),
    inplace=st.sampled_from([0.0, 0.1]),
    run_length=st.sampled_from([1, 4]),
    views=st.sampled_from([0.0, 0.2]),
    multi_output=st.sampled_from([0.0, 0.15]),
)


@SETTINGS
@given(gm=graphs, keep=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 1000), max_streams=st.integers(1, 4))
def test_applied_assignment_is_race_free_equal_and_keeps_fixed_streams(gm, keep, seed, max_streams):
    kept = _strip(gm, keep, seed)
    before = sp.read_streams(gm)
    region = {n.name: s for n, s in before.stream.items() if before.is_compute(n) and s and n.name not in kept}
    original = copy.deepcopy(gm)
    inputs = random_inputs(gm, seed=seed)
    expected = run_serial(original, *[x.clone() for x in inputs])

    choice = sp.assign_streams(gm, BIG, max_streams=max_streams)
    assert [n.meta.get("custom") for n in gm.graph.nodes] == [n.meta.get("custom") for n in original.graph.nodes]
    assert set(choice.streams) == {n.name for n in before.nodes if before.is_compute(n)}
    for name, s in {**kept, **region}.items():
        if name in choice.streams:
            assert choice.streams[name] == s, name
    assert len({s for k, s in choice.streams.items() if k in choice.free}) <= max_streams
    assert choice.makespan <= choice.single_stream
    assert choice.schedule.ok
    # The secondary terms: among the candidates tied with the fastest (within TIE), those within
    # MEM_TIE of the least peak memory; of them the fastest, then the fewest waits (unless one
    # stream won outright).
    fastest = min(e.makespan for e in choice.candidates)
    tied = [e for e in choice.candidates if e.makespan <= fastest * (1 + TIE)]
    lean = [e for e in tied if e.peak_bytes <= min(t.peak_bytes for t in tied) * (1 + MEM_TIE)]
    for name, bound in choice.skipped:  # none could have won
        assert bound >= choice.single_stream * (1 - 1e-9) if name == ANY_OTHER else bound > fastest * (1 + TIE)
    if choice.candidate != "one stream":
        assert choice.evaluation in lean
        assert (choice.makespan, choice.waits) == min((e.makespan, e.waits) for e in lean)

    choice.apply(gm)
    result = sp.run(gm)
    assert result.ok, result.after
    assert sp.verify(gm).ok
    got = gm(*[x.clone() for x in inputs])
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    # The prediction is the graph run actually produced.
    schedule = sp.simulate(gm, BIG, cpu_launch=True)
    assert schedule.makespan == pytest.approx(choice.makespan)
    assert (result.waits_added, result.records_added) == (choice.waits, choice.records)
    assert peak_bytes(gm, schedule) == choice.peak_bytes


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40), density=st.floats(0.0, 0.6), seed=st.integers(0, 10_000))
def test_transitive_reduction_is_networkx_s(n, density, seed):
    rng = random.Random(seed)
    order = rng.sample(range(1000), n)  # a topological order that is not the nodes' sort order
    succs = {u: [v for v in order[i + 1 :] if rng.random() < density] for i, u in enumerate(order)}
    rng.shuffle(succs[order[0]])  # successors in no particular order
    g = nx.DiGraph()
    g.add_nodes_from(order)
    g.add_edges_from((u, v) for u in order for v in succs[u])
    assert set(transitive_reduction(order, succs)) == set(nx.transitive_reduction(g).edges)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40), density=st.floats(0.0, 0.6), seed=st.integers(0, 10_000), ties=st.booleans())
def test_longest_path_weighs_what_networkx_s_does(n, density, seed, ties):
    rng = random.Random(seed)
    order = rng.sample(range(1000), n)
    preds = {v: [u for u in order[:i] if rng.random() < density] for i, v in enumerate(order)}
    # ties: equal weights everywhere, where the two may choose different paths of one weight
    time = {v: 1.0 if ties else rng.choice([0.0, 0.5, 1.0, 2.5, rng.random()]) for v in order}
    path = longest_path(order, preds, time)
    assert all(u in preds[v] for u, v in itertools.pairwise(path))  # a path of the DAG
    g = nx.DiGraph()
    g.add_nodes_from(order)
    g.add_edges_from((u, v, {"w": time[v]}) for v in order for u in preds[v])
    g.add_edges_from(("src", v, {"w": time[v]}) for v in order)
    theirs = [v for v in nx.dag_longest_path(g, weight="w") if v != "src"]
    assert sum(time[v] for v in path) == sum(time[v] for v in theirs)


def _branches(n: int, size: int, device: str = "meta"):
    def f(x, *ws):
        return sum((x @ w).relu() for w in ws)

    x = torch.empty(size, size, device=device)
    return make_fx(f)(x, *[torch.empty(size, size, device=device) for _ in range(n)])


def test_big_independent_matmuls_get_several_streams_and_tiny_ones_one():
    big = sp.assign_streams(_branches(4, 4096), "h100")
    assert len(big.used) > 1 and big.makespan < big.single_stream
    tiny = sp.assign_streams(_branches(4, 8), "h100")
    assert tiny.used == [0] and tiny.candidate == "one stream"
    assert "do not pay" in tiny.explain()
    assert tiny.waits == 0 and tiny.makespan == tiny.single_stream


def test_a_budget_that_rules_out_the_faster_candidates_says_so_not_that_streams_do_not_pay():
    gm = _branches(3, 4096)
    free = sp.assign_streams(gm, "h100")
    one = next(e for e in free.candidates if e.name == "one stream")
    assert free.makespan < one.makespan  # streams pay here, given the memory
    tight = sp.assign_streams(gm, "h100", memory_budget=one.peak_bytes)
    assert tight.candidate == "one stream" and tight.peak_bytes <= one.peak_bytes
    said = tight.explain()
    assert "do not pay" not in said and "within memory_budget" in said, said


def test_a_choice_can_be_deep_copied_and_pickled():
    """A choice holds its cost model and candidates' schedules; notebooks and multiprocessing copy it."""
    choice = sp.assign_streams(_branches(3, 4096), "h100")
    for twin in (copy.deepcopy(choice), pickle.loads(pickle.dumps(choice))):
        assert twin.streams == choice.streams and twin.model.profile == choice.model.profile
        assert twin.schedule.makespan == pytest.approx(choice.schedule.makespan)


@pytest.mark.parametrize(
    "cost, says",
    [
        (lambda: CostModel("h100", {"mm": float("nan")}), "node 'mm': its time override must be a finite number"),
        (lambda: CostModel("h100", {"mm_1": -1e-3}), "node 'mm_1': its time override must be a finite number"),
        (lambda: CostModel("h100", {"mm": "fast"}), "node 'mm': its time override 'fast' is no number"),
        (lambda: CostModel("h100", lambda n: float("inf")), "its time override must be a finite number"),
        (lambda: dataclasses.replace(PROFILES["h100"], mem_bandwidth=0.0), "mem_bandwidth must be a finite number > 0"),
        (lambda: dataclasses.replace(PROFILES["h100"], sync_cost=float("nan")), "sync_cost must be a finite number"),
    ],
)
def test_a_cost_model_that_prices_nonsense_is_refused_by_name(cost, says):
    gm = _branches(2, 256, device="cpu")
    before = gm.code
    with pytest.raises(sp.StreamPassError, match=re.escape(says)):
        sp.assign_streams(gm, cost=cost())
    assert gm.code == before


class _CondWithSideStream(torch.nn.Module):
    def forward(self, x, b, w1, w2, w3):
        a, c, d, e = x @ w1, x @ w2, x @ w3, (x * 2) @ w1

        def branch(y):
            with sp.stream(1):
                u = y.cos() @ y
            return u * 2

        return a + torch.cond(a.sum() > 0, branch, lambda y: y.tan(), (b,)) + c + d + e


def test_a_stream_a_body_uses_is_not_given_to_the_caller_s_nodes():
    """The cond's branch runs work on stream 1: the caller's side streams must be others, or the
    pricing would take the branch's kernels and the caller's for one stream's."""
    args = tuple(torch.randn(64, 64) for _ in range(5))
    gm = torch.export.export(_CondWithSideStream(), args, strict=True).graph_module
    model = CostModel("h100", lambda n: 1e-3 if "matmul" in str(n.target) else None)  # streams pay
    choice = sp.assign_streams(gm, cost=model, max_streams=4)
    assert len(choice.used) > 1, choice
    assert 1 not in choice.used


def test_cpu_profile_keeps_one_stream_and_says_why():
    """The same big independent matmuls priced for a CPU, whose streams run one after another:
    nothing can overlap, so one stream, without pricing the others."""
    choice = sp.assign_streams(_branches(4, 4096), "cpu")
    assert choice.used == [0] and choice.candidate == "one stream"
    assert "run one after another" in choice.explain()
    assert [e.name for e in choice.candidates] == ["one stream"]


def test_symbolic_shapes_are_priced_by_hint_without_a_guard():
    """A dynamic-shape graph (what ``torch.compile(dynamic=True)`` hands inductor): assigning,
    the run after it and the memory estimate read sizes by their hints. A guard on a size
    would make torch recompile for every batch size."""

    def f(x, *ws):
        return sum((x @ w).relu() for w in ws)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(512, 2048), *[torch.randn(2048, 2048) for _ in range(4)])
    val = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    shape_env = val.shape[0].node.shape_env
    before = len(shape_env.guards)
    choice = sp.assign_streams(gm, CostModel("h100", overrides=aten_100us))
    assert len(choice.used) > 1 and choice.peak_bytes > 0
    choice.apply(gm)
    assert sp.run(gm).ok
    peak_bytes(gm, sp.simulate(gm))
    assert len(shape_env.guards) == before, shape_env.guards[before:]


def test_max_streams_one_is_one_stream():
    choice = sp.assign_streams(_branches(4, 4096), "h100", max_streams=1)
    assert choice.used == [0] and choice.waits == 0


def test_a_single_chain_stays_on_one_stream():
    def f(x, w):
        for _ in range(6):
            x = (x @ w).tanh()
        return x

    m = torch.empty(4096, 4096, device="meta")
    choice = sp.assign_streams(make_fx(f)(m, m), "h100")
    assert choice.used == [0] and choice.waits == 0


def test_user_annotations_are_fixed_and_explained():
    def f(x, a, b, c):
        with sp.stream(2):
            y = (x @ a).relu()
        return y + (x @ b).relu() + (x @ c).relu()

    m = torch.empty(4096, 4096, device="meta")
    gm = make_fx(f)(m, m, m, m)
    choice = sp.assign_streams(gm, "h100", max_streams=3)
    assert choice.streams["mm"] == 2 and choice.streams["relu"] == 2
    assert "mm" not in choice.free
    assert "fixed by user annotation" in choice.reasons["mm"]
    assert 2 not in {s for k, s in choice.streams.items() if k in choice.free}  # new streams are fresh
    assert choice.makespan < choice.single_stream
    choice.apply(gm)
    assert sp.run(gm).ok


def test_every_candidate_lists_its_nodes_in_graph_order():
    """A priced candidate's ``streams`` (and so ``StreamChoice.groups()``/``explain()``) list the
    nodes in graph order. The critical-path candidate listed its path first, from a set of nodes
    whose order changed from one process to the next (another explanation on every run)."""
    gm = _branches(3, 4096)
    position = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    a, model = sp.read_streams(gm), CostModel("h100")
    w = work_graph(a, model)
    search = Search(gm, a, w, {n.name for n in w.free}, model, True, (), float("inf"))
    names = []
    for name, streams, notes in generate(w, [0, 1, 2]):
        e = search.price(name, streams, notes)
        names.append(name)
        assert list(e.streams) == sorted(e.streams, key=position.__getitem__), name
    assert "critical path + round robin" in names


def test_apply_refuses_a_graph_annotated_otherwise_and_edits_nothing():
    gm = _branches(3, 4096)
    choice = sp.assign_streams(gm, "h100")
    side = [k for k, s in choice.streams.items() if s != 0]
    assert side
    target = next(n for n in gm.graph.nodes if n.name == side[-1])
    target.meta["custom"] = {"stream": 7}
    before = [dict(n.meta.get("custom") or {}) for n in gm.graph.nodes]
    with pytest.raises(sp.StreamPassError, match="already annotated"):
        choice.apply(gm)
    assert [dict(n.meta.get("custom") or {}) for n in gm.graph.nodes] == before


def test_memory_budget_is_respected():
    gm = _branches(4, 4096)
    free = sp.assign_streams(gm, "h100")
    one = next(e for e in free.candidates if e.name == "one stream")
    assert free.peak_bytes >= one.peak_bytes > 0
    tight = sp.assign_streams(gm, "h100", memory_budget=one.peak_bytes)
    assert tight.peak_bytes <= one.peak_bytes
    assert tight.makespan <= tight.single_stream


def test_explanation_names_candidates_and_streams():
    choice = sp.assign_streams(_branches(4, 4096), "h100")
    text = choice.explanation
    assert "nimble" in text and "stream 0:" in text and repr(choice).startswith("<StreamChoice")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_graph_already_run_keeps_its_syncs_and_streams(seed):
    """Existing stream ops and the annotations run wrote are fixed; the new choice runs on top."""
    gm = random_stream_graph(60, 3, seed=seed, style="mixed")
    inputs = random_inputs(gm, seed=seed)
    expected = run_serial(copy.deepcopy(gm), *[x.clone() for x in inputs])
    sp.run(gm)
    before = sp.read_streams(gm)
    fixed = {n.name: s for n, s in before.stream.items() if before.is_compute(n) and s}
    syncs = len(before.syncs)
    choice = sp.assign_streams(gm, BIG)
    assert all(choice.streams[k] == s for k, s in fixed.items())
    choice.apply(gm)
    assert sp.run(gm).ok and sp.verify(gm).ok
    assert len(sp.read_streams(gm).syncs) >= syncs
    assert choice.makespan <= choice.single_stream
    for a, b in zip(gm(*[x.clone() for x in inputs]), expected):
        torch.testing.assert_close(a, b)


@SETTINGS
@given(gm=graphs, seed=st.integers(0, 1000), max_streams=st.integers(2, 4), cost=st.sampled_from([BIG, "h100"]))
def test_keep_fusions_never_splits_what_inductor_fuses(gm, seed, max_streams, cost):
    """BIG's overrides price every aten op (the fused price never applies); with h100's estimates
    the groups are priced as one kernel each."""
    _strip(gm, 0.0, seed)
    inputs = random_inputs(gm, seed=seed)
    expected = run_serial(copy.deepcopy(gm), *[x.clone() for x in inputs])
    a = sp.read_streams(gm)
    groups = fusion_groups(a)
    choice = sp.assign_streams(gm, cost, max_streams=max_streams, keep_fusions=True)
    for group in groups:
        if len({a.stream[n] for n in group if n.name not in choice.free}) > 1:
            continue  # the graph itself places the group's fixed members on different streams
        assert len({choice.streams[n.name] for n in group}) == 1, [(n.name, choice.streams[n.name]) for n in group]
    assert choice.makespan <= choice.single_stream
    # the schedule built the direct way (copy, run, simulate) prices with the same fused costs
    assert choice.schedule.makespan == pytest.approx(choice.makespan, rel=1e-9)
    choice.apply(gm)
    assert sp.run(gm).ok and sp.verify(gm).ok
    for got, want in zip(gm(*[x.clone() for x in inputs]), expected):
        torch.testing.assert_close(got, want)


def test_keep_fusions_moves_a_split_chain_back_together_and_says_why():
    def f(x, w1, w2):
        a = (x @ w1).relu().mul(2).add(1)  # one fused kernel under inductor, after the matmul
        b = (x @ w2).sigmoid()
        return a.sum() + b.sum()

    m = torch.empty(4096, 4096, device="meta")
    gm = make_fx(f)(m, m, m)
    choice = sp.assign_streams(gm, "h100", keep_fusions=True)
    groups = fusion_groups(sp.read_streams(gm))
    chain = next(g for g in groups if g[0].name == "relu")
    assert [n.name for n in chain] == ["relu", "mul", "add", "sum_1"]
    assert len({choice.streams[n.name] for n in chain}) == 1
    assert choice.makespan < choice.single_stream


def _matmul_next_to_a_chain(k: int = 8):
    """A 4096 matmul next to a chain of ``k`` (mul, relu) pairs on a 1024x1024 tensor, bf16."""

    def f(x, w, y):
        a, b = x @ w, y
        for _ in range(k):
            b = (b * 1.5).relu()
        return a, b

    big = torch.empty(4096, 4096, device="meta", dtype=torch.bfloat16)
    return make_fx(f)(big, big, torch.empty(1024, 1024, device="meta", dtype=torch.bfloat16))


def test_fused_cost_prices_a_chain_as_one_kernel():
    gm = _matmul_next_to_a_chain()
    a = sp.read_streams(gm)
    base = CostModel("h100")
    (chain,) = fusion_groups(a)
    fused = fused_cost(a, [chain], base)
    # reads y once and writes the chain's end once; the 14 ops in between cost nothing
    one_tensor = 1024 * 1024 * 2
    assert fused.node_time(chain[-1]) == base.kernel_time(0, 2 * one_tensor, torch.bfloat16)
    assert all(fused.node_time(n) == 0.0 for n in chain[:-1])
    mm = a.node_named("mm")
    assert fused.node_time(mm) == base.node_time(mm)
    assert sum(fused.node_time(n) for n in chain) < sum(base.node_time(n) for n in chain) / 10
    # the model's own overrides still win
    pinned = fused_cost(a, [chain], CostModel("h100", {chain[0].name: 1e-3}))
    assert pinned.node_time(chain[0]) == 1e-3 and pinned.node_time(chain[-1]) == fused.node_time(chain[-1])
    hook = fused_cost(a, [chain], BIG)
    assert hook.node_time(chain[0]) == 1e-4  # BIG's callable prices every aten op


def test_fused_cost_leaves_a_chain_the_graph_splits_priced_per_op():
    def f(y):
        with sp.stream(1):
            b = y.exp()
        with sp.stream(2):
            c = b.relu()
        return c.sigmoid()

    gm = make_fx(f)(torch.empty(1024, 1024, device="meta"))
    a = sp.read_streams(gm)
    base = CostModel("h100")
    (group,) = fusion_groups(a)
    assert [n.name for n in group] == ["exp", "relu", "sigmoid"]
    fused = fused_cost(a, [group], base)
    assert [fused.node_time(n) for n in group] == [base.node_time(n) for n in group]


def test_keep_fusions_does_not_pay_a_side_stream_for_ops_inductor_fuses():
    """Priced per op, the chain looks like 16 kernels worth overlapping with the matmul; fused,
    it is one small kernel, and a side stream for it no longer pays."""
    gm = _matmul_next_to_a_chain()
    per_op = sp.assign_streams(gm, "h100")
    fused = sp.assign_streams(gm, "h100", keep_fusions=True)
    assert per_op.used == [0, 1] and per_op.makespan < per_op.single_stream
    assert fused.used == [0] and fused.waits == 0
    assert fused.single_stream < per_op.makespan
    assert fused.schedule.makespan == pytest.approx(fused.makespan, rel=1e-9)


def _priced(name: str, makespan: float, peak: int, waits: int):
    from streampass.assign.evaluate import Evaluation

    return Evaluation(name, {}, makespan, waits, waits, peak, 0.0)


def test_ties_a_megabyte_does_not_buy_a_slower_schedule_but_a_third_of_the_memory_does():
    from streampass.assign.select import pick as _pick

    single = _priced("one stream", 200.0, 1000, 0)
    fast = _priced("fast", 100.0, 1000, 9)
    leaner_by_a_little = _priced("a MiB less", 100.5, 999, 3)  # tied (0.5%), memory within MEM_TIE
    assert _pick([single, fast, leaner_by_a_little], single, float("inf")) is fast
    much_leaner = _priced("a third less", 100.5, 660, 3)
    assert _pick([single, fast, leaner_by_a_little, much_leaner], single, float("inf")) is much_leaner
    slower = _priced("slower, lean", 102.0, 500, 1)  # not tied with the fastest
    assert _pick([single, fast, slower], single, float("inf")) is fast
    same_time_fewer_waits = _priced("fewer waits", 100.0, 1020, 2)
    assert _pick([single, fast, same_time_fewer_waits], single, float("inf")) is same_time_fewer_waits
    lean_single = _priced("one stream", 200.0, 800, 0)
    assert _pick([lean_single, fast], lean_single, budget=900) is lean_single  # the only one that fits
    assert _pick([single, fast, much_leaner], single, budget=500) is much_leaner  # none fits: least memory


def test_fusion_groups_never_join_a_forward_op_to_its_backward():
    """A ReLU's backward reads the ReLU's output, but runs after the matmuls that need the ReLU:
    one kernel of both would have to run before and after them, and inductor does not fuse so."""

    def step(x, w1, w2):
        h = (x @ w1).relu()
        loss = ((h @ w2) * 2).sum()
        return torch.autograd.grad(loss, [w1, w2])

    m = torch.empty(64, 64)
    gm = make_fx(step)(m, m.clone().requires_grad_(), m.clone().requires_grad_())
    a = sp.read_streams(gm)
    groups = fusion_groups(a)
    backward = {n for n in a.nodes if "backward" in str(n.target)}
    assert backward and groups
    for group in groups:
        assert not (backward & set(group)) or all("relu" not in n.name for n in group), [n.name for n in group]
    # every group could be one kernel: nothing outside it both depends on it and feeds it
    order = {n: i for i, n in enumerate(a.nodes)}
    for group in groups:
        first, last = order[group[0]], order[group[-1]]
        inside = set(group)
        for n in a.nodes[first:last]:
            if n in inside or not a.is_compute(n):
                continue
            feeds = any(u in inside for u in n.users)
            fed = any(i in inside for i in n.all_input_nodes)
            assert not (feeds and fed), (n.name, [g.name for g in group])


def test_fusion_groups_keep_reductions_over_different_loops_apart():
    """A column sum and a row sum of one tensor are two kernels under inductor (its scheduler
    groups nodes by their (elements, reduction elements)); two row sums can be one."""

    def columns_and_rows(x):
        g = (x * 2).relu()
        return g.sum(0), g.sum(1), (g * g).sum(1)

    def rows_only(x):
        g = (x * 2).relu()
        return g.sum(1), (g * g).sum(1)

    x = torch.ones(8, 32)
    a = sp.read_streams(make_fx(columns_and_rows)(x))
    col, row, row2 = [n for n in a.nodes if n.op == "call_function" and "sum" in str(n.target)]
    for group in fusion_groups(a):
        assert not (col in group and (row in group or row2 in group)), [n.name for n in group]
    (group,) = fusion_groups(sp.read_streams(make_fx(rows_only)(x)))
    assert [n.name for n in group] == ["mul", "relu", "sum_1", "mul_1", "sum_2"]


def test_fusion_groups_are_acyclic_as_kernels_not_only_as_nodes():
    """Two groups that each wait for the other through a matmul: each is fine on its own, but as
    kernels they would wait for each other, and inductor refuses the second fusion."""

    def f(x, w):
        p = x.relu()
        m2 = p.exp() @ w  # waits for group A
        s = x.sigmoid()
        m1 = s.sin() @ w  # waits for group B
        return p * m1, s * m2  # A waits for m1 (so for B); B would wait for m2 (so for A)

    gm = make_fx(f)(torch.ones(4, 4), torch.ones(4, 4))
    groups = fusion_groups(sp.read_streams(gm))
    kernel = {n.name: i for i, g in enumerate(groups) for n in g}
    contracted = nx.DiGraph()
    for n in gm.graph.nodes:
        for i in n.all_input_nodes:
            u, v = kernel.get(i.name, i.name), kernel.get(n.name, n.name)
            if u != v:
                contracted.add_edge(u, v)
    assert nx.is_directed_acyclic_graph(contracted), [[n.name for n in g] for g in groups]
    assert [n.name for n in groups[0]] == ["relu", "exp", "mul"]


def test_fusion_groups_see_the_order_an_in_place_op_makes():
    """mul reads q after copy_ wrote the matmul into it, and the matmul reads relu: relu and mul
    in one kernel would run before and after the matmul."""

    def f(x, w):
        p = x.relu()
        q = x.exp()
        q.copy_(p @ w)
        return p * q

    assert fusion_groups(sp.read_streams(make_fx(f)(torch.ones(4, 4), torch.ones(4, 4)))) == []


def test_fused_cost_pays_for_storage_a_member_writes_in_place():
    def f(x):
        x.mul_(x.exp())  # the kernel reads x and writes it back
        return x

    n = 2**24
    a = sp.read_streams(make_fx(f)(torch.empty(n, device="meta")))
    base = CostModel("h100")
    (group,) = fusion_groups(a)
    assert [g.name for g in group] == ["exp", "mul_"]
    assert fused_cost(a, [group], base).node_time(group[-1]) == base.kernel_time(0, 2 * 4 * n, torch.float32)


def _two_branches() -> torch.fx.GraphModule:
    m = torch.empty(1024, 1024, device="meta")
    return make_fx(lambda x, w: (x @ w).relu() + (x @ w.t()).sigmoid())(m, m)


def _as_written(gm: torch.fx.GraphModule):
    return gm.code, [(n.name, n.op, n.target, n.args, n.meta.get("custom")) for n in gm.graph.nodes]


BAD_ARGUMENTS = {
    "max_streams=0": (dict(max_streams=0), r"max_streams must be an int >= 1 .*got 0"),
    "max_streams=-1": (dict(max_streams=-1), r"max_streams must be an int >= 1 .*got -1"),
    "max_streams=None": (dict(max_streams=None), r"max_streams must be an int >= 1 .*got None \(NoneType\)"),
    "max_streams=1.5": (dict(max_streams=1.5), r"max_streams must be an int >= 1 .*got 1\.5 \(float\)"),
    "max_streams=True": (dict(max_streams=True), r"max_streams must be an int >= 1 .*got True \(bool\)"),
    "cost='nosuch'": (
        dict(cost="nosuch"),
        r"cost must be a device profile name \(a100, cpu, h100, h200\).*got 'nosuch'",
    ),
    "cost=''": (dict(cost=""), r"cost must be a device profile name .*got ''$"),
    "cost=5": (dict(cost=5), r"cost must be .*got 5 \(int\)"),
    "memory_budget='x'": (dict(memory_budget="x"), r"memory_budget must be None .* >= 0, got 'x' \(str\)"),
    "memory_budget=-1": (dict(memory_budget=-1), r"memory_budget must be .*got -1 \(int\)"),
    "memory_budget=nan": (dict(memory_budget=float("nan")), r"memory_budget must be .*got nan \(float\)"),
    "memory_budget=True": (dict(memory_budget=True), r"memory_budget must be .*got True \(bool\)"),
    "side_streams=5": (dict(side_streams=5), r"side_streams must be None or an iterable .*got 5 \(int\)"),
    "side_streams='12'": (dict(side_streams="12"), r"side_streams must be None or an iterable .*got '12' \(str\)"),
    "side_streams=['a']": (dict(side_streams=["a"]), r"side_streams: stream index must be an int, got 'a'"),
    "side_streams=[-3]": (dict(side_streams=[-3]), r"side_streams: stream index must be >= 0, got -3"),
    "side_streams=[0, 1]": (dict(side_streams=[0, 1]), r"side_streams: 0 is the ambient stream, not a side stream"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_assign_streams_refuses_bad_arguments_naming_them_and_edits_nothing(case):
    gm = _two_branches()
    before = _as_written(gm)
    kwargs, says = BAD_ARGUMENTS[case]
    with pytest.raises(sp.StreamPassError, match=says):
        sp.assign_streams(gm, **kwargs)
    assert _as_written(gm) == before


@pytest.mark.parametrize("graph", [None, "graph", 3])
def test_assign_streams_refuses_what_is_not_a_graph_module(graph):
    gm = _two_branches()
    arg = gm.graph if graph == "graph" else graph
    hint = r" \(pass its owning_module\)" if graph == "graph" else ""
    with pytest.raises(sp.StreamPassError, match=rf"takes a torch.fx.GraphModule, got {type(arg).__name__}{hint}$"):
        sp.assign_streams(arg)


def test_assign_streams_takes_every_documented_argument_form():
    import numpy as np

    from streampass.sim.cost import PROFILES

    gm = _two_branches()
    default = sp.assign_streams(gm)
    assert default.used == [0, 1]
    for cost in (None, "h100", PROFILES["h100"], CostModel("h100")):
        assert sp.assign_streams(gm, cost).streams == default.streams, cost
    for max_streams in (2, np.int64(2), 10**9):
        assert sp.assign_streams(gm, max_streams=max_streams).streams == default.streams, max_streams
    assert sp.assign_streams(gm, max_streams=1).used == [0]
    for budget in (None, float("inf"), 10**12, np.float64(1e12)):
        assert sp.assign_streams(gm, memory_budget=budget).streams == default.streams, budget
    # a budget nothing fits: the least memory is chosen, and the note says so
    assert "no candidate fits memory_budget=0" in sp.assign_streams(gm, memory_budget=0).note
    assert sp.assign_streams(gm, side_streams=(7, 8)).used == [0, 7]
    assert sp.assign_streams(gm, side_streams=iter([9])).used == [0, 9]


def _three_fixed_one_free() -> torch.fx.GraphModule:
    def f(x, w):
        with sp.stream(1):
            a = x @ w
        with sp.stream(2):
            b = x @ w.t()
        with sp.stream(3):
            d = x.t() @ w.t()
        return a, b, x.t() @ w, d

    m = torch.empty(1024, 1024, device="meta")
    return make_fx(f)(m, m)


@pytest.mark.parametrize("build", [_two_branches, _three_fixed_one_free])
def test_a_huge_max_streams_builds_one_slot_per_compute_node_at_most_and_changes_no_choice(build):
    from streampass.assign.candidates import stream_slots

    gm = build()
    a = sp.read_streams(gm)
    # one side stream per compute node at most: 10**9 used to build 10**9 slots (out of memory)
    assert len(stream_slots(a, 10**6)) == len(a.compute) + 1
    assert len(stream_slots(a, 10**6, side_streams=range(100, 10**12))) == len(a.compute) + 1
    enough = sp.assign_streams(gm, max_streams=len(a.compute) + 1)
    huge = sp.assign_streams(gm, max_streams=10**9)
    for e, h in itertools.zip_longest(enough.candidates, huge.candidates):
        assert (e.name, e.streams, e.makespan, e.waits) == (h.name, h.streams, h.makespan, h.waits)
    assert huge.streams == enough.streams


def test_fixed_chains_take_slots_too_so_the_cap_counts_every_compute_node():
    # Nimble's chain cover hands a slot to every chain, the fixed ones included (their streams
    # are put back afterwards): with one slot per *free* node, the free chain would move.
    from streampass.assign.candidates import chain_cover, stream_slots
    from streampass.assign.dag import work_graph

    a = sp.read_streams(_three_fixed_one_free())
    w = work_graph(a, CostModel("h100"))
    assert len(w.free) == 1 and len(w.fixed) == 3
    placed = [chain_cover(w, stream_slots(a, n))[0] for n in (4, 10**9)]
    assert [{n.name: s for n, s in p.items()} for p in placed] == [{"mm": 1, "mm_1": 2, "mm_2": 3, "mm_3": 6}] * 2
    assert stream_slots(a, 10**9) == [0, 4, 5, 6, 7]


def test_side_streams_listed_twice_are_one_slot():
    from streampass.assign.candidates import stream_slots

    a = sp.read_streams(_two_branches())
    assert stream_slots(a, 4, side_streams=[5, 5, 6, 5, 7]) == [0, 5, 6, 7]


class CondWithStreams(torch.nn.Module):
    """Two independent matmul branches, then a cond whose true branch puts work on stream 2."""

    def forward(self, x, w):
        a = (x @ w).relu()
        b = (x @ w.t()).sigmoid()

        def on_2(y):
            with sp.stream(2):
                u = y.cos() + 1
            return u * 2

        def plain(y):
            return y.tan()

        return a + torch.cond(a.sum() > 0, on_2, plain, (b,))


def test_an_op_whose_body_uses_streams_stays_on_the_ambient_stream():
    """run plans a body from the ambient stream and moves an op calling a body with streams
    there. Before, the assigner put the cond on stream 1 (predicting a schedule that run then
    undid, with a warning); now it leaves the cond on the ambient stream and says why."""
    import warnings

    x, w = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gm = torch.export.export(CondWithStreams(), (x, w), strict=True).graph_module
    expected = CondWithStreams()(x, w)
    choice = sp.assign_streams(gm, max_streams=4)
    assert set(choice.streams.values()) != {0}, "streams should pay on this graph"
    assert choice.streams["cond"] == 0 and "true_graph_0" in choice.reasons["cond"]
    choice.apply(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sp.StreamPassWarning)
        assert sp.run(gm).ok
    torch.testing.assert_close(gm(x, w)[0], expected)


def _quantized_branch(y, w):
    return ((y @ w.t()).sigmoid(),)


def test_an_op_inductor_lowers_node_by_node_stays_where_its_function_runs():
    """Inductor lowers ``invoke_quant``'s function into the calling graph, each node on its own
    annotation's stream (none here: the ambient stream). Before, the assigner moved the op to a
    side stream, so on a GPU its kernels would have run on the ambient stream with the syncs
    planned for the side stream; now it stays, and says why."""
    from torch._higher_order_ops import invoke_quant_packed

    def f(x, w):
        a = (x @ w).relu()
        b = invoke_quant_packed(_quantized_branch, x, w)[0]
        return a + b + (x @ w.t()).tanh()

    x, w = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gm = make_fx(f)(x, w)
    choice = sp.assign_streams(gm, max_streams=4)
    assert set(choice.streams.values()) != {0}, "streams should pay on this graph"
    assert choice.streams["invoke_quant_packed"] == 0
    assert "inductor lowers its function here" in choice.reasons["invoke_quant_packed"]
    choice.apply(gm)
    assert sp.run(gm).ok
    torch.testing.assert_close(gm(x, w), f(x, w))

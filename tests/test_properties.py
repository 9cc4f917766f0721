"""Property tests over random multi-stream graphs (hypothesis)."""

from __future__ import annotations

import copy
import itertools
import operator

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streampass as sp
from streampass import ops
from streampass.analysis.capture import unjoined
from streampass.analysis.requirements import requirements
from streampass.serial import run_serial
from streampass.synthetic import random_inputs, random_stream_graph

from graphs import wrapped_work
from reorder import random_topological_copy

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

graphs = st.builds(
    random_stream_graph,
    n_nodes=st.integers(10, 300),
    n_streams=st.integers(1, 5),
    seed=st.integers(0, 10_000),
    style=st.sampled_from(["annotate", "fork_join", "mixed"]),
    inplace=st.sampled_from([0.0, 0.1, 0.25]),
    run_length=st.sampled_from([1, 4, 16]),  # stretches of ops that stay on one stream
    views=st.sampled_from([0.0, 0.2]),
    multi_output=st.sampled_from([0.0, 0.15]),  # getitems of multi-output ops, which launch nothing
    attributes=st.sampled_from([0.0, 0.1]),  # module buffers, their get_attr at first use
)


@SETTINGS
@given(gm=graphs, order_seed=st.integers(0, 10_000))
def test_run_is_race_free_under_any_order_and_equals_eager(gm, order_seed):
    original = copy.deepcopy(gm)
    inputs = random_inputs(gm, seed=order_seed)
    expected = run_serial(original, *[x.clone() for x in inputs])
    result = sp.run(gm)
    assert result.ok, result.after
    assert unjoined(gm) == []  # capturable: no side stream issues anything after its last join
    got = gm(*[x.clone() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    serial = run_serial(gm, *[x.clone() for x in inputs])  # the reference reads through the syncs too
    assert all(torch.equal(a, b) for a, b in zip(serial, expected))
    for k in range(25):
        shuffled = random_topological_copy(gm, order_seed * 31 + k)
        report = sp.verify(shuffled)
        assert report.ok, report
        assert unjoined(shuffled) == []
    shuffled = random_topological_copy(gm, order_seed)
    with sp.runtime.bind(shuffled):
        got = shuffled(*[x.clone() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert not sp.run(gm).changed
    again = sp.run(shuffled)  # a later pass reordered the result: nothing is missing
    assert again.ok and again.records_added == again.waits_added == 0


@SETTINGS
@given(gm=graphs)
def test_dag_matches_the_graph(gm):
    dag = sp.StreamDAG.from_graph(gm)
    a = dag.assignment
    assert set(dag.nx.nodes) == {n.name for n in gm.graph.nodes}
    for n in gm.graph.nodes:
        assert dag.nx.nodes[n.name]["stream"] == a.stream[n]
        for inp in n.all_input_nodes:
            assert "data" in dag.nx.edges[inp.name, n.name]["kinds"]
    for s in dag.streams:
        on = dag.nodes_on(s)
        for u, v in itertools.pairwise(on):
            assert "order" in dag.nx.edges[u, v]["kinds"]
    data_edges = sum(len(set(n.all_input_nodes)) for n in gm.graph.nodes)
    assert sum(1 for *_, d in dag.nx.edges(data=True) if "data" in d["kinds"]) == data_edges


def _drop_waits(gm: torch.fx.GraphModule, keep) -> None:
    """Remove the wrapped waits for which ``keep(i)`` is False (their getitems read the source)."""
    waits = [n for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_EVENT]
    for i, w in enumerate(waits):
        if keep(i):
            continue
        for user in list(w.users):
            if user.target is operator.getitem:
                user.replace_all_uses_with(ops.passthrough_source(user))
                gm.graph.erase_node(user)
            else:  # a later sync's chain dependency
                user.args = (tuple(d for d in user.args[0] if d is not w), *user.args[1:])
        gm.graph.erase_node(w)
    gm.recompile()


def _brute_force_hb(a) -> dict:
    """Happens-before by plain reachability over stream order and record->wait edges."""
    preds = {n: set() for n in a.nodes}
    last_on, last_record = {}, {}
    for n in a.nodes:
        s = a.stream[n]
        if s in last_on:
            preds[n].add(last_on[s])
        call = a.syncs.get(n)
        if call is not None and call.target is ops.RECORD_EVENT:
            last_record[call.args[0]] = n
        elif call is not None and call.target is ops.WAIT_EVENT and call.args[0] in last_record:
            preds[n].add(last_record[call.args[0]])
        last_on[s] = n
    ancestors = {}
    for n in a.nodes:
        acc = set()
        for p in preds[n]:
            acc |= ancestors[p] | {p}
        ancestors[n] = acc
    return ancestors


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gm=st.builds(
        random_stream_graph,
        n_nodes=st.integers(5, 60),
        n_streams=st.integers(2, 4),
        seed=st.integers(0, 10_000),
        inplace=st.sampled_from([0.0, 0.2]),
    ),
    drop=st.integers(0, 2**16),
)
def test_verify_agrees_with_brute_force_reachability(gm, drop):
    sp.run(gm)
    _drop_waits(gm, lambda i: (drop >> (i % 16)) & 1)
    dag = sp.StreamDAG.from_graph(gm)
    a = dag.assignment
    ancestors = _brute_force_hb(a)
    for u in a.nodes:
        for v in a.nodes:
            assert dag.happens_before(u, v) == (u in ancestors[v]), (u.name, v.name)
    reqs, _ = requirements(a)
    expected = sorted((r.kind, r.before.name, r.after.name) for r in reqs if r.before not in ancestors[r.after])
    found = sorted((h.kind, *h.nodes) for h in sp.verify(gm).hazards if h.kind != "dealloc")
    assert found == expected


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gm=st.builds(
        random_stream_graph,
        n_nodes=st.integers(5, 80),
        n_streams=st.integers(2, 5),
        seed=st.integers(0, 10_000),
        style=st.sampled_from(["annotate", "fork_join", "mixed"]),
        inplace=st.sampled_from([0.0, 0.2]),
    ),
    drop=st.integers(0, 2**16),
)
def test_run_completes_a_partly_synchronized_graph(gm, drop):
    """Syncs already in the graph (wrapped in control_deps) are kept and only the missing ones added."""
    original = copy.deepcopy(gm)
    inputs = random_inputs(gm)
    expected = run_serial(original, *[x.clone() for x in inputs])
    sp.run(gm)
    _drop_waits(gm, lambda i: (drop >> (i % 16)) & 1)
    kept = sum(1 for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_EVENT)
    result = sp.run(gm)
    assert result.ok, result.after
    assert unjoined(gm) == []
    waits = sum(1 for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_EVENT)
    assert waits == kept + result.waits_added
    got = gm(*[x.clone() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert not sp.run(gm).changed


def _wrap_in_order(gm: torch.fx.GraphModule, seed: int) -> dict[str, list[str]]:
    """What a user's post-grad pass does: some ops wrapped in ``control_deps`` (torch's
    ``preserve_node_ordering``), each ordered after a few nodes it does not reach (so the graph
    stays acyclic, though the wrapper may stand before them). Returns name -> dependency names."""
    import random

    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    rng = random.Random(seed)
    work = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    ops_only = [n for n in work if id(n.target) not in ops.STREAM_OP_IDS]  # a fork or join may be a dependency
    chosen = rng.sample(ops_only, min(len(ops_only), rng.randint(1, 4)))
    wanted: dict[torch.fx.Node, OrderedSet] = {}
    later: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # dependency -> the nodes ordered after it
    for node in chosen:
        reached = _descendants(node, later)
        free = [n for n in work if n not in reached and n is not node and n not in chosen]
        if free:
            wanted[node] = OrderedSet(rng.sample(free, min(len(free), rng.randint(1, 3))))
            for dep in wanted[node]:
                later.setdefault(dep, []).append(node)
    preserve_node_ordering(gm.graph, wanted)
    return {n.name: [d.name for d in deps] for n, deps in wanted.items()}


def _descendants(node: torch.fx.Node, later: dict) -> set[torch.fx.Node]:
    """What ``node`` reaches through its users and the orderings chosen so far."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        for user in [*n.users, *later.get(n, ())]:
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return seen


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gm=st.builds(
        random_stream_graph,
        n_nodes=st.integers(5, 100),
        n_streams=st.integers(1, 4),
        seed=st.integers(0, 10_000),
        style=st.sampled_from(["annotate", "mixed"]),
        inplace=st.just(0.0),  # functional, as post-grad graphs are: an order cannot change a result
        copy_epilogue=st.just(False),
        multi_output=st.sampled_from([0.0, 0.15]),
    ),
    seed=st.integers(0, 10_000),
)
def test_work_a_users_pass_wrapped_in_control_deps_is_planned_and_keeps_its_order(gm, seed):
    """StreamPass's handling of a user's ``preserve_node_ordering`` (``transform/wrapped_work.py``):
    the wrapped ops are planned as plain ops, wrapped again with the same dependencies, the graph is
    in topological order, and, read in that order (the wrappers taken out again, in place, for the
    eager runtime, which reads no wrapper around work), it is race-free and computes what the
    program did."""
    from streampass.transform.wrapped_work import as_plain_ops, unwrap

    inputs = random_inputs(gm, seed=seed)
    expected = run_serial(copy.deepcopy(gm), *[x.clone() for x in inputs])
    wanted = _wrap_in_order(gm, seed)
    with as_plain_ops(gm) as taken:
        assert {n.name for n in taken} == set(wanted)
        result = sp.run(gm)
        assert result.ok, result.after
    gm.graph.lint()
    names = {n.name for n in gm.graph.nodes}  # the pass reads forks and joins into annotations
    kept = {n: [d for d in deps if d in names] for n, deps in wanted.items()}
    assert wrapped_work(gm.graph) == {n: deps for n, deps in kept.items() if deps}
    unwrap(gm)
    assert sp.verify(gm).ok
    gm.recompile()
    got = gm(*[x.clone() for x in inputs])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))

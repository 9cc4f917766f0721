"""The plan's wait count against an independent exhaustive search on small graphs.

The model (docs/plan.md): every added wait sits right before a demand (a node, the output,
or a free point with an unmet requirement), waits for its source stream's whole progress
(a fresh record), and delivers something that demand needs. The brute force below walks
the same demands with its own clocks and tries every such choice at every demand.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streampass as sp
from streampass.analysis.requirements import requirements
from streampass.synthetic import random_stream_graph
from streampass.transform.frontier import covering_sets


def brute_force_min_waits(gm, free_points: bool = True) -> int:
    """Exhaustive minimum for a graph without syncs of its own."""
    a = sp.read_streams(gm)
    reqs, values = requirements(a)
    values = values if free_points else []
    streams = a.streams
    pos, count = {}, defaultdict(int)
    for n in a.nodes:
        count[a.stream[n]] += 1
        pos[n] = (a.stream[n], count[a.stream[n]])
    needs_of = defaultdict(list)
    for r in reqs:
        needs_of[r.after].append(pos[r.before])
    # the walk: ("issue", node) and ("demand", stream, needs), as in the model
    walk = []
    for n in a.nodes:
        if n.op == "output":
            for cv in values:  # free points first, then the exit joins (as the planner walks)
                walk.append(("demand", cv.stream, [pos[r] for rs in cv.readers.values() for r in rs], True))
            if needs_of[n]:
                walk.append(("demand", a.stream[n], needs_of[n], True))
            break
        if needs_of[n]:
            walk.append(("demand", a.stream[n], needs_of[n], False))
        walk.append(("issue", n))

    def free(n) -> bool:  # launches nothing: a record for the node before it can move past it
        return n.op in ("placeholder", "get_attr") or (n.op == "call_function" and n.target.__name__ == "getitem")

    at = {pos[n]: n for n in a.nodes}

    def point(s, p, issued):
        while (s, p + 1) in at and free(at[s, p + 1]) and p + 1 <= issued:
            p += 1
        return p

    best = [float("inf")]

    def search(i, rows, snaps, cost):
        # rows[s][t]: what stream s knows of t; snaps[(s, p)]: s's row when its node p was issued
        if cost >= best[0]:
            return
        if i == len(walk):
            best[0] = cost
            return
        step = walk[i]
        if step[0] == "issue":
            s, p = pos[step[1]]
            rows = {t: dict(r) for t, r in rows.items()}
            rows[s][s] = p
            search(i + 1, rows, {**snaps, (s, p): dict(rows[s])}, cost)
            return
        _, b, needs, at_exit = step
        unmet = [(s, p) for s, p in needs if rows[b][s] < p]
        if not unmet:
            search(i + 1, rows, snaps, cost)
            return
        if at_exit:  # any stream, at its last node
            points = {x: rows[x][x] for x in streams if x != b and rows[x][x]}
        else:  # producers, right after the newest node needed from each (and nodes doing no work)
            points = {}
            for s, p in unmet:
                points[s] = max(points.get(s, 0), p)
            points = {s: point(s, p, rows[s][s]) for s, p in points.items()}
        useful = [x for x, p in points.items() if any(snaps[(x, p)][s] >= q for s, q in unmet)]
        for size in range(1, len(useful) + 1):
            for combo in itertools.combinations(useful, size):
                known = dict(rows[b])
                for x in combo:
                    for t, v in snaps[(x, points[x])].items():
                        known[t] = max(known[t], v)
                if all(known[s] >= p for s, p in unmet):
                    search(i + 1, {**rows, b: known}, snaps, cost + size)

    zero = {s: dict.fromkeys(streams, 0) for s in streams}
    search(0, zero, {(s, 0): dict.fromkeys(streams, 0) for s in streams}, 0)
    return best[0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 9),
    streams=st.integers(2, 4),
    seed=st.integers(0, 100_000),
    inplace=st.sampled_from([0.0, 0.3]),
)
def test_wait_count_equals_exhaustive_minimum(n, streams, seed, inplace):
    gm = random_stream_graph(n, streams, seed=seed, inplace=inplace, n_inputs=2, run_length=2)
    plan = sp.plan_syncs(sp.read_streams(gm))
    assert plan.exact
    # the capture joins (one per side stream left un-joined after its free points) come on top
    assert len(plan.waits) - plan.capture_joins == brute_force_min_waits(gm)
    assert plan.capture_joins <= len({w.stream for w in plan.waits if w.free_point} - {0})


def test_a_wait_never_waits_for_work_its_consumer_does_not_need():
    """p is made on stream 1; stream 2 makes q from p; the ambient stream reads p, then q.

    Stream 2 knows p once it waited for it, so waiting on stream 2 would cover the ambient
    read of p with fewer waits in total, but it would also hold that read back until q is
    done. The plan waits on p's own stream, recorded right after p.
    """
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        with sp.stream(1):
            p = x.sin()
        with sp.stream(2):
            q = p.cos()
        r = p * 2
        return r + q

    gm = make_fx(f)(torch.ones(3))
    plan = sp.plan_syncs(sp.read_streams(gm), dealloc=False)
    got = [(w.source, w.stream, w.before.name, w.record.anchor.name) for w in plan.waits]
    assert got == [(0, 1, "sin", "x_1"), (1, 2, "cos", "sin"), (1, 0, "mul", "sin"), (2, 0, "add", "cos")]
    assert len(plan.waits) == brute_force_min_waits(gm, free_points=False)
    assert [r.anchor.name for r in plan.records] == ["x_1", "sin", "cos"], "one record per needed point"


def test_a_frontier_past_its_limit_costs_no_more_than_the_limit(monkeypatch):
    """When the search's states outgrow ``FRONTIER_LIMIT`` the first ``FRONTIER_LIMIT`` in order
    are kept; finding them must not test every state against every other (a probe's two GPT
    blocks on eight streams spent a minute of ``assign="auto"`` in one search). Each prune
    tests at most ``states × (FRONTIER_LIMIT + 1)`` pairs; this graph took 6.6 million tests in
    all before, and 60 s."""
    from streampass.transform import frontier, planner

    tests = [0]
    dominates = frontier.Clocks.dominates

    def counted(self, other, shared):
        tests[0] += 1
        return dominates(self, other, shared)

    prune = planner.Planner._prune
    worst = []

    def bounded(self, states, still):
        before, n = tests[0], len(states)
        out = prune(self, states, still)
        worst.append((tests[0] - before) / (n * (planner.FRONTIER_LIMIT + 2)))
        return out

    monkeypatch.setattr(frontier.Clocks, "dominates", counted)
    monkeypatch.setattr(planner.Planner, "_prune", bounded)
    gm = random_stream_graph(80, 8, seed=1, run_length=1)
    result = sp.run(gm)
    assert result.ok and not result.plan.exact  # the limit was reached, and the plan is still race-free
    assert max(worst) <= 1


def test_a_join_of_many_side_streams_tries_one_set_of_waits():
    """The output of fifty side streams, each with work only it knows, can only be covered by
    waiting on all of them: the planner tried every subset of them first (2**50 sets; twenty
    streams took seconds, fifty never finished). A stream that alone covers a need is in every
    set, so this join has one."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    outs = []
    for k in range(1, 51):
        y = g.call_function(torch.ops.aten.sin.default, (x,))
        y.meta["custom"] = {"stream": k}
        outs.append(y)
    g.output(tuple(outs))
    result = sp.run(torch.fx.GraphModule(torch.nn.Module(), g))
    assert result.ok and result.plan.exact
    assert (result.records_added, result.waits_added) == (51, 100)  # one entry record; in and out per stream


def test_covering_sets_past_the_limit_is_one_greedy_set():
    """With more optional streams than the limit, one set that covers (marked not exhaustive);
    within it, every covering set, fewest first, as an exhaustive search needs."""
    n = 12
    snaps = {a: [0] * n for a in range(1, n)}
    for a in range(1, n):  # every stream knows every other's first node: any one covers
        snaps[a] = [0] + [1] * (n - 1)
    unmet = [(s, 1) for s in range(1, n)]
    every, exact = covering_sets(snaps, list(range(1, n)), unmet, limit=n)
    assert exact and len(every) == 2 ** (n - 1) - 1 and every[0][0] == (1,)
    greedy, exact = covering_sets(snaps, list(range(1, n)), unmet, limit=4)
    assert not exact and [c for c, _ in greedy] == [(1,)]

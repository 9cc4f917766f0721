"""How economically the order is encoded: what apply adds besides the planned syncs."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import ops
from streampass.synthetic import random_stream_graph

from graphs import ancestors
from reorder import random_topological_copy


def _passthrough_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [x for x in node.all_input_nodes if ops.passthrough_source(x) is not None]


@pytest.mark.parametrize("run_length", [1, 4, 32])
def test_a_consumer_reads_through_at_most_one_wait(run_length):
    gm = random_stream_graph(600, 4, seed=run_length, inplace=0.0, copy_epilogue=False, run_length=run_length)
    sp.run(gm)
    a = sp.read_streams(gm)
    for n in gm.graph.nodes:
        if a.is_compute(n):
            assert len(_passthrough_inputs(n)) <= 1, n.format_node()


def test_an_input_already_after_the_wait_carries_the_order():
    def f(x, w):
        with sp.stream(1):
            p = x.sin()
        y = p + 1  # needs the wait for p: reads p through it
        return y * p  # also reads p, but y is on its stream and already after the wait

    gm = make_fx(f)(torch.randn(4), torch.randn(4))
    sp.run(gm)
    mul = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    add = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert len(_passthrough_inputs(add)) == 1
    assert _passthrough_inputs(mul) == []
    assert add in mul.all_input_nodes
    assert sp.verify(gm).ok


def test_node_growth_on_region_graphs_stays_under_one_and_a_half():
    """The regions family of benchmarks/run.py (seeded): what the issue's growth bound is about."""
    gm = random_stream_graph(4000, 4, seed=0, inplace=0.0, copy_epilogue=False, run_length=32)
    before = len(gm.graph.nodes)
    result = sp.run(gm)
    assert result.ok
    getitems = sum(1 for n in gm.graph.nodes if n.target is operator.getitem)
    assert len(gm.graph.nodes) / before <= 1.5, (len(gm.graph.nodes), before, getitems)


def test_a_view_two_waits_reroute_follows_both():
    """A view made after two waits (of different streams) feeds consumers that rely on each:
    the second wait threads the first one's getitem, so the view follows both."""

    def f(a):
        with sp.stream(1):
            v = a.sin()
        with sp.stream(2):
            q = v.cos()
        x = v.t()
        n1 = x + 1
        with sp.stream(2):
            n3 = x * 2
        return q, n1, n3

    from reorder import random_topological_copy

    gm = make_fx(f)(torch.randn(4, 4))
    assert sp.run(gm).ok
    for seed in range(60):
        report = sp.verify(random_topological_copy(gm, seed))
        assert report.ok, report
    dangling = [n for n in gm.graph.nodes if n.target is operator.getitem and not n.users]
    assert dangling == []
    assert not sp.run(gm).changed


def test_rerun_sees_order_carried_by_a_view_on_another_stream():
    """A consumer ordered after its wait through a view made on another stream needs nothing
    more on a second run (found by the property tests once views were added)."""
    gm = random_stream_graph(16, 3, seed=4138, inplace=0.25, run_length=4, views=0.2)
    assert sp.run(gm).ok
    code = gm.code
    assert not sp.run(gm).changed and gm.code == code


def test_rerun_looks_through_a_view_rerouted_by_another_streams_wait():
    """A same-stream input whose own input was rerouted through a wait of another stream still
    carries the order on a second run."""
    gm = random_stream_graph(13, 2, seed=5576, style="fork_join", inplace=0.25, run_length=1, views=0.2)
    assert sp.run(gm).ok
    code = gm.code
    assert not sp.run(gm).changed and gm.code == code


def test_each_output_carries_its_own_wait():
    """Outputs made on side streams are each returned through a wait, not ordered only through
    a sibling output: a partitioner that splits the outputs keeps every value's order."""

    def f(a):
        with sp.stream(1):
            v = a.sin()
        with sp.stream(2):
            w = a.cos()
        u = v + w  # on the ambient stream: after the waits for v and w
        return u, v, w

    gm = make_fx(f)(torch.randn(4))
    assert sp.run(gm).ok
    out = next(n for n in gm.graph.nodes if n.op == "output")
    returned = out.args[0]
    for x in returned[1:]:  # v and w
        assert ops.passthrough_source(x) is not None, x.format_node()
    assert not sp.run(gm).changed


def test_a_sync_holds_only_the_last_work_of_its_stretch():
    """A record after a chain depends on the chain's end alone (the rest comes before it by data),
    so the program frees the chain's intermediates as it goes instead of at the record."""

    def f(x):
        with sp.stream(1):
            a = x.sin()
            b = a.cos()
            c = b.exp()
            d, e = torch.aminmax(c)  # a multi-output op: read through its getitems
            y = d + e
        return y + x

    gm = make_fx(f)(torch.randn(8))
    sp.run(gm)
    a = sp.read_streams(gm)
    records = [n for n, call in a.syncs.items() if call.target is ops.RECORD_EVENT and call.args[1] == 1]
    deps = {d.name for r in records for d in r.args[0] if a.is_compute(d)}
    assert deps == {"add"}, deps
    # Every topological order the result allows is still race-free.
    for seed in range(20):
        assert sp.verify(random_topological_copy(gm, seed)).ok


def _side_sin(x):
    with sp.stream(1):
        y = x.sin()
    return y + x.cos()


def test_a_sort_that_places_the_output_early_still_runs_every_sync():
    """torch's legalize_graph places the output as soon as its inputs are placed; FX's code
    returns there. The output reads one value through the ambient stream's last sync, so every
    sync (exit joins, free-point waits) comes before it."""
    from torch.fx.passes.tools_common import legalize_graph

    x = torch.randn(4)
    gm = make_fx(_side_sin)(x)
    sp.run(gm)
    legalize_graph(gm)
    gm.recompile()
    nodes = list(gm.graph.nodes)
    after = nodes[[n.op for n in nodes].index("output") + 1 :]
    assert not [n.name for n in after if ops.as_sync_call(n) is not None]
    assert sp.verify(gm).ok and torch.equal(gm(x), _side_sin(x))
    again = sp.run(gm)  # may re-encode the new order, but nothing is missing
    assert again.ok and again.records_added == again.waits_added == 0


def test_an_output_made_after_the_last_sync_still_follows_it():
    """The ambient stream's last sync is the exit join of stream 1 (before a dead copy_ into
    stream 1's temporary), and everything the output reads is made after it, from values made
    before it. The output read nothing through it, so legalize_graph put the join after the
    return: it never ran, and verify refused the sorted graph."""
    from torch.fx.passes.tools_common import legalize_graph

    from graphs import GraphBuilder

    aten = torch.ops.aten
    b = GraphBuilder()
    x = b.input("x")
    m = b.op(aten.mul.Tensor, x, x, stream=1)  # a temporary made on stream 1
    y = b.op(aten.sin.default, x, stream=0)
    b.op(aten.copy_.default, m, y, stream=0)  # the ambient stream writes it; nothing reads it after
    gm = b.output(b.op(aten.cos.default, y, stream=0))
    assert sp.run(gm).ok and not sp.run(gm).changed
    legalize_graph(gm)
    gm.recompile()
    nodes = list(gm.graph.nodes)
    after = nodes[[n.op for n in nodes].index("output") + 1 :]
    assert not [n.name for n in after if ops.as_sync_call(n) is not None]
    assert sp.verify(gm).ok
    x = torch.randn(4)
    torch.testing.assert_close(gm(x)[0], x.sin().cos())
    again = sp.run(gm)
    assert again.ok and again.records_added == again.waits_added == 0


@pytest.mark.parametrize("part", ["split", "chunk", "unbind"])
def test_an_output_tail_through_a_list_of_views_is_not_rewired(part):
    """The same program traced by symbolic_trace (no metadata), returning a piece of a list of
    views made before the sync: the getitem was taken for the tail's reader and rewired to read
    the list through the sync (internal error: a getitem read storage x, not the list)."""

    def f(x):
        pieces = {"split": lambda: x.split(2), "chunk": lambda: x.chunk(2), "unbind": lambda: x.unbind(0)}[part]()
        with sp.stream(1):
            m = x * x
        m.copy_(x.sin())
        return pieces[1] * 2

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 4)
    assert sp.run(gm).ok and not sp.run(gm).changed
    torch.testing.assert_close(gm(x), f(x))


def test_a_sync_after_the_output_is_refused():
    """FX appends a node made after the output behind it, where it never runs."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.sin.default, (x,)),))
    g.call_function(ops.RECORD_EVENT, (1, 0))
    before = [n.name for n in g.nodes]
    with pytest.raises(sp.StreamPassError, match="'record_event_default': comes after the graph's output 'output'"):
        sp.run(torch.fx.GraphModule(torch.nn.Module(), g))
    assert [n.name for n in g.nodes] == before


def _user_wait_then_reads(sync: str) -> tuple[torch.fx.GraphModule, dict]:
    """Stream 1 computes ``y``; the current stream (0) then waits for stream 1 (``wait_stream``,
    or the host blocks on it: ``synchronize_stream``) and reads the inputs: ``buf`` directly,
    through a view made before the wait, and ``w`` with what it made before the wait; it copies
    that into ``dest``, and overwrites ``w`` with zeros made after the wait. Stream 1 may have
    used the inputs before the graph, which no analysis of the graph sees."""
    g = torch.fx.Graph()
    buf, x, w, dest = g.placeholder("buf"), g.placeholder("x"), g.placeholder("w"), g.placeholder("dest")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    y.meta["custom"] = {"stream": 1}
    view = g.call_function(torch.ops.aten.view.default, (buf, [-1]))
    made = g.call_function(torch.ops.aten.neg.default, (x,))
    wait = g.call_function(ops.WAIT_STREAM, (0, 1)) if sync == "wait_stream" else g.call_function(ops.SYNC_STREAM, (1,))
    reads = {
        "direct": g.call_function(torch.ops.aten.add.Tensor, (buf, 1)),
        "view": g.call_function(torch.ops.aten.sin.default, (view,)),
        "with_made": g.call_function(torch.ops.aten.mul.Tensor, (made, w)),
        "copy": g.call_function(torch.ops.aten.copy_.default, (dest, made)),  # writes an input
    }
    zeros = g.call_function(torch.ops.aten.full.default, ([4], 0.0))
    reads["overwrite"] = g.call_function(torch.ops.aten.copy_.default, (w, zeros))  # buf.zero_() after the wait
    g.output((y, *(r for k, r in reads.items() if k not in ("copy", "overwrite"))))
    return torch.fx.GraphModule(torch.nn.Module(), g), {"wait": wait, **reads}


READS_AFTER_THE_WAIT = ("direct", "view", "with_made", "copy", "overwrite")


@pytest.mark.parametrize(
    "sync",
    [
        "wait_stream",
        pytest.param(
            "synchronize_stream",
            marks=pytest.mark.skipif(not ops.exists(ops.SYNC_STREAM), reason="torch 2.11 has no synchronize ops"),
        ),
    ],
)
def test_reads_of_inputs_after_a_users_wait_stay_after_it(sync):
    """``cur.wait_stream(side); buf.add_(1)``: ``side`` wrote ``buf`` before the graph, the
    current stream's read of it must follow the wait. Nothing inside the graph makes that a
    hazard, so the encoding threaded nothing, and a sort (inductor's scheduler) could issue the
    read before the wait; run and verify said ok. Each read of an input after the wait now
    depends on it, in every topological order, and a second run changes nothing."""
    gm, n = _user_wait_then_reads(sync)
    sp.run(gm)
    wait = next(w for w in gm.graph.nodes if w.name == n["wait"].name)  # wrapped, under the same name
    for name in READS_AFTER_THE_WAIT:
        assert wait in ancestors(n[name]), name
    assert n["copy"].args[0].op == "placeholder"  # what AOT autograd asks of a copy into an input
    code = gm.code
    assert not sp.run(gm).changed and gm.code == code
    for seed in range(5):
        moved = random_topological_copy(gm, seed)
        order = {v.name: i for i, v in enumerate(moved.graph.nodes)}
        assert all(order[n[name].name] > order[wait.name] for name in READS_AFTER_THE_WAIT)


def test_a_cond_after_a_users_wait_keeps_its_branches():
    """A ``torch.cond`` after the program's wait, its predicate made before it: the rule above
    took the cond's first argument with a graph input behind it, its branch (a ``get_attr`` of a
    GraphModule), and threaded it through the wait; the branch then was no body of the cond any
    more, was never planned, and its race stayed while run and verify said ok (review)."""

    def f(buf, x):
        return torch.cond(x.sum() > 0, lambda b: b.sin() + b, lambda b: b.cos(), (buf,))

    gm = make_fx(f)(torch.ones(4), torch.ones(4))
    g = gm.graph
    x = next(n for n in g.nodes if n.op == "placeholder" and n.name.startswith("x"))
    gt = next(n for n in g.nodes if n.target is torch.ops.aten.gt.Scalar)
    with g.inserting_after(gt):
        g.call_function(ops.WAIT_STREAM, (0, 1))
    with g.inserting_after(gt):
        y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
        y.meta["custom"] = {"stream": 1}
    out = next(n for n in g.nodes if n.op == "output")
    out.args = ((out.args[0], y),)
    sin = next(n for n in gm.true_graph_0.graph.nodes if n.target is torch.ops.aten.sin.default)
    sin.meta["custom"] = {"stream": 2}  # a race in the branch: its add reads sin on stream 0
    gm.true_graph_0.recompile()
    gm.recompile()
    assert not sp.verify(gm.true_graph_0).ok
    assert sp.run(gm).ok
    cond = next(n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond)
    assert cond.args[1].op == "get_attr" and sp.verify(gm.true_graph_0).ok


@pytest.mark.skipif(not ops.exists(ops.SYNC_STREAM), reason="torch 2.11 has no synchronize ops")
@pytest.mark.parametrize("barrier_first", [True, False])
def test_a_read_follows_both_a_host_barrier_and_its_own_streams_wait(barrier_first):
    """Stream 1 waits for stream 3 and the host for stream 2, in either order, then stream 1
    reads an input: the read went through the later of the two only, but a barrier is on the
    ambient stream's chain, not stream 1's, so nothing ordered the read after the other (review)."""
    g = torch.fx.Graph()
    buf = g.placeholder("buf")
    g.call_function(ops.WAIT_STREAM, (1, 0))
    seq = [("barrier", ops.SYNC_STREAM, (2,)), ("wait", ops.WAIT_STREAM, (1, 3))]
    syncs = {k: g.call_function(t, a) for k, t, a in (seq if barrier_first else seq[::-1])}
    read = g.call_function(torch.ops.aten.add.Tensor, (buf, 1))
    read.meta["custom"] = {"stream": 1}
    g.call_function(ops.WAIT_STREAM, (0, 1))
    g.output((read,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert sp.run(gm).ok
    after = {n.name for n in ancestors(read)}
    assert {syncs["barrier"].name, syncs["wait"].name} <= after
    code = gm.code
    assert not sp.run(gm).changed and gm.code == code


def test_a_submodule_call_after_a_users_wait_follows_it():
    """symbolic_trace keeps ``self.lin(h)`` whole; it reads its own weight, which stream 1 may
    have updated before the graph, and its argument was made before the wait: nothing ordered
    the call after the wait (review)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = x * 2
            side = h * 5
            return self.lin(h), side

    gm = torch.fx.symbolic_trace(M())
    side = [n for n in gm.graph.nodes if n.target is operator.mul][1]
    side.meta["custom"] = {"stream": 1}
    with gm.graph.inserting_after(side):
        wait = gm.graph.call_function(ops.WAIT_STREAM, (0, 1))
    gm.recompile()
    x = torch.randn(2, 4)
    expected = gm(x)
    assert sp.run(gm).ok
    (lin,) = gm.graph.find_nodes(op="call_module", target="lin")
    assert wait.name in {n.name for n in ancestors(lin)}
    code = gm.code
    assert not sp.run(gm).changed and gm.code == code
    torch.testing.assert_close(gm(x), expected)

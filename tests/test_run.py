"""streampass.run: race-free results that survive reordering, run eagerly, reuse existing syncs."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.tools_common import legalize_graph

import streampass as sp
from streampass import ops
from streampass.serial import run_serial
from streampass.synthetic import random_stream_graph

from graphs import GraphBuilder, aten
from reorder import random_topological_copy


def branches(x, w):
    with sp.stream(1):
        a = (x @ w).relu()
    with sp.stream(2):
        b = (x * 2).sin()
    c = x.cos()
    with sp.stream(1):
        d = a + b  # stream 1 reads stream 2's b
    x.add_(1)  # ambient overwrites an input stream 1 and 2 read
    return d * c


@pytest.fixture
def traced():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(branches)(x.clone(), w)
    return gm, (x, w)


def test_run_removes_every_hazard_and_keeps_results(traced):
    gm, (x, w) = traced
    before = sp.verify(gm)
    assert {"raw", "war", "entry", "exit", "dealloc"} <= {h.kind for h in before.hazards}
    expected_x = x.clone()
    expected = branches(expected_x, w)
    result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok
    assert len(result.before.hazards) == len(before.hazards)
    got_x = x.clone()
    got = gm(got_x, w)
    assert torch.equal(got, expected) and torch.equal(got_x, expected_x)
    got_x = x.clone()
    assert torch.equal(sp.execute(gm, got_x, w), expected) and torch.equal(got_x, expected_x)


def test_run_is_idempotent(traced):
    gm, _ = traced
    sp.run(gm)
    code = gm.code
    again = sp.run(gm)
    assert not again.changed and again.waits_added == 0 and again.records_added == 0
    assert gm.code == code


def test_ordering_survives_reordering_dce_and_topological_sort(traced):
    gm, (x, w) = traced
    expected = branches(x.clone(), w)
    sp.run(gm)
    for seed in range(25):
        shuffled = random_topological_copy(gm, seed)
        assert sp.verify(shuffled).ok, (seed, sp.verify(shuffled))
        with sp.runtime.bind(shuffled):
            assert torch.equal(shuffled(x.clone(), w), expected)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert sp.verify(gm).ok
    from torch._inductor.pattern_matcher import stable_topological_sort

    stable_topological_sort(gm.graph)
    legalize_graph(gm)
    assert sp.verify(gm).ok


def test_syncs_use_torch_stream_ops_and_fresh_event_indices(traced):
    gm, _ = traced
    sp.run(gm)
    a = sp.read_streams(gm)
    calls = list(a.syncs.values())
    assert calls and all(c.target in (ops.RECORD_EVENT, ops.WAIT_EVENT) for c in calls)
    assert all(c.wrapper is not None and c.wrapper.target is ops.CONTROL_DEPS for c in calls)
    events = {c.args[0] for c in calls}
    assert not events & set(a.streams), "event indices never collide with stream indices"
    recorded = [c.args[0] for c in calls if c.target is ops.RECORD_EVENT]
    assert len(recorded) == len(set(recorded)), "each event is recorded once"
    fork_join = [n for n in gm.graph.nodes if n.target in (ops.FORK, ops.JOIN)]
    assert not fork_join


def test_fork_join_graph_is_normalised_to_annotations_and_runs():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.FORK, 0, 1)
    y = b.op(aten.sin.default, x, name="y")
    b.sync(ops.JOIN, 1, 0)
    z = b.op(aten.mul.Tensor, y, x, name="z")
    gm = b.output(z)
    ref = copy.deepcopy(gm)
    inp = torch.randn(4, 4)
    result = sp.run(gm)
    assert result.ok
    assert (gm.graph.find_nodes(op="call_function", target=aten.sin.default)[0].meta["custom"]["stream"]) == 1
    assert torch.equal(gm(inp)[0], run_serial(ref, inp)[0])


def test_event_indices_avoid_existing_events():
    b = GraphBuilder()
    x = b.input("x")
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.RECORD_EVENT, 40, 1)
    b.sync(ops.WAIT_EVENT, 40, 0)
    z = b.op(aten.cos.default, y, name="z")
    gm = b.output(z)
    sp.run(gm)
    new = {c.args[0] for c in sp.read_streams(gm).syncs.values()} - {40}
    assert new and min(new) > 40


def test_torch_fanout_reused_and_only_the_missing_wait_added(fanout_graph):
    from torch._functorch._aot_autograd.streams import insert_backward_syncs

    gm = fanout_graph()
    insert_backward_syncs(gm)
    torch_waits = len(gm.graph.find_nodes(op="call_function", target=ops.WAIT_EVENT))
    a = sp.read_streams(gm)
    ordering = sp.plan_syncs(a, dealloc=False)
    # one wait for reader_b (torch's miss) and one entry wait before the producer reads x
    assert sorted((w.source, w.stream, w.before.name) for w in ordering.waits) == [
        (0, 1, "producer"),
        (1, 2, "reader_b"),
    ]
    assert all(w.record.existing is not None for w in ordering.waits if w.source == 1), (
        "the fan-out wait reuses torch's record of the producer"
    )
    result = sp.run(gm)
    assert result.ok
    after = [c for c in sp.read_streams(gm).syncs.values() if c.target is ops.WAIT_EVENT]
    assert len(after) == torch_waits + result.waits_added


@pytest.mark.parametrize(
    "build",
    [
        lambda b, x: b.sync(ops.JOIN, 1, 0),
        lambda b, x: b.sync(ops.FORK, 0, 1),
        lambda b, x: b.sync(ops.WAIT_EVENT, 9, 1),
        lambda b, x: b.op(aten.cos.default, x, stream=True),
    ],
)
def test_refusals_leave_the_graph_exactly_as_it_was(build):
    b = GraphBuilder()
    x = b.input("x")
    y = b.op(aten.sin.default, x, stream=1)
    build(b, x)
    gm = b.output(b.op(aten.neg.default, y))
    gm.recompile()
    code, nodes = gm.code, [(n.name, n.target, n.args) for n in gm.graph.nodes]
    with pytest.raises(sp.StreamPassError):
        sp.run(gm)
    assert gm.code == code
    assert [(n.name, n.target, n.args) for n in gm.graph.nodes] == nodes


def test_internal_failure_restores_the_graph(traced, monkeypatch):
    gm, _ = traced
    code = gm.code
    from streampass.transform import apply

    def boom(self):
        self.graph.call_function(aten.sin.default, (next(iter(self.graph.nodes)),))
        raise RuntimeError("boom")

    monkeypatch.setattr(apply._Editor, "encode", boom)
    with pytest.raises(sp.StreamPassError, match="restored"):
        sp.run(gm)
    assert gm.code == code


def test_internal_failure_undoes_every_kind_of_edit(traced, monkeypatch):
    """Re-pointed args, replaced meta, a moved node, a new submodule: all put back."""
    gm, _ = traced
    code = gm.code
    before = [(n.name, n.target, n.args, n.kwargs, dict(n.meta)) for n in gm.graph.nodes]
    modules = set(gm._modules)
    from streampass.transform import apply

    def boom(self):
        nodes = [n for n in self.a.nodes if n.op == "call_function"]  # the graph's own nodes
        first, last = nodes[0], nodes[-1]
        new = self.graph.call_function(aten.cos.default, (first,))
        last.replace_input_with(last.all_input_nodes[0], new)
        first.meta["custom"] = {"stream": 99}
        nodes[-1].append(nodes[1])  # move a node
        self.gm.add_submodule("junk", torch.nn.Linear(1, 1))
        raise RuntimeError("boom")

    monkeypatch.setattr(apply._Editor, "encode", boom)
    with pytest.raises(sp.StreamPassError, match="restored"):
        sp.run(gm)
    assert gm.code == code
    assert [(n.name, n.target, n.args, n.kwargs, dict(n.meta)) for n in gm.graph.nodes] == before
    assert set(gm._modules) == modules


def test_rewrite_that_breaks_the_order_is_caught_and_undone(traced, monkeypatch):
    gm, _ = traced
    code = gm.code
    from streampass.transform import apply

    encode = apply._Editor.encode

    def misplace(self):
        encode(self)
        victim = next(n for n in self.edited if n.all_input_nodes)
        next(iter(self.graph.nodes)).prepend(victim)  # now before its own inputs

    monkeypatch.setattr(apply._Editor, "encode", misplace)
    with pytest.raises(sp.StreamPassError, match="before it is defined"):
        sp.run(gm)
    assert gm.code == code


def test_failure_after_fork_join_removal_is_undone():
    """fork/join nodes are erased last: a failure before that leaves them in place, intact."""
    gm = random_stream_graph(40, 3, seed=5, style="fork_join")
    assert any(n.target in (ops.FORK, ops.JOIN) for n in gm.graph.nodes)
    code = gm.code
    before = [(n.name, n.target, n.args) for n in gm.graph.nodes]
    from streampass.transform import apply

    encode = apply._Editor.encode

    def boom(self):
        encode(self)
        raise RuntimeError("boom")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(apply._Editor, "encode", boom)
        with pytest.raises(sp.StreamPassError, match="restored"):
            sp.run(gm)
    gm.graph.lint()
    assert [(n.name, n.target, n.args) for n in gm.graph.nodes] == before
    assert len(gm.graph.nodes) == len(before) and gm.code == code
    assert sp.run(gm).ok  # and the pass still works on it


def test_failure_after_fork_join_removal_brings_them_back(monkeypatch):
    """The last step (code generation) fails after fork/join nodes were erased: they return."""
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.FORK, 0, 1, name="fork1")
    y = b.op(aten.sin.default, x, name="y")
    b.sync(ops.JOIN, 1, 0, name="join1")
    gm = b.output(b.op(aten.add.Tensor, y, x, name="v"))
    code = gm.code
    before = [(n.name, n.target, n.args) for n in gm.graph.nodes]
    real = type(gm).recompile
    failed = []

    def recompile_fails_once(self):
        if not failed:
            failed.append(True)
            raise RuntimeError("codegen failed")
        return real(self)

    monkeypatch.setattr(type(gm), "recompile", recompile_fails_once)
    with pytest.raises(sp.StreamPassError, match="restored"):
        sp.run(gm)
    gm.graph.lint()
    assert [(n.name, n.target, n.args) for n in gm.graph.nodes] == before
    assert len(gm.graph.nodes) == len(before) and gm.code == code
    assert list(gm.graph.find_nodes(op="call_function", target=ops.FORK))
    assert sp.read_streams(gm).stream[gm.graph.find_nodes(op="call_function", target=aten.sin.default)[0]] == 1
    assert sp.run(gm).ok


def test_single_stream_graph_is_left_alone():
    gm = make_fx(lambda x: x.sin() + 1)(torch.ones(3))
    code = gm.code
    result = sp.run(gm)
    assert not result.changed and result.ok and gm.code == code


def test_graph_without_module_is_refused():
    g = torch.fx.Graph()
    g.output(g.placeholder("x"))
    with pytest.raises(sp.StreamPassError, match="GraphModule"):
        sp.run(g)


def test_runtime_table_does_not_leak_between_graphs(traced):
    from torch._dynamo import graph_bytecode_inputs as table

    gm, (x, w) = traced
    sp.run(gm)
    before = copy.copy(table.index_to_external_object_weakref)  # a dict in torch 2.13, a list in 2.15
    gm(x.clone(), w)
    assert table.index_to_external_object_weakref == before


def test_training_graphs_from_aot_function_run_and_match_eager():
    """Forward and backward joint-graph partitions: rewritten by run(), called by AOT autograd."""
    from functorch.compile import aot_function, make_boxed_func

    from streampass.aot_guard import cpu_safe_aot

    results = []

    def compiler(gm, _):
        results.append(sp.run(gm))
        return make_boxed_func(gm)  # gm(...), not gm.forward: the call binds the stream table

    def block(x, w1, w2):
        with sp.stream(1):
            a = torch.tanh(x @ w1)
        with sp.stream(2):
            b = torch.sigmoid(x @ w2)
        return (a * b).sum()

    args = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    with cpu_safe_aot():
        loss = aot_function(block, fw_compiler=compiler, bw_compiler=compiler)(*args)
        loss.backward()
    ref = block(*ref_args)
    ref.backward()
    assert len(results) == 2 and all(r.ok and r.changed for r in results)
    assert torch.allclose(loss, ref)
    for a, r in zip(args, ref_args):
        assert torch.allclose(a.grad, r.grad)


def test_in_place_write_to_a_chunk_of_an_input_is_ordered_before_readers():
    def f(x):
        a, _b = x.split(2)
        with sp.stream(1):
            a.add_(1)
        return x.sum()

    gm = make_fx(f)(torch.ones(4))
    before = sp.verify(gm)
    assert ("entry", ("x_1", "add_")) in {(h.kind, h.nodes) for h in before.hazards}
    assert not any(h.kind == "dealloc" for h in before.hazards), "a chunk of an input is not a new allocation"
    sp.run(gm)
    dag = sp.StreamDAG.from_graph(gm)
    assert sp.verify(gm).ok
    assert dag.happens_before("add_", "sum_1")
    assert torch.equal(gm(torch.ones(4)), f(torch.ones(4)))


def test_restored_graph_keeps_its_calling_convention(monkeypatch):
    def g(d):
        with sp.stream(1):
            y = d["a"].sin()
        return y + d["b"]

    d = {"a": torch.randn(3), "b": torch.randn(3)}
    gm = make_fx(g)(d)
    code = gm.code
    from streampass.transform import apply

    def boom(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(apply._Editor, "encode", boom)
    with pytest.raises(sp.StreamPassError):
        sp.run(gm)
    assert gm.code == code
    assert torch.equal(gm(d), g(d))


def test_rerun_after_the_graph_grew_a_stream_rebuilds_the_runtime_table():
    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + 1

    x = torch.randn(3)
    gm = make_fx(f)(x)
    sp.run(gm)
    gm(x)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        e = gm.graph.call_function(torch.ops.aten.exp.default, (out.args[0],))
    e.meta["custom"] = {"stream": 2}
    e.meta["val"] = out.args[0].meta.get("val")
    out.args = (e,)
    gm.recompile()
    assert sp.run(gm).ok
    assert torch.equal(gm(x), (f(x)).exp())
    assert torch.equal(sp.execute(gm, x), (f(x)).exp())


def test_a_given_reading_gives_the_same_rewrite_and_a_reading_of_the_result(traced):
    gm, _ = traced
    other = copy.deepcopy(gm)
    a = sp.read_streams(gm)
    result = sp.run(gm, assignment=a)
    sp.run(other)
    assert gm.code == other.code and result.ok
    # the reading it hands on is of the rewritten graph, and says what a fresh one says
    fresh = sp.read_streams(gm)
    assert result.assignment.graph is gm.graph and result.assignment.nodes == fresh.nodes
    assert result.assignment.stream == fresh.stream and set(result.assignment.syncs) == set(fresh.syncs)
    # a second run changes nothing and hands on the reading it was given
    again = sp.run(gm, assignment=fresh)
    assert not again.changed and again.assignment is fresh and again.after is again.before


def test_a_reading_of_another_graph_is_refused_and_nothing_changes(traced):
    gm, _ = traced
    other = copy.deepcopy(gm)
    code = gm.code
    with pytest.raises(sp.StreamPassError, match="read_streams of this graph"):
        sp.run(gm, assignment=sp.read_streams(other))
    with pytest.raises(sp.StreamPassError, match="same external_events"):
        sp.run(gm, external_events=(7,), assignment=sp.read_streams(gm))
    assert gm.code == code


class _InplaceRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        y = x.sin()
        self.act(y)
        return y.cos()


def _method(x):
    y = x.sin()
    y.add_(1)
    return y.cos()


def _function(x):
    y = x.sin()
    torch.relu_(y)
    return y.cos()


@pytest.mark.parametrize("program", [_method, _function, _InplaceRelu()], ids=["method", "function", "module"])
def test_in_place_calls_without_a_schema_are_writes(program):
    """symbolic_trace keeps ``y.add_(1)``, ``torch.relu_(y)`` and ``nn.ReLU(inplace=True)`` as calls
    with no schema: they write their first argument, and a later reader on another stream must
    wait for the write."""
    gm = torch.fx.symbolic_trace(program)
    write = next(
        n
        for n in gm.graph.nodes
        if n.op in ("call_method", "call_function", "call_module") and n.name not in ("sin", "cos")
    )
    write.meta["custom"] = {"stream": 1}
    assert "waw" in {h.kind for h in sp.verify(gm).hazards}
    x = torch.randn(4)
    want = program(x)
    assert sp.run(gm).ok
    cos = next(n for n in gm.graph.nodes if n.name == "cos")
    assert ops.passthrough_source(cos.args[0]) is not None  # reads y through a wait
    torch.testing.assert_close(gm(x), want)


def _through_view(x):
    x.view(-1).add_(1)
    return x.sin()


def _through_torch_transpose(x):
    torch.transpose(x, 0, 1).mul_(2)
    return x.sin()


def _through_index(x):
    x[0].add_(1)
    return x.sin()


def _through_slice(x):
    x[:, 1:].add_(1)
    return x.sin()


def _through_split(x):
    x.split(2)[1].add_(1)
    return x.sin()


@pytest.mark.parametrize(
    "program",
    [_through_view, _through_torch_transpose, _through_index, _through_slice, _through_split],
    ids=["view", "torch.transpose", "index", "slice", "split"],
)
def test_writes_through_views_without_a_schema_write_the_source(program):
    """symbolic_trace keeps views as calls with no schema (``x.view(-1)``, ``x[0]``, ``x[:, 1:]``,
    a chunk of ``x.split``): a write through them on stream 1 writes ``x``, so the read of ``x``
    on the ambient stream waits for it."""
    gm = torch.fx.symbolic_trace(program)
    sin = next(n for n in gm.graph.nodes if n.name == "sin")
    for n in gm.graph.nodes:
        if n.op in ("call_method", "call_function") and n is not sin:
            n.meta["custom"] = {"stream": 1}
    _check_write_before_the_read(gm, next(n for n in gm.graph.nodes if n.name.endswith("_")), program)


def _check_write_before_the_read(gm, write, program):
    """verify finds ``write`` (stream 1) unordered before ``sin`` (ambient); after run it is
    ordered, and the result equals ``program``'s."""
    assert ("raw", (write.name, "sin")) in [(h.kind, h.nodes) for h in sp.verify(gm).hazards]
    x = torch.randn(4, 4)
    want = program(x.clone())
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before(write.name, "sin")
    torch.testing.assert_close(gm(x.clone()), want)


def test_item_assignment_writes_the_tensor():
    """Dynamo records ``x[0] = v`` as ``operator.setitem(x, 0, v)``: a write of ``x``."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    v = g.call_method("cos", (g.call_function(operator.getitem, (x, 1)),))
    put = g.call_function(operator.setitem, (x, 0, v))
    put.meta["custom"] = {"stream": 1}
    g.output((g.call_method("sin", (x,)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    _check_write_before_the_read(gm, put, copy.deepcopy(gm))


def test_a_gather_by_index_is_work_that_reads_its_source():
    """``x[idx]`` copies (advanced indexing): a kernel that reads ``x`` where it runs, so it waits
    for a write of ``x`` on another stream; ``x[0]`` is a view and launches nothing."""
    gm = torch.fx.symbolic_trace(lambda x, idx: (x.add_(1), x[idx], x[0]))
    a = sp.read_streams(gm)
    gather, view = (n for n in gm.graph.nodes if n.target is operator.getitem)
    assert gather in a.compute and view not in a.compute
    assert a.root[view] is a.root[gather.args[0]] and a.root[gather] is gather
    gather.meta["custom"] = {"stream": 1}
    assert ("raw", ("add_", gather.name)) in [(h.kind, h.nodes) for h in sp.verify(gm).hazards]


def test_unsafe_view_shares_its_source_storage():
    """``aten._unsafe_view`` returns a view although its schema says nothing: a write through it
    on stream 1 writes the source read on the ambient stream."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    base = g.call_function(aten.sin.default, (x,))
    v = g.call_function(aten._unsafe_view.default, (base, [16]))
    w = g.call_function(aten.add_.Tensor, (v, 1))
    w.meta["custom"] = {"stream": 1}
    r = g.call_function(aten.cos.default, (base,))
    g.output((r, w))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    x = torch.randn(4, 4)
    want = gm(x)
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before(w.name, r.name)
    torch.testing.assert_close(gm(x), want)

"""The standalone pass on graphs users make: modules, copies, odd input (issue 12 regressions)."""

from __future__ import annotations

import collections
import copy
import io
import operator
import threading

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import ops, runtime
from streampass.analysis.requirements import requirements
from streampass.ops import MAX_INDEX
from streampass.transform.plan import EVENT_BASE

from reorder import random_topological_copy

aten = torch.ops.aten


class WithParam(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        a = x.sin()
        with sp.stream(1):
            y = x @ self.w
        return y + a


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        a = x.cos()
        with sp.stream(1):
            self.count.add_(1)
            y = x * self.count
        return y + a


@pytest.mark.parametrize("make", [WithParam, WithBuffer], ids=["parameter", "buffer"])
def test_module_attributes_are_inputs_wherever_they_stand(make):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(2, 4)
    gm = make_fx(model)(x)
    kinds = [n.op for n in gm.graph.nodes]
    assert kinds.index("get_attr") > kinds.index("call_function")  # make_fx puts it at first use
    original = copy.deepcopy(gm)  # its own copy of the parameters and buffers
    result = sp.run(gm)
    assert result.ok, result.after.hazards
    again = sp.run(gm)
    assert not again.changed and again.ok  # converges: a second run adds nothing
    torch.testing.assert_close(gm(x), original(x))


class WritesBufferThenReadsOnSide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.ones(4, 4))

    def forward(self, x):
        self.buf[:2].mul_(2)  # the ambient stream writes part of the buffer
        with sp.stream(1):
            return x + self.buf  # stream 1 reads it: after the write


def test_two_get_attrs_of_one_tensor_are_one_storage():
    """make_fx names a module tensor anew at each use: the write went through one get_attr and
    the side stream read through another, read as two storages, so run ordered nothing between
    them (verify clean, a race). Tied weights (two names, one tensor) are the same case."""
    traced = make_fx(WritesBufferThenReadsOnSide())(torch.zeros(4, 4))
    getters = [n for n in traced.graph.nodes if n.op == "get_attr"]
    assert len(getters) == 2 and len({n.target for n in getters}) == 1
    tied = copy.deepcopy(traced)
    tied.other = tied.get_buffer(getters[1].target)  # a second name for the same tensor
    next(n for n in tied.graph.nodes if n.name == getters[1].name).target = "other"
    tied.recompile()
    for gm in (traced, tied):
        hazards = sp.verify(gm).hazards
        assert any(h.kind == "raw" and "mul_" in h.nodes and "add" in h.nodes for h in hazards), hazards
        x = torch.randn(4, 4)
        expected = copy.deepcopy(gm)(x)
        assert sp.run(gm).ok and sp.verify(gm).ok
        torch.testing.assert_close(gm(x), expected)


def _side_stream_graph():
    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + 1

    return f, make_fx(f)(torch.ones(3))


@pytest.fixture
def stale_dynamo_table():
    """dynamo's object table as a compiled call on CPU leaves it: real CPU streams at the low
    indices (which cannot record events), still alive."""
    from torch._dynamo import graph_bytecode_inputs as table

    objects = [torch.Stream("cpu"), torch.Stream("cpu"), torch.Event("cpu")]
    table.store_user_object_weakrefs(*objects)
    yield objects
    table.reset_user_object_tracking()


def _two_branches(x, w):
    with sp.stream(1):
        a = torch.relu(x @ w)
    with sp.stream(2):
        b = torch.sigmoid(x * 2)
    return a + b + x


@pytest.mark.parametrize("call", ["gm(x)", "gm.forward(x)"])
def test_threads_calling_one_rewritten_graph_at_once_never_share_an_event(monkeypatch, call):
    """A server calls one graph from several request threads, each on a stream of its own.
    ``gm(x)`` binds the graph's table (its own streams and events); ``gm.forward(x)`` bypasses
    that and goes through ``runtime.lookup``'s fallback, as inductor's generated GPU code does
    for the events streampass allocates. An event shared between threads would let a wait in one
    thread see another thread's record, not its own producer's: each thread must record and wait
    on events of its own."""
    users: dict[int, set[int]] = collections.defaultdict(set)  # id(event) -> threads using it
    alive = []  # every event seen, so that no id is reused by a later thread's event

    def spy(op, event_is_self: bool):
        def used(self, other=None):
            event = self if event_is_self else other
            alive.append(event)
            users[id(event)].add(threading.get_ident())
            return op(self, other)

        return used

    from torch._dynamo import graph_bytecode_inputs as table

    # gm.forward looks in dynamo's table first: empty it of what earlier compiles in this process
    # left (on torch 2.11 a real CPU stream there cannot record a NoOpEvent)
    monkeypatch.setattr(table, "index_to_external_object_weakref", type(table.index_to_external_object_weakref)())
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(_two_branches)(x, w)
    assert sp.run(gm).ok
    # torch 2.12 on calls event.record(stream) / event.wait(stream); 2.11 stream.record_event(event)
    for cls, name in [(runtime.NoOpEvent, "record"), (runtime.NoOpEvent, "wait")]:
        monkeypatch.setattr(cls, name, spy(getattr(cls, name), event_is_self=True))
    for cls, name in [(runtime.NoOpStream, "record_event"), (runtime.NoOpStream, "wait_event")]:
        monkeypatch.setattr(cls, name, spy(getattr(cls, name), event_is_self=False))
    fn = gm if call == "gm(x)" else gm.forward
    start, failures, want = threading.Barrier(4), [], _two_branches(x, w)

    def request():
        try:
            start.wait()
            for _ in range(20):
                torch.testing.assert_close(fn(x, w), want)
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(users) >= 4 * 2, "some thread recorded no event"
    assert all(len(threads) == 1 for threads in users.values()), "threads shared an event"


def test_a_run_and_called_graph_can_be_copied_and_pickled(stale_dynamo_table):
    f, gm = _side_stream_graph()
    sp.run(gm)
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), f(x))
    twin = copy.deepcopy(gm)
    torch.testing.assert_close(twin(x), f(x))
    # the copy binds a table of its own, as the original does
    assert runtime.table_of(twin) is not None
    assert runtime.table_of(twin) is not runtime.table_of(gm)
    buf = io.BytesIO()
    torch.save(gm, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(x), f(x))
    assert runtime.table_of(loaded) is not None  # it bound a table of its own too
    # unpickling re-traces the code: every sync must come back (none run at trace time)
    assert _sync_args(loaded) == _sync_args(gm) and sp.verify(loaded).ok
    twice = torch.load(io.BytesIO(_saved(loaded)), weights_only=False)
    torch.testing.assert_close(twice(x), f(x))


def _sync_args(gm) -> list:
    return sorted((c.name, c.args) for c in sp.read_streams(gm).syncs.values())


def _saved(module) -> bytes:
    buf = io.BytesIO()
    torch.save(module, buf)
    return buf.getvalue()


def _streams_in_order(gm) -> list[tuple[str, int]]:
    a = sp.read_streams(gm)
    return [(str(n.target), a.stream.get(n, 0)) for n in gm.graph.nodes if n.op == "call_function"]


def test_a_loaded_graph_keeps_its_streams_and_a_second_run_adds_nothing():
    """Unpickling rebuilds a graph from its code, without ``meta``: its calls must come back on
    their streams (they came back on the ambient one: one stream on CUDA, and a second run planned
    for that), and streampass's own waits must still be told from the program's, whose later
    reads of inputs a run orders after them (else the second run threads ``x.cos()`` through the
    wait the first one added)."""

    def f(x, w):
        with sp.stream(1):
            a = (x @ w).relu()
        return x.sin() + a, x.cos()

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w)
    assert sp.run(gm).ok
    loaded = torch.load(io.BytesIO(_saved(gm)), weights_only=False)
    assert _streams_in_order(loaded) == _streams_in_order(gm)
    assert ("aten.mm.default", 1) in _streams_in_order(loaded)
    before = loaded.code
    assert sp.run(loaded).ok
    assert loaded.code == before
    torch.testing.assert_close(loaded(x, w), f(x, w))
    twice = torch.load(io.BytesIO(_saved(loaded)), weights_only=False)
    assert _streams_in_order(twice) == _streams_in_order(gm)


def _threaded(gm) -> set[str]:
    """Names of the values streampass's syncs pass through."""
    return {
        a.name for n in gm.graph.nodes if ops.added_by_streampass(n) for a in n.args[3:] if isinstance(a, torch.fx.Node)
    }


def test_sizes_computed_on_a_side_stream_are_no_tensors_once_the_metadata_is_gone():
    """A side stream's ``a.shape[0] * 2`` is a SymInt, not a kernel's output. A loaded graph has no
    ``meta["val"]`` to say so: it was read as a tensor of stream 1, verify reported a race and a
    second run added a record and a wait and threaded the SymInt through it (found by review). A
    ``symbolic_trace`` graph never has the metadata: its ``x.shape[0]`` and ``x.size(0)`` too."""

    def f(x, y):
        with sp.stream(1):
            a = x.sin()
            n = a.shape[0] * 2
        return y.new_zeros(n) + a.repeat(2)

    x, y = torch.randn(4), torch.randn(8)
    gm = make_fx(f, tracing_mode="symbolic")(x, y)
    assert sp.run(gm).ok
    loaded = torch.load(io.BytesIO(_saved(copy.deepcopy(gm))), weights_only=False)  # torch cannot save it as is
    assert sp.verify(loaded).ok
    before = loaded.code
    again = sp.run(loaded)
    assert (again.records_added, again.waits_added) == (0, 0) and loaded.code == before
    torch.testing.assert_close(loaded(x, y), f(x, y))

    class Sizes(torch.nn.Module):
        def forward(self, x, y):
            a = x.sin()
            return y.new_zeros(a.shape[0] * 2) + a.repeat(2), a.size(0) + 1

    traced = torch.fx.symbolic_trace(Sizes())
    sizes = {"getattr_1", "getitem", "mul", "size", "add_1"}
    for n in traced.graph.nodes:
        if n.name in {"sin", *sizes}:
            n.meta["custom"] = {"stream": 1}
    assert sp.run(traced).ok
    assert "sin" in _threaded(traced) and not sizes & _threaded(traced)
    assert traced(x, y)[1] == 5


class ScalesOnSide(torch.nn.Module):
    def __init__(self, only_weight: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))
        self.only_weight = only_weight

    def forward(self, x):
        with sp.stream(1):
            y = self.w.sin() if self.only_weight else x * self.w
        return y + x


@pytest.mark.parametrize("only_weight", [False, True], ids=["input-and-weight", "weight-only"])
def test_syncs_around_module_tensors_survive_pickling(only_weight):
    """make_fx's tensor attributes are plain tensors when unpickling re-traces the code, not
    graph values: a sync whose arguments were attributes only (the entry record ordered after
    the weight; a wait threading the weight to stream 1) ran at trace time and vanished, and
    the loaded module waited on an event nothing recorded."""
    model = ScalesOnSide(only_weight)
    x = torch.randn(4, 4)
    gm = make_fx(model)(x)
    assert sp.run(gm).ok
    loaded = torch.load(io.BytesIO(_saved(gm)), weights_only=False)
    assert _sync_args(loaded) == _sync_args(gm) and sp.verify(loaded).ok
    torch.testing.assert_close(loaded(x), model(x))


def test_syncs_on_values_made_from_module_tensors_only_survive_pickling():
    """The record after the buffer's mul_ depends on the mul_ and the buffer, neither of which
    depends on an input: a re-trace computed both, and the record, at trace time, and the loaded
    module waited on an event nothing recorded. (That the mul_ itself then runs once, at load,
    is FX's re-trace, with or without streampass.)"""
    gm = make_fx(WritesBufferThenReadsOnSide())(torch.zeros(4, 4))
    assert sp.run(gm).ok
    loaded = torch.load(io.BytesIO(_saved(gm)), weights_only=False)
    assert _sync_args(loaded) == _sync_args(gm) and sp.verify(loaded).ok


def test_a_rewritten_graph_traced_again_runs_again():
    """symbolic_trace of a run result (or of its to_folder code) reads each sync body once per
    use: one get_attr per sync. run dropped a body's submodule when one of them fell unused,
    while the others still named it (internal error, graph restored)."""

    def f(x, w):
        with sp.stream(1):
            a = (x @ w).relu()
        return a + x.sin()

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w)
    assert sp.run(gm).ok
    traced = torch.fx.symbolic_trace(gm)
    getters = [n.target for n in traced.graph.nodes if n.op == "get_attr"]
    assert len(getters) > len(set(getters))  # a body named by several get_attrs
    assert sp.run(traced).ok and not sp.run(traced).changed
    torch.testing.assert_close(traced(x, w), f(x, w))


@pytest.mark.parametrize("index", [MAX_INDEX + 1, 2**80])
def test_stream_index_beyond_int64_is_refused(index):
    _, gm = _side_stream_graph()
    next(n for n in gm.graph.nodes if n.op == "call_function").meta["custom"] = {"stream": index}
    code = gm.code
    with pytest.raises(sp.StreamPassError, match="int64"):
        sp.run(gm)
    assert gm.code == code


def test_event_indices_never_leave_int64():
    _, gm = _side_stream_graph()
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["custom"] = {"stream": MAX_INDEX}  # a legal stream index that leaves no room for events
    code = gm.code
    with pytest.raises(sp.StreamPassError, match="new event index"):
        sp.run(gm)
    assert gm.code == code


def test_an_event_index_that_leaves_no_room_is_named_by_its_node():
    """The refusal names the node holding the largest index: here a user's record_event (it
    named the node on the largest stream, which had nothing to do with it)."""
    _, gm = _side_stream_graph()
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_after(first):
        gm.graph.call_function(ops.RECORD_EVENT, (MAX_INDEX, 0), name="user_record")
    gm.recompile()
    with pytest.raises(sp.StreamPassError, match="new event index") as info:
        sp.run(gm)
    assert info.value.node == "user_record"


def test_use_before_definition_is_refused_and_graph_unchanged():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.sin.default, (x,))
    b = g.call_function(aten.cos.default, (a,))
    b.meta["custom"] = {"stream": 1}
    g.output((b,))
    b.append(a)  # now b reads a before a is defined
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    order = [n.name for n in gm.graph.nodes]
    with pytest.raises(sp.StreamPassError, match="before it is defined") as info:
        sp.run(gm)
    assert "'cos_default'" in str(info.value) and "'sin_default'" in str(info.value)
    assert [n.name for n in gm.graph.nodes] == order


def _meta(node, val):
    node.meta["val"] = val
    return node


def test_syncs_with_keyword_arguments_are_read_through_the_schema():
    g = torch.fx.Graph()
    v = torch.empty(3)
    x = _meta(g.placeholder("x"), v)
    a = _meta(g.call_function(aten.sin.default, (x,)), v)
    a.meta["custom"] = {"stream": 1}
    g.call_function(ops.RECORD_EVENT, (), {"event_index": 5, "stream_index": 1})
    g.call_function(ops.WAIT_EVENT, (), {"event_index": 5, "stream_index": 0})
    b = _meta(g.call_function(aten.cos.default, (a,)), v)
    g.output((b,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert not any(h.kind == "raw" for h in sp.verify(gm).hazards)  # the user's wait is seen
    result = sp.run(gm)
    assert result.ok and not sp.run(gm).changed
    xs = torch.randn(3)
    torch.testing.assert_close(gm(xs)[0], xs.sin().cos())


def test_single_stream_graph_with_a_user_record_runs_after_run():
    g = torch.fx.Graph()
    v = torch.empty(3)
    x = _meta(g.placeholder("x"), v)
    a = _meta(g.call_function(aten.sin.default, (x,)), v)
    g.call_function(ops.RECORD_EVENT, (5, 0))
    g.output((a,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert sp.run(gm).ok
    xs = torch.randn(3)
    torch.testing.assert_close(gm(xs)[0], xs.sin())


# --------------------------------------------------------------------------------------------
# Multi-output ops and views launch nothing (items 2 and 3)
# --------------------------------------------------------------------------------------------
def _layer_norm(x, w, b):
    with sp.stream(1):
        y, _mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-5)
    return y + 1, rstd


def _max_pool(x):
    with sp.stream(1):
        out, idx = aten.max_pool2d_with_indices(x, [2, 2])
    return out * 2, idx


MULTI_OUTPUT = {
    "native_layer_norm": (_layer_norm, lambda: (torch.randn(4, 8), torch.randn(8), torch.randn(8))),
    "max_pool2d_with_indices": (_max_pool, lambda: (torch.randn(1, 2, 4, 4),)),
}


@pytest.mark.parametrize("name", MULTI_OUTPUT)
def test_moving_a_getitem_of_a_multi_output_op_is_a_legal_reorder(name):
    fn, make = MULTI_OUTPUT[name]
    args = make()
    gm = make_fx(fn)(*args)
    assert sp.run(gm).ok
    op = next(n for n in gm.graph.nodes if getattr(n.target, "_opname", None) == name)
    order = list(gm.graph.nodes)
    moved = False
    getitems = [u for u in op.users if u.target is operator.getitem and u.users]
    for item in getitems:  # each used getitem moves later, to just before its first user
        first_user = min(item.users, key=order.index)
        between = order[order.index(item) + 1 : order.index(first_user)]
        moved |= any(ops.as_sync_call(n) is not None for n in between)  # past a sync
        first_user.prepend(item)
        order = list(gm.graph.nodes)
    assert moved
    gm.graph.lint()
    gm.recompile()
    assert sp.verify(gm).ok, sp.verify(gm)
    again = sp.run(gm)
    assert again.ok and again.records_added == again.waits_added == 0
    for got, want in zip(gm(*args), fn(*args)):
        torch.testing.assert_close(got, want)


def test_hazards_name_kernels_not_views():
    def f(x, w):
        with sp.stream(1):
            y = x @ w.t()
        return y.detach() + 1

    gm = make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))
    report = sp.verify(gm)
    involved = {name for h in report.hazards for name in h.nodes}
    assert "mm" in involved and "add" in involved
    assert not involved & {"t", "detach"}, report
    # the kernel that reads w through the view is the one that must wait for it
    assert any(h.kind == "entry" and h.nodes == ("w_1", "mm") for h in report.hazards)


# --------------------------------------------------------------------------------------------
# CUDA-graph capture (issue 12, item 9): nothing on a side stream after its last join
# --------------------------------------------------------------------------------------------
def _traced_models():
    from functorch.compile import aot_function, make_boxed_func

    from streampass.aot_guard import cpu_safe_aot
    from streampass.commands import trace_demo

    demo, _ = trace_demo(batch=4, dim=8)
    yield "demo", demo
    yield "module", make_fx(WithBuffer())(torch.randn(2, 4))
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm)

    def block(x, w1, w2):
        with sp.stream(1):
            a = torch.tanh(x @ w1)
        with sp.stream(2):
            b = torch.sigmoid(x @ w2)
        return (a * b).sum()

    with cpu_safe_aot():
        aot_function(block, fw_compiler=keep, bw_compiler=keep)(
            *[torch.randn(4, 4, requires_grad=True) for _ in range(3)]
        ).backward()
    yield "training forward", graphs[0]
    yield "training backward", graphs[1]


def test_every_traced_model_run_returns_is_capturable():
    from streampass.analysis.capture import unjoined

    seen = 0
    for name, gm in _traced_models():
        assert unjoined(gm), f"{name}: a side stream is un-joined before the run"
        result = sp.run(gm)
        assert result.ok, (name, result.after)
        assert unjoined(gm) == [], name
        # the free points are still there (memory safety) and come before the last joins
        keep = [
            n
            for n in gm.graph.nodes
            if (c := ops.as_sync_call(n)) is not None
            and c.wrapper is not None
            and len(c.wrapper.args) > 2 + len(c.args)
        ]
        assert keep, f"{name}: no wait holds a value alive"
        assert not sp.run(gm).changed, name
        seen += 1
    assert seen == 4


def test_a_side_stream_wait_left_last_by_the_user_is_joined():
    """A graph handed over with a wait as a side stream's last op: verify names it (a capture
    would end with the stream un-joined) and run adds the join."""
    from streampass.analysis.capture import unjoined

    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + 1

    gm = make_fx(f)(torch.ones(3))
    sp.run(gm)
    g = gm.graph
    out = next(n for n in g.nodes if n.op == "output")
    with g.inserting_before(out):
        late = g.call_function(ops.WAIT_EVENT, (EVENT_BASE + 99, 1))
        late.meta["custom"] = {"stream": 1}
    gm.recompile()
    assert unjoined(gm, external_events=[EVENT_BASE + 99]) == [late.name]
    report = sp.verify(gm, external_events=[EVENT_BASE + 99])
    assert [h.kind for h in report.hazards] == ["exit"] and "CUDA-graph capture" in report.hazards[0].message
    result = sp.run(gm, external_events=[EVENT_BASE + 99])
    assert result.ok and result.waits_added == 1 and unjoined(gm, external_events=[EVENT_BASE + 99]) == []


def _malformed(kind: str) -> torch.fx.GraphModule:
    """A small graph (sin on stream 1, read on the ambient stream) made malformed as ``kind`` says."""
    g = torch.fx.Graph()
    root = torch.nn.Module()
    x = g.placeholder("x")
    y = g.call_function(aten.sin.default, (x,), name="y")
    y.meta["custom"] = {"stream": 1}
    if kind in ("stream op arguments", "stream op keyword", "stream op extra"):
        # synchronize_device() with no arguments was the first found; torch 2.11 has no such op
        args, kwargs = {
            "stream op arguments": ((5,), {}),
            "stream op keyword": ((), {"event_index": 5, "stream_index": 1, "bogus": 1}),
            "stream op extra": ((5, 1, 7), {}),
        }[kind]
        g.call_function(ops.RECORD_EVENT, args, kwargs, name="bad")
    elif kind == "sync_dealloc of an int":
        g.call_function(ops.RECORD_EVENT, (5, 1))
        g.call_function(ops.SYNC_DEALLOC, (5, 1, 3), name="bad")
    elif kind.startswith("control_deps"):
        body = torch.fx.Graph()
        v = body.placeholder("v")
        body.output((body.call_function(aten.add_.Tensor, (v, 1)),))
        root.add_module("body", torch.fx.GraphModule(torch.nn.Module(), body))
        sub = g.get_attr("body")
        args = {"control_deps of work": ((y,), sub, x), "control_deps without a tuple": (y, sub, x)}[kind]
        g.call_function(ops.CONTROL_DEPS, args, name="bad")
    elif kind == "custom not a dict":
        g.call_function(aten.cos.default, (x,), name="bad").meta["custom"] = "stream1"
    z = g.call_function(aten.neg.default, (y,), name="z")
    if kind != "no output":
        g.output((z,))
    gm = torch.fx.GraphModule(root, g)
    if kind == "get_attr of nothing":  # GraphModule copies what get_attrs name: add it after
        with gm.graph.inserting_before(z):
            missing = gm.graph.create_node("get_attr", "nothing", name="bad")
            z.args = (gm.graph.call_function(aten.add.Tensor, (y, missing)),)
        gm.recompile()
    return gm


@pytest.mark.parametrize(
    "kind, message",
    [
        ("stream op arguments", "misses argument 'stream_index'"),
        ("stream op keyword", "has no argument 'bogus'"),
        ("stream op extra", "takes 2 arguments, got 3"),
        ("sync_dealloc of an int", "'to_dealloc' must be a tensor"),
        ("control_deps of work", "control_deps runs aten.add_.Tensor"),
        ("control_deps without a tuple", "dependencies must be a tuple"),
        ("no output", "no output node"),
        ("get_attr of nothing", "get_attr of 'nothing', which the graph's module does not have"),
        ("custom not a dict", 'meta\\["custom"\\] is a str: annotations are a dict'),
    ],
)
def test_malformed_graphs_are_refused_naming_the_node_and_left_unchanged(kind, message):
    """Stream ops whose arguments do not fit their schema, ``control_deps`` that wraps work (its
    reads and writes would go unseen) or is malformed, a graph with no output, a get_attr of an
    attribute the module lacks (the call fails), an annotation that is not a dict (run failed with an
    internal error naming no node): a StreamPassError naming the node, from ``verify`` and ``run``, and the graph as it was (before,
    each was accepted and failed when called, crashed, or missed a race)."""
    gm = _malformed(kind)
    code, nodes = gm.code, [(n.name, n.target, n.args, n.kwargs) for n in gm.graph.nodes]
    for check in (sp.verify, sp.run):
        with pytest.raises(sp.StreamPassError, match=message) as info:
            check(gm)
        assert info.value.node == ("z" if kind == "no output" else "bad")
        assert gm.code == code and [(n.name, n.target, n.args, n.kwargs) for n in gm.graph.nodes] == nodes


def test_a_refused_run_keeps_the_code_a_graph_was_not_yet_recompiled_to():
    """A pipeline may edit a graph and recompile later: a run that refuses the edited graph puts
    back the module's code as it was, not code regenerated from the graph."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(aten.sin.default, (x,))
    y.meta["custom"] = {"stream": 1}
    z = g.call_function(aten.neg.default, (y,))
    g.output((z,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    with gm.graph.inserting_before(z):
        gm.graph.call_function(ops.JOIN, (1, 0))  # a join with no fork, not yet in the code
    code, forward, x = gm.code, type(gm).forward, torch.randn(3)
    with pytest.raises(sp.StreamPassError, match="without a matching fork"):
        sp.run(gm)
    assert gm.code == code and type(gm).forward is forward
    torch.testing.assert_close(gm(x), (-x.sin(),))


@pytest.mark.parametrize("events", [5, "5", 1.5])
def test_external_events_that_are_not_a_list_of_indices_are_refused(events):
    gm = make_fx(WithParam())(torch.randn(2, 4))
    for check in (sp.verify, sp.run, sp.read_streams):
        with pytest.raises(sp.StreamPassError, match="external_events must be an iterable"):
            check(gm, external_events=events)
    assert sp.run(gm, external_events=None).ok  # None: no external event


def test_work_after_the_output_never_runs_and_is_read_as_nothing():
    """FX's code returns at the output: a node a sort left after it is dead code. It read a value
    of another stream, and run edited the graph and still called it not race-free."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(aten.sin.default, (x,))
    y.meta["custom"] = {"stream": 1}
    out = g.output((g.call_function(aten.neg.default, (y,)),))
    with g.inserting_after(out):
        dead = g.call_function(aten.cos.default, (y,))
    dead.meta["custom"] = {"stream": 2}
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    a = sp.read_streams(gm)
    assert dead not in a.compute and 2 not in a.streams
    result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok
    assert not any(dead.name in h.nodes for h in result.before.hazards)


# -- symbolic_trace graphs: tensor methods and submodules are calls too --------------------------


class MethodAndModule(torch.nn.Module):
    """``x.sin()`` is a ``call_method``, ``self.lin(x)`` a ``call_module`` in symbolic_trace's graph."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = x.sin()
        z = self.lin(x)
        return y * 2 + z


def _traced_on_side(fork_join: bool) -> torch.fx.GraphModule:
    """MethodAndModule with its sin and lin on stream 1: in a fork/join region, or annotated."""
    gm = torch.fx.symbolic_trace(MethodAndModule())
    g = gm.graph
    sin = g.find_nodes(op="call_method", target="sin")[0]
    lin = g.find_nodes(op="call_module", target="lin")[0]
    if fork_join:
        with g.inserting_before(sin):
            g.call_function(ops.FORK, (0, 1))
        with g.inserting_after(lin):
            g.call_function(ops.JOIN, (1, 0))
    else:
        sin.meta["custom"] = lin.meta["custom"] = {"stream": 1}
    gm.recompile()
    return gm


def _side_names(gm) -> set[str]:
    a = sp.read_streams(gm)
    return {n.name for n in a.compute if a.stream[n] == 1 and n not in a.syncs}


def test_methods_and_modules_in_a_fork_region_keep_their_stream():
    """run drops fork/join and annotates each node with its stream: a method or submodule call
    lost it (it ran on the ambient stream after run, and verify agreed with that)."""
    gm = _traced_on_side(fork_join=True)
    assert _side_names(gm) == {"sin", "lin"}
    x = torch.randn(2, 4)
    want = MethodAndModule.forward(gm, x)  # the program, without the fork/join ops
    assert sp.run(gm).ok
    assert _side_names(gm) == {"sin", "lin"}
    assert not gm.graph.find_nodes(op="call_function", target=ops.FORK)
    assert sp.verify(gm).ok and not sp.run(gm).changed
    torch.testing.assert_close(gm(x), want)


@pytest.mark.parametrize("fork_join", [False, True])
def test_values_made_by_methods_and_modules_are_freed_safely(fork_join):
    """A value a method or submodule call made on stream 1 and read on the ambient stream must
    not return to stream 1's pool before that read: verify missed the hazard (only aten calls
    counted as allocations) and run deferred no free."""
    gm = _traced_on_side(fork_join)
    dealloc = {h.nodes[0] for h in sp.verify(gm).hazards if h.kind == "dealloc"}
    assert dealloc == {"sin", "lin"}
    assert sp.run(gm).ok
    assert sp.verify(gm).ok


class SharedState(torch.nn.Module):
    """A weight read inside ``self.lin(x)`` and written in place on another stream; one
    batch norm, training, called on two streams (both update its running statistics)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.lin(x)
        self.lin.weight.mul_(0.5)
        return y, self.bn(x), self.bn(x * 2)


def _shared_state_graph() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(SharedState())
    lin = gm.graph.find_nodes(op="call_module", target="lin")[0]
    bn, bn_1 = gm.graph.find_nodes(op="call_module", target="bn")
    lin.meta["custom"], bn.meta["custom"], bn_1.meta["custom"] = {"stream": 1}, {"stream": 2}, {"stream": 3}
    gm.recompile()
    return gm


def _state(gm) -> list[torch.Tensor]:
    return [t.detach().clone() for t in (*gm.parameters(), *gm.buffers())]


def test_a_submodule_call_reads_its_parameters_and_writes_its_buffers():
    """symbolic_trace keeps ``self.lin(x)`` as one call_module: the parameters and buffers it
    uses are no arguments, and were never read. The ambient stream's in-place write of the
    weight did not wait for lin on stream 1, and the two batch norm calls on streams 2 and 3
    both updated the running statistics with no order; verify agreed."""
    gm = _shared_state_graph()
    before = {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}
    assert {("war", "mul_"), ("waw", "bn_1"), ("entry", "bn")} <= before
    assert any("bn_running_mean" in h.message for h in sp.verify(gm).hazards if h.kind == "waw")
    x = torch.randn(3, 4)
    reference = copy.deepcopy(gm)
    with torch.no_grad():  # the weight is written in place
        want = reference(x), _state(reference)
    assert sp.run(gm).ok
    assert sp.verify(gm).ok and not sp.run(gm).changed
    for seed in range(8):  # every legal order of the result is race-free and computes the same
        moved = random_topological_copy(copy.deepcopy(gm), seed)
        assert sp.verify(moved).ok, (seed, sp.verify(moved))
        with torch.no_grad():
            got = moved(x), _state(moved)
        torch.testing.assert_close(got, want)


class TwoCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x), self.lin(x.cos())


def test_two_calls_of_a_shared_module_that_only_read_need_no_order():
    """One Linear called on streams 1 and 2: both only read its weight, so neither waits for the other."""
    gm = torch.fx.symbolic_trace(TwoCalls())
    a, b = gm.graph.find_nodes(op="call_module", target="lin")
    a.meta["custom"], b.meta["custom"] = {"stream": 1}, {"stream": 2}
    reqs, _ = requirements(sp.read_streams(gm))
    assert {(r.kind, r.before.name) for r in reqs if r.after is b} == {("raw", "cos"), ("entry", "x")}
    assert not [r for r in reqs if {r.before, r.after} == {a, b}]
    assert sp.run(gm).ok


class FromFactory(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.ones(3, 4)) + x


def test_a_submodule_reading_nothing_from_the_ambient_stream_still_waits_for_its_weights():
    """lin on stream 1 reads only a tensor made there, but its weights are inputs, ready on
    the ambient stream at entry (an optimizer step may still be writing them)."""
    gm = torch.fx.symbolic_trace(FromFactory())
    for n in gm.graph.nodes:
        if n.op in ("call_module", "call_function") and n.target in ("lin", torch.ones):
            n.meta["custom"] = {"stream": 1}
    entry = [h.message for h in sp.verify(gm).hazards if h.kind == "entry"]
    assert any("lin uses graph input lin_weight" in m.replace(" on stream 1", "") for m in entry), entry
    x = torch.randn(3, 4)
    want = gm(x)
    assert sp.run(gm).ok
    torch.testing.assert_close(gm(x), want)


class Counter(torch.nn.Module):
    """Counts its calls in a buffer, evaluating too (as a KV cache writes its cache)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x * self.calls


class CountedTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.counter = Counter()

    def forward(self, x):
        seen = x * self.counter.calls  # read before the call writes it
        return self.counter(x), seen


class LeafTracer(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, Counter) or super().is_leaf_module(m, qualname)


def test_a_custom_leaf_module_writes_its_buffers_evaluating_too():
    """A leaf module of the user's own (a custom tracer keeps ``self.counter(x)`` as one
    call_module) may write its buffers whatever its training flag: it was judged as torch's
    own modules are (evaluating: read only), so the ambient stream's read of ``calls`` and
    the call writing it on stream 1 got no order; verify agreed. Only torch.nn's modules are
    known to write nothing while evaluating."""
    root = CountedTwice().eval()
    gm = torch.fx.GraphModule(root, LeafTracer().trace(root))
    gm.graph.find_nodes(op="call_module", target="counter")[0].meta["custom"] = {"stream": 1}
    gm.recompile()
    assert ("war", "counter") in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}
    x = torch.randn(4)
    want = copy.deepcopy(gm)(x)
    assert sp.run(gm).ok and sp.verify(gm).ok
    for seed in range(6):
        moved = random_topological_copy(copy.deepcopy(gm), seed)
        assert sp.verify(moved).ok, (seed, sp.verify(moved))
        torch.testing.assert_close(moved(x), want)


def _calling(inner_graph: torch.fx.Graph, inner_root: torch.nn.Module, n_calls: int) -> torch.fx.GraphModule:
    """A graph that calls ``GraphModule(inner_root, inner_graph)`` (as ``split_module`` makes) on
    ``n_calls`` inputs, returning the results and the submodule's tensor ``t`` times three."""
    root = torch.nn.Module()
    root.sub = torch.fx.GraphModule(inner_root, inner_graph)
    g = torch.fx.Graph()
    calls = [g.call_module("sub", (g.placeholder(f"a{i}"),)) for i in range(n_calls)]
    g.output((*calls, g.call_function(torch.mul, (g.get_attr("sub.t"), 3.0))))
    return torch.fx.GraphModule(root, g)


def test_a_graph_module_submodule_says_what_it_writes():
    """A GraphModule submodule writes the tensor its graph writes in place, in eval mode too (it
    was judged by its training flag: read, and the ambient stream's read of it got no wait),
    and only reads the tensors its graph only reads (two calls of it on two streams got a false
    waw on its parameter, and a wait between them)."""
    inner_root = torch.nn.Module()
    inner_root.register_buffer("t", torch.zeros(4))
    ig = torch.fx.Graph()
    x = ig.placeholder("x")
    ig.call_method("add_", (ig.get_attr("t"), 1.0))
    ig.output(ig.call_function(torch.mul, (x, 2.0)))
    gm = _calling(ig, inner_root, 1).eval()
    gm.graph.find_nodes(op="call_module")[0].meta["custom"] = {"stream": 1}
    assert ("raw", "mul") in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}

    inner_root = torch.nn.Module()
    inner_root.t = torch.nn.Parameter(torch.ones(4))
    ig = torch.fx.Graph()
    ig.output(ig.call_function(torch.mul, (ig.placeholder("x"), ig.get_attr("t"))))
    gm = _calling(ig, inner_root, 2)  # training
    gm.graph.find_nodes(op="call_module")[1].meta["custom"] = {"stream": 1}
    assert not [h for h in sp.verify(gm).hazards if h.kind in ("waw", "war", "raw")]


def test_a_graph_module_submodule_returning_its_input_returns_an_alias_of_it():
    """``sub`` adds to its input in place and returns it (``split_module`` returns what a part's
    in-place op made): its result is the caller's ``x``, so writing the result on the ambient
    stream writes ``x``, which ``x.sin()`` on stream 2 reads. The result was read as a tensor of
    its own: no war, and verify agreed. Called with ``a=x``, its write of ``x`` was missed too."""
    for returned in ("alone", "in a tuple", "by keyword"):
        ig = torch.fx.Graph()
        added = ig.call_method("add_", (ig.placeholder("a"), 1.0))
        ig.output((ig.call_function(torch.mul, (added, 2.0)), added) if returned == "in a tuple" else added)
        root = torch.nn.Module()
        root.sub = torch.fx.GraphModule(torch.nn.Module(), ig)
        g = torch.fx.Graph()
        x = g.placeholder("x")
        y = g.call_module("sub", (), {"a": x}) if returned == "by keyword" else g.call_module("sub", (x,))
        if returned == "in a tuple":
            y = g.call_function(operator.getitem, (y, 1))
        r = g.call_method("sin", (x,))
        w = g.call_method("mul_", (y, 2.0))
        g.output((r, w))
        gm = torch.fx.GraphModule(root, g)
        gm.graph.find_nodes(op="call_module")[0].meta["custom"] = {"stream": 1}
        r.meta["custom"] = {"stream": 2}
        gm.recompile()
        assert ("war", "mul_") in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}, returned
        want = copy.deepcopy(gm)(torch.ones(3))
        assert sp.run(gm).ok and sp.verify(gm).ok
        for seed in range(6):
            moved = random_topological_copy(copy.deepcopy(gm), seed)
            assert sp.verify(moved).ok, (returned, seed, sp.verify(moved))
            torch.testing.assert_close(moved(torch.ones(3)), want)


class IndexAfterARead(torch.nn.Module):
    def forward(self, x):
        with sp.stream(2):
            z = x * 1
            w = x[0] + 1  # a getitem of x, re-pointed at the entry wait's passthrough of x
        return z + w


class IndexOfAView(torch.nn.Module):
    def forward(self, x):
        with sp.stream(2):
            v = x.view(-1).view(4, 4)  # symbolic_trace: call_method view
            y = x.mul_(0.9)
        torch.relu_(y * 1.0)
        with sp.stream(1):
            row = v[1]  # a getitem of a view, re-pointed at a wait's passthrough of it
        return row * 2


def test_a_getitem_of_a_value_the_edit_passes_through_a_sync_is_read_as_before():
    """symbolic_trace's ``x[0]`` is a getitem: after the edit its source was the wait's
    passthrough, which was not seen as the tensor it passes, so the check of the edit took
    the view for a value of its own and ``run`` refused a legal graph ("internal error:
    getitem reads storage x, not getitem"); found by the standalone probe (5 of 1,200
    random symbolic_trace programs). A getitem of a view was read as a chunk of a list of
    views only while its source was the view itself, not a passthrough of it."""
    for module in (IndexAfterARead(), IndexOfAView()):
        gm = torch.fx.symbolic_trace(module)
        x = torch.randn(4, 4)
        want = copy.deepcopy(gm)(x.clone())
        assert sp.run(gm).ok and sp.verify(gm).ok
        assert not sp.run(gm).changed
        torch.testing.assert_close(gm(x.clone()), want)
        for seed in range(6):
            moved = random_topological_copy(copy.deepcopy(gm), seed)
            assert sp.verify(moved).ok, (type(module).__name__, seed, sp.verify(moved))
            torch.testing.assert_close(moved(x.clone()), want)


class DataWrite(torch.nn.Module):  # weight clipping, as written: through ``.data``
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        self.lin.weight.data.clamp_(-0.1, 0.1)
        return y


class KeywordInPlace(torch.nn.Module):  # the written tensor passed as ``input=``
    def __init__(self, functional: bool):
        super().__init__()
        self.relu = torch.relu_ if functional else torch.nn.ReLU(inplace=True)

    def forward(self, x):
        y = x * 2
        return y.sin(), self.relu(input=y)


class ReadThenModule(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        y = x * 2
        return y.sin(), self.m(y)


class ThroughModule(torch.nn.Module):  # a module whose result is its input or a view of it
    def __init__(self, m):
        super().__init__()
        self.m, self.relu = m, torch.nn.ReLU(inplace=True)

    def forward(self, x):
        y = x * 2
        z = self.m(y)
        return y.cos(), self.relu(z)


def _writes_input() -> torch.nn.Module:
    """A GraphModule (a ``split_module`` part) whose graph writes its input in place."""
    g = torch.fx.Graph()
    g.output(g.call_method("mul_", (g.placeholder("a"), 2)))
    return torch.fx.GraphModule(torch.nn.Module(), g)


class _GraphModulesAsLeaves(torch.fx.Tracer):
    """symbolic_trace's tracer, keeping a GraphModule submodule as one call (split_module's parts)."""

    def is_leaf_module(self, m, qualname):
        return isinstance(m, torch.fx.GraphModule) or super().is_leaf_module(m, qualname)


HIDDEN_WRITES = {  # program, (reader on stream 1, the later writer on the ambient stream)
    "w.data.clamp_": (DataWrite(), ("lin", "clamp_")),
    "ReLU(inplace)(input=y)": (KeywordInPlace(functional=False), ("sin", "relu")),
    "torch.relu_(input=y)": (KeywordInPlace(functional=True), ("sin", "relu_")),
    "nn.Identity": (ThroughModule(torch.nn.Identity()), ("cos", "relu")),
    "nn.Dropout, evaluating": (ThroughModule(torch.nn.Dropout().eval()), ("cos", "relu")),
    "nn.Flatten": (ThroughModule(torch.nn.Flatten(0)), ("cos", "relu")),
    "GraphModule writing its input": (ReadThenModule(_writes_input()), ("sin", "m")),
}


@pytest.mark.parametrize("name", HIDDEN_WRITES)
def test_writes_symbolic_trace_records_without_a_schema_are_writes(name):
    """A write ``symbolic_trace`` records with no schema to say so, after a read on stream 1: through
    ``w.data`` (a getattr), with the tensor as ``input=``, through a module that returns its input
    or a view of it, or in a GraphModule submodule's own graph. Each was read as no write of the
    tensor read: no war, no order, and verify agreed (found by the symbolic_trace probe)."""
    module, (reader, writer) = HIDDEN_WRITES[name]
    gm = torch.fx.GraphModule(module, _GraphModulesAsLeaves().trace(module))
    for n in gm.graph.nodes:
        if n.name == reader:
            n.meta["custom"] = {"stream": 1}
    assert ("war", writer) in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before(reader, writer)


def _bn_program(op: str, training: bool):
    """``(graph, its inputs)``: ``op`` updates running statistics on stream 1 (while
    ``training``), then the ambient stream reads ``running_mean``, as an export or make_fx graph
    of a training batch norm records it."""
    a = torch.ops.aten
    update = {  # x, rm, rv -> the op's call
        "aten.native_batch_norm": lambda x, rm, rv: a.native_batch_norm(x, None, None, rm, rv, training, 0.5, 1e-5)[0],
        "aten.batch_norm": lambda x, rm, rv: a.batch_norm(x, None, None, rm, rv, training, 0.5, 1e-5, False),
        "aten.instance_norm": lambda x, rm, rv: a.instance_norm(x, None, None, rm, rv, training, 0.5, 1e-5, False),
        "aten._batch_norm_impl_index": lambda x, rm, rv: a._batch_norm_impl_index(
            x, None, None, rm, rv, training, 0.5, 1e-5, False
        )[0],
    }[op]

    def f(x, rm, rv):
        with sp.stream(1):
            y = update(x, rm, rv)
        return y, rm * 1

    inputs = (torch.arange(12.0).reshape(2, 2, 3), torch.zeros(2), torch.ones(2))
    return make_fx(f)(*inputs), inputs


BATCH_NORMS = ["aten.native_batch_norm", "aten.batch_norm", "aten.instance_norm", "aten._batch_norm_impl_index"]


@pytest.mark.parametrize("op", BATCH_NORMS)
def test_a_training_batch_norm_writes_its_running_statistics(op):
    """aten's batch norms update ``running_mean`` and ``running_var`` while training, but their
    schemas carry no ``(a!)``: the update on stream 1 and the ambient stream's read of
    ``running_mean`` got no wait, verify agreed, and a legal reorder read the statistics before
    the update (found by review). Evaluating, the op only reads them: no order is needed."""
    gm, inputs = _bn_program(op, training=True)
    reader = next(n.name for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    writer = next(n.name for n in gm.graph.nodes if n.meta.get("custom"))
    assert ("raw", reader) in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}
    want = gm(*copy.deepcopy(inputs))
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before(writer, reader)
    for seed in range(4):
        moved = random_topological_copy(copy.deepcopy(gm), seed)
        assert sp.verify(moved).ok
        with runtime.bind(moved):
            torch.testing.assert_close(moved(*copy.deepcopy(inputs)), want)

    evaluating, _ = _bn_program(op, training=False)
    assert not any(h.kind == "raw" for h in sp.verify(evaluating).hazards)


class FunctionalBatchNorm(torch.nn.Module):
    """``F.batch_norm`` on the module's own statistics, as symbolic_trace records it: a call with
    no schema, the statistics as get_attrs."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))

    def forward(self, x):
        y = torch.nn.functional.batch_norm(x, self.rm, self.rv, training=self.training, momentum=0.5)
        return y, self.rm + x.sum()  # a proxy in the sum: traced, not folded to a constant


def test_a_traced_functional_batch_norm_writes_the_statistics_it_is_given():
    gm = torch.fx.symbolic_trace(FunctionalBatchNorm())
    bn = next(n for n in gm.graph.nodes if n.target is torch.nn.functional.batch_norm)
    bn.meta["custom"] = {"stream": 1}
    assert ("raw", "add") in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before(bn.name, "add")

    evaluating = torch.fx.symbolic_trace(FunctionalBatchNorm().eval())
    next(n for n in evaluating.graph.nodes if n.target is torch.nn.functional.batch_norm).meta["custom"] = {"stream": 1}
    assert not any(h.kind == "raw" for h in sp.verify(evaluating).hazards)


def test_an_exported_training_batch_norm_orders_reads_of_its_statistics():
    """torch.export's training IR keeps ``aten.batch_norm`` with the module's buffers as inputs."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)

        def forward(self, x):
            with sp.stream(1):
                y = self.bn(x)
            return y, self.bn.running_mean + 0

    gm = torch.export.export(M().train(), (torch.randn(3, 4),)).module()
    bn = next(n for n in gm.graph.nodes if n.meta.get("custom", {}).get("stream") == 1 and "batch_norm" in n.name)
    read = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert ("raw", read.name) in {(h.kind, h.nodes[1]) for h in sp.verify(gm).hazards}
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before(bn.name, read.name)

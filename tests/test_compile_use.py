"""torch.compile as users run it: user syncs, backward after the block, torch's caches on
(the ``fresh_caches`` fixture: a cache directory per test)."""

from __future__ import annotations

import contextlib
import copy
import shutil
import warnings

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
import streampass.inductor as spi
from streampass import compat, ops

from graphs import ancestors, wrapped_work
from reference import TORCH, compile_and_compare, job, planned_syncs

aten = torch.ops.aten

pytestmark = pytest.mark.usefixtures("fresh_caches")


# --------------------------------------------------------------------------------------------
# User syncs inside a compiled function (issue 11, item 1)
# --------------------------------------------------------------------------------------------
AMB, S1, S2 = torch.Stream("cpu"), torch.Stream("cpu"), torch.Stream("cpu")


def event_record_wait(x):
    with AMB:
        e = torch.Event("cpu")
        with S1:
            y = x * 2
            e.record()
        e.wait()
        return y + 1


def stream_synchronize(x):
    s = torch.Stream("cpu")
    y = x + 1
    s.synchronize()
    return y * 2


def stream_wait_stream(x):
    with AMB:
        with S1:
            y = x * 3
        AMB.wait_stream(S1)
        return y + 1


def event_synchronize(x):
    with S1:
        e = torch.Event("cpu")
        y = x.sin()
        e.record()
    e.synchronize()
    return y + x


# torch 2.11's dynamo keeps ``s.synchronize()`` / ``s.wait_stream()`` as method calls that AOT
# autograd runs while tracing: they never reach a post-grad pass (tests/test_compat.py).
USER_SYNCS = [event_record_wait, event_synchronize]
if compat.STREAM_METHODS_ARE_OPS:
    USER_SYNCS[1:1] = [stream_synchronize, stream_wait_stream]


@pytest.mark.parametrize("fn", USER_SYNCS, ids=[f.__name__ for f in USER_SYNCS])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_user_syncs_compile_and_every_planned_sync_runs(fn, training):
    p, ran = compile_and_compare(fn, torch.randn(4), training=training)
    graphs = [r for r in p.reports if r.verified_graph is not None]
    assert graphs, [r.line() for r in p.reports]
    assert ran >= sum(planned_syncs(r.verified_graph) for r in graphs) > 0


def only_event_syncs(x):
    with AMB:
        e = torch.Event("cpu")
        e.record(S1)
        S2.wait_event(e)
        return 3


def only_synchronize(x):
    with AMB:
        S1.synchronize()
        return 3


def only_wait_stream(x):  # pytorch issue 194234's program
    with AMB:
        S1.wait_stream(AMB)
        return [1.0]


SYNCS_ALONE = {only_event_syncs: (ops.RECORD_EVENT, ops.WAIT_EVENT)}
if compat.STREAM_METHODS_ARE_OPS:
    SYNCS_ALONE |= {only_synchronize: (ops.SYNC_STREAM,), only_wait_stream: (ops.WAIT_STREAM,)}


@pytest.mark.parametrize("fn", SYNCS_ALONE, ids=[f.__name__ for f in SYNCS_ALONE])
def test_a_frame_of_syncs_alone_runs_them_cold_and_warm(fn):
    """A compiled frame with syncs and no tensor (code between graph breaks that only
    synchronizes) has no tensor to say its device: it was read as a CPU graph, and its syncs,
    with none to order, were dropped. On CUDA the user's ``s.synchronize()`` or ``wait_stream``
    would have been lost; plain inductor keeps them. Now its device is its streams' (on CPU
    here), and every planned sync runs, cold and warm."""
    ran = {}
    for run in ("cold", "warm"):
        torch._dynamo.reset()
        p, before = spi.StreamPass(keep_graphs=True), spi.RUNTIME_SYNCS.copy()
        with spi.enabled(p):
            out = torch.compile(fn)(torch.ones(4))
        ran[run] = spi.RUNTIME_SYNCS - before
        assert out == ([1.0] if fn is only_wait_stream else 3)
        if run == "cold":
            (report,) = p.reports
            assert report.device == "cpu"
            assert ran[run].total() >= planned_syncs(report.verified_graph)
    assert ran["warm"] == ran["cold"]  # 2.13 serves the warm run from its FX-graph cache, 2.14 and 2.15 compile again
    assert all(ran["cold"][op._opname] >= 1 for op in SYNCS_ALONE[fn]), ran["cold"]


class _CudaStream:
    """Stands in for a CUDA stream in dynamo's object table (it keeps weak references)."""

    device = torch.device("cuda", 0)


def test_a_graph_of_syncs_alone_runs_on_the_device_of_the_streams_it_names(monkeypatch):
    """What decides the lowering of a frame of syncs alone on a machine with an accelerator: the
    streams and events its syncs name in dynamo's table (a CUDA stream's sync stays a CUDA sync,
    a CPU stream's goes to CPU), the current accelerator for a sync that names none; a graph with
    tensors is on its tensors' device."""
    from torch._dynamo import graph_bytecode_inputs as table

    from streampass.transform.dynamo_indices import compiled_graph_device

    def device_of(*calls):
        g = torch.fx.Graph()
        for target, args in calls:
            g.call_function(target, args)
        g.output(())
        return compiled_graph_device(torch.fx.GraphModule(torch.nn.Module(), g))

    assert device_of((ops.WAIT_EVENT, (7, 1))) == torch.device("cpu")  # no accelerator here
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args: torch.device("cuda"))
    objects = [torch.Stream("cpu"), _CudaStream()]  # indices 0 and 1; event 7 is not in the table
    table.reset_user_object_tracking()
    try:
        for o in objects:
            table.register_graph_created_object(o, lambda index, codegen: None)
        assert device_of((ops.WAIT_EVENT, (7, 1))) == torch.device("cuda", 0)
        assert device_of((ops.WAIT_EVENT, (7, 0))) == torch.device("cpu")
        assert device_of((ops.RECORD_EVENT, (7, 0)), (ops.WAIT_EVENT, (7, 1))) == torch.device("cuda", 0)
        assert device_of((ops.WAIT_EVENT, (7, 8))) == torch.device("cuda")  # names nothing in the table
        if ops.exists(ops.SYNC_DEVICE):
            assert device_of((ops.SYNC_DEVICE, ())) == torch.device("cuda")
        assert compiled_graph_device(make_fx(torch.sin)(torch.ones(2))) == torch.device("cpu")
    finally:
        table.reset_user_object_tracking()


def window_of_two_inputs_then(sync):
    def program(x, w, y):
        with AMB:
            window = torch.cat([w, x], 1)[:, 3:7]
            e = torch.Event("cpu")
            with S1:
                e.record(S1)
                window.sin_()
                z = y.clone()
            sync()
            return z + window.sin()

    return program


WINDOW_SYNCS = {"synchronize": (window_of_two_inputs_then(lambda: S2.synchronize()), ops.SYNC_STREAM)}
if compat.STREAM_METHODS_ARE_OPS:  # torch 2.11 runs wait_stream() while tracing: a CPU event
    WINDOW_SYNCS["wait_stream"] = (window_of_two_inputs_then(lambda: AMB.wait_stream(S1)), ops.WAIT_STREAM)


@pytest.mark.parametrize("fn, sync", list(WINDOW_SYNCS.values()), ids=list(WINDOW_SYNCS))
def test_a_training_forward_syncs_after_a_record_and_an_in_place_window_write(fn, sync):
    """A compile fuzz's program, reduced: on torch 2.14 and 2.15 the forward's ``s.synchronize()``
    (or ``wait_stream``) got the loss's incoming gradient (``tangents_1``) among its dependencies
    (torch counts the gradient's views of ``x`` and ``w`` as forward nodes), so it had to run in
    the backward, after the record it depends on, which only the forward can run: "AOT Autograd
    failed to partition the joint forward-backward graph", with or without streampass. Under
    ``enabled()`` a forward sync keeps to the forward's dependencies (aot_guard.py)."""
    p, ran = compile_and_compare(fn, *torch.randn(3, 4, 4), training=True)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    assert ran >= sum(planned_syncs(r.verified_graph) for r in p.reports) > 0
    if compat.STREAM_METHODS_ARE_OPS:  # torch 2.11 runs s.synchronize() while tracing
        forward = sp.read_streams(p.reports[0].verified_graph, p.reports[0].external_events)
        assert sync in [c.target for c in forward.syncs.values()]


class _Keep(CustomGraphPass):
    """A post-grad pass that keeps a copy of the graph it is given (what StreamPass gets next)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph):
        if not ops.is_sync_subgraph(graph):
            gm = graph.owning_module
            self.graphs.append(torch.fx.GraphModule(gm, copy.deepcopy(graph)))

    def uuid(self):
        return b"keep"


def test_user_syncs_are_reused_exactly_as_run_does():
    keep, p = _Keep(), spi.StreamPass(keep_graphs=True)
    with inductor_config.patch(post_grad_custom_post_pass=keep), spi.enabled(p):
        torch.compile(event_record_wait)(torch.randn(4))
    (graph,) = keep.graphs
    existing = planned_syncs(p.reports[0].verified_graph) - p.reports[0].records_added - p.reports[0].waits_added
    assert existing == 2  # the user's record and wait, kept
    # the same graph, standalone (after the same index shift): the same syncs are added
    from streampass.transform.dynamo_indices import shift_indices

    shift_indices(graph, 1)
    alone = sp.run(graph, bind_runtime=False)
    assert (alone.records_added, alone.waits_added) == (p.reports[0].records_added, p.reports[0].waits_added)


def test_sync_bodies_are_left_to_the_graph_that_calls_them():
    # torch's wait body has no inputs and waits on an event only the outer graph records
    g = torch.fx.Graph()
    g.output(g.call_function(ops.WAIT_EVENT, (2, 0)))
    body = torch.fx.GraphModule(torch.nn.Module(), g)
    code = body.code
    p = spi.StreamPass()
    p(body.graph)
    assert body.code == code and p.reports == []
    # and streampass's own bodies, as a second compile of a rewritten graph would hand them over
    gm = make_fx(f_one)(torch.ones(4))
    sp.run(gm, bind_runtime=False)
    bodies = [m for m in gm.children() if isinstance(m, torch.fx.GraphModule)]
    assert bodies
    for m in bodies:
        before = m.code
        p(m.graph)
        assert m.code == before
    assert p.reports == []


# --------------------------------------------------------------------------------------------
# Backward compiled after the block (item 2), dynamo's index 0 on CPU (item 3)
# --------------------------------------------------------------------------------------------
def s_branches(x, w1, w2):
    with sp.stream(1):
        a = torch.relu(x @ w1)
    with sp.stream(2):
        b = torch.sigmoid(x @ w2)
    return a + b


def test_backward_after_the_block_goes_through_streampass():
    inputs = [torch.randn(16, 16) for _ in range(3)]
    p, ran = compile_and_compare(s_branches, *inputs, training=True)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    bwd = p.reports[1]
    assert bwd.lowering == "cpu" and bwd.records_added > 0 and not bwd.hazards_after
    assert ran >= sum(planned_syncs(r.verified_graph) for r in p.reports)


def masked_sum_on_two_streams(x, w):
    with sp.stream(1):
        a = x @ w.t()
        v = x[x > 0]
    with sp.stream(2):
        b = x[:, :8] * v.sum().item()
    return (a * b).mean() + v.mean()


@torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)
def test_a_cpu_sync_materializes_no_value_for_inductor():
    """x.grad was wrong here: the CPU syncs' arguments made inductor materialize the
    slice_scatter of x[:, :8]'s gradient, and torch 2.13 then ran the add that reads the
    index_put_ of x[x > 0]'s gradient before that index_put_ (docs/inductor.md, "What inductor
    gets, CPU vs CUDA"). A CPU sync now takes only the graph's first input."""
    torch.manual_seed(0)
    p, ran = compile_and_compare(masked_sum_on_two_streams, torch.randn(8, 16), torch.randn(8, 16), training=True)
    assert [r.graph for r in p.reports] == ["forward", "backward"] and ran > 0
    assert all(r.lowering == "cpu" and r.streams == [0, 1, 2] for r in p.reports)


S1, S2 = torch.Stream("cpu"), torch.Stream("cpu")


def index_put_on_two_streams(a, b, c):
    a, b, c = a * 1, b * 1, c * 1
    with S2:
        t1 = c.index_put((torch.tensor([0, 2]),), a[1:3] * 2)
        t2 = (b @ t1.t()) @ b * 0.1
    with S1:
        t3 = c - a
    return t3, t2, t1, t1.t()


def test_a_cpu_sync_takes_a_tensor_no_kernel_reads():
    """c.grad was wrong here (rows 0 and 2 not zeroed) with a CPU sync that took the backward's
    first input: torch 2.13 inductor then ran the loop reading the index_put's result before the
    one zero-filling its buffer, as in the test above. Every CPU sync now takes an empty tensor
    made for it at entry (a random-program probe found this one, 1 in 720)."""
    torch.manual_seed(0)
    base = [torch.randn(4, 6) for _ in range(3)]

    def forward(fn):
        inputs = [t.clone().requires_grad_() for t in base]
        return inputs, sum((o * (i + 1)).sum() for i, o in enumerate(fn(*inputs)))  # the loss, outside

    eager, loss = forward(index_put_on_two_streams)
    loss.backward()
    p = sp.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        compiled, loss = forward(torch.compile(index_put_on_two_streams))
    loss.backward()  # after the block, as a training loop does
    for g, w in zip([t.grad for t in compiled], [t.grad for t in eager]):
        torch.testing.assert_close(g, w)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    assert all(r.lowering == "cpu" and sp.verify(r.verified_graph).ok for r in p.reports)


def test_backward_outside_leaves_other_compiles_alone():
    """After the block, a function compiled for the first time gets no StreamPass."""
    p = spi.StreamPass()
    with spi.enabled(p):
        out = torch.compile(s_branches)(*[torch.randn(8, 8, requires_grad=True) for _ in range(3)])
    out.sum().backward()
    n = len(p.reports)
    torch.compile(lambda x: x.cos() * 2)(torch.randn(4))
    assert len(p.reports) == n == 2


def test_a_recompile_keeps_streampass_until_dynamo_forgets_the_function():
    """torch._dynamo.reset() forgets every compiled function, as a new process would: a compile
    after it is a first compile, and outside a block it gets no StreamPass."""

    def g(x):
        return x.cos() * 2

    p = spi.StreamPass()
    with spi.enabled(p):
        torch.compile(g)(torch.randn(4))
    torch.compile(g)(torch.randn(5, 3))  # a recompile (another rank), after the block
    assert len(p.reports) == 2
    torch._dynamo.reset()
    torch.compile(g)(torch.randn(6, 3, 2))
    assert len(p.reports) == 2


@pytest.fixture
def enabled_for_the_test():
    """``spi.enable()`` for one test, undone after it (``spi.disable()``)."""
    yield spi.enable
    spi.disable()


def test_enable_covers_a_compile_whose_options_replace_the_post_grad_pass(enabled_for_the_test):
    """``enable()`` is for the whole process: a compile that gives its own post-grad pass in
    ``options`` gets StreamPass after it (on CPU, without it, inductor's code names an undefined
    ``stream1``)."""
    p = enabled_for_the_test(spi.StreamPass(keep_graphs=True))
    seen = []

    def mine(graph):
        seen.append([n.target for n in graph.nodes if n.op == "call_function"])

    x = torch.randn(8)
    torch.testing.assert_close(
        torch.compile(f_sin_on_side, options={"post_grad_custom_post_pass": mine})(x), f_sin_on_side(x)
    )
    assert len(seen) == 1 and not any(t in ops.STREAM_OPS or t is ops.CONTROL_DEPS for t in seen[0])  # it ran first
    assert [r.graph for r in p.reports] == ["inference"] and _side_ops(p.reports[0]) == ["sin.default"]


def _users_ordering_pass(wrapped, after, nth_after=0):
    """A user's own post-grad pass, as torch's ``test/inductor/test_control_deps.py`` writes them:
    ``preserve_node_ordering`` wraps the first ``wrapped`` node (work, not a stream op) in
    ``control_deps``, ordered after the ``nth_after`` ``after`` node. It leaves the wrapper where
    the wrapped node was, which may be before its new dependency (out of topological order)."""
    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    def mine(graph):
        node = graph.find_nodes(op="call_function", target=wrapped)[0]
        dependency = graph.find_nodes(op="call_function", target=after)[nth_after]
        preserve_node_ordering(graph, {node: OrderedSet([dependency])})

    return mine


_order_cat_after_the_first_add = _users_ordering_pass(torch.ops.aten.cat.default, torch.ops.aten.add.Tensor)
_order_the_first_add_after_the_mul = _users_ordering_pass(torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
_order_the_mul_after_the_first_add = _users_ordering_pass(torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor)


def cat_of_two(a, b, c):
    return torch.cat([a + 1, b * 2]) + c


def cat_of_two_streams(a, b, c):
    s = torch.Stream("cpu")
    x = a + 1
    with s:
        y = b * 2
    return torch.cat([x, y]) + c


def test_a_users_pass_that_wraps_work_in_control_deps_leaves_a_graph_without_streams_alone():
    """``enabled()`` runs the user's post-grad pass first. A graph with no streams has nothing to
    plan, so work that pass wrapped in ``control_deps`` is kept as it is; before, every such
    compile failed ("control_deps runs aten.cat.default")."""
    args = [torch.rand(16, 8), torch.rand(16, 8), torch.rand(32, 8)]
    p = sp.StreamPass(keep_graphs=True)
    with inductor_config.patch(post_grad_custom_post_pass=_order_cat_after_the_first_add), spi.enabled(p):
        got = torch.compile(cat_of_two)(*args)
    torch.testing.assert_close(got, cat_of_two(*args))
    assert p.reports and all(r.streams == [0] and r.waits_added == 0 and not r.changed for r in p.reports)


@pytest.mark.parametrize("order", ["yours first", "StreamPass first"])
@pytest.mark.parametrize(
    "mine, wrapped",
    [(_order_cat_after_the_first_add, {"cat": ["add"]}), (_order_the_mul_after_the_first_add, {"mul": ["add"]})],
    ids=["ambient cat", "side stream mul"],
)
def test_a_users_pass_that_wraps_work_in_control_deps_next_to_streams_is_planned_and_keeps_its_order(
    order, mine, wrapped
):
    """``enabled()`` runs the user's pass first. StreamPass takes the wrapped work out of its
    ``control_deps`` while it plans (inside the wrapper its reads and writes were unseen), then
    wraps it again with the user's dependency; inductor gets the user's order. Before, the
    compile was refused ("control_deps runs aten.cat.default"). StreamPass first plans a graph
    the user's pass then wraps work in, as it always could. The ``mul`` runs on the side stream,
    its dependency on the ambient one: the wrapper orders launches, the plan's syncs the streams."""
    args = [torch.rand(16, 8), torch.rand(16, 8), torch.rand(32, 8)]
    p, seen = spi.StreamPass(keep_graphs=True), []
    passes = [mine, p] if order == "yours first" else [p, mine]
    options = {"post_grad_custom_post_pass": compat.post_grad_config([*passes, lambda g: seen.append(wrapped_work(g))])}
    got = torch.compile(cat_of_two_streams, options=options)(*args)
    torch.testing.assert_close(got, cat_of_two_streams(*args))
    (r,) = p.reports
    assert r.streams == [0, 1] and r.waits_added > 0 and sp.verify(r.verified_graph).ok
    assert seen == [wrapped]  # what inductor gets: the user's wrapper, its dependency kept


@torch.library.custom_op("streampass_tests::add_one_", mutates_args=("x",))
def add_one_(x: torch.Tensor) -> None:
    x.add_(1)


@add_one_.register_fake
def _(x):
    return None


def mutating_op_next_to_a_side_stream(x, y):
    t = x.clone()
    with torch.Stream("cpu"):
        z = y * 2
    add_one_(t)  # auto_functionalized_v2 in the graph inductor's passes get
    return t + z, z.sin()


def mutating_op_alone(x, y):
    t = x.clone()
    z = y * 2
    add_one_(t)
    return t + z, z.sin()


_order_the_mutating_op_after_the_mul = _users_ordering_pass(
    torch.ops.higher_order.auto_functionalized_v2, torch.ops.aten.mul.Tensor
)


def test_a_mutating_custom_op_a_users_pass_wrapped_in_control_deps_is_planned_with_its_writes():
    """The wrapped op is a higher-order op with keyword arguments that writes a buffer
    (``auto_functionalized_v2`` of a custom op): taken out of its wrapper, its writes are in the plan.
    Before torch 2.13 inductor cannot lower such a wrapper, without streams or streampass either."""
    x, y = torch.randn(8), torch.randn(8)
    p, seen = spi.StreamPass(keep_graphs=True), []
    passes = [_order_the_mutating_op_after_the_mul, p, lambda g: seen.append(wrapped_work(g))]
    if TORCH < (2, 13):
        plain = {"post_grad_custom_post_pass": _order_the_mutating_op_after_the_mul}
        with pytest.raises(Exception, match="auto_functionalized_v2 is not an OpOverload"):
            torch.compile(mutating_op_alone, options=plain)(x, y)
        return
    got = torch.compile(
        mutating_op_next_to_a_side_stream, options={"post_grad_custom_post_pass": compat.post_grad_config(passes)}
    )(x, y)
    torch.testing.assert_close(got, mutating_op_next_to_a_side_stream(x, y))
    (r,) = p.reports
    assert r.streams == [0, 1] and r.waits_added > 0 and sp.verify(r.verified_graph).ok
    assert seen == [{"auto_functionalized_v2": ["mul"]}]


def _move_the_cat_to_the_top(graph):
    """A user's pass that moves a node before its inputs (inductor sorts the graph right after the
    custom post-grad passes, so plain torch compiles it)."""
    cat = graph.find_nodes(op="call_function", target=torch.ops.aten.cat.default)[0]
    next(n for n in graph.nodes if n.op != "placeholder").prepend(cat)


@pytest.mark.parametrize(
    "fn, mine", [(cat_of_two, _order_the_first_add_after_the_mul), (cat_of_two_streams, _move_the_cat_to_the_top)]
)
def test_a_graph_an_earlier_pass_left_out_of_order_is_sorted_as_inductor_would(fn, mine):
    """StreamPass sorts it first (torch's ``stable_topological_sort``, what inductor runs right
    after these passes), then plans it; before, it refused "uses 'mul' before it is defined"."""
    args = [torch.rand(16, 8), torch.rand(16, 8), torch.rand(32, 8)]
    p = sp.StreamPass(keep_graphs=True)
    with inductor_config.patch(post_grad_custom_post_pass=mine), spi.enabled(p):
        got = torch.compile(fn)(*args)
    torch.testing.assert_close(got, fn(*args))
    (r,) = [r for r in p.reports if r.graph == "inference"]
    if fn is cat_of_two_streams:
        assert r.streams == [0, 1] and r.waits_added > 0 and sp.verify(r.verified_graph).ok


def test_disable_undoes_enable(enabled_for_the_test):
    before = inductor_config.post_grad_custom_post_pass
    p = enabled_for_the_test(spi.StreamPass())
    torch.compile(f_sin_on_side)(torch.randn(8))
    assert len(p.reports) == 1
    spi.disable()
    assert inductor_config.post_grad_custom_post_pass == before
    torch.compile(lambda x: x.cos() * 2)(torch.randn(8))  # a first compile, after disable(): untouched
    assert len(p.reports) == 1
    spi.disable()  # a second time does nothing


def test_a_function_compiled_while_enabled_keeps_streampass_after_disable(enabled_for_the_test):
    """A training loop between enable() and disable(): the backward and the recompile for a
    smaller last batch come after disable(), and still go through StreamPass (on CPU, without it,
    torch's own AOT stream pass fails importing triton)."""
    p = enabled_for_the_test(spi.StreamPass())
    step = torch.compile(s_branches)
    w1, w2 = (torch.randn(16, 16, requires_grad=True) for _ in range(2))
    loss = step(torch.randn(8, 16), w1, w2).sum()
    spi.disable()
    loss.backward()
    x = torch.randn(3, 16)  # the last, smaller batch: a recompile
    got = step(x, w1, w2)
    torch.testing.assert_close(got, s_branches(x, w1, w2))
    got.sum().backward()
    assert [r.graph for r in p.reports] == ["forward", "backward", "forward", "backward"]
    assert all(r.records_added > 0 for r in p.reports)
    torch.compile(lambda x: x.cos() * 2)(torch.randn(8))  # a first compile, after disable(): untouched
    assert len(p.reports) == 4


def test_enable_inside_a_block_outlives_the_block(enabled_for_the_test):
    """The block puts its config back when it ends; ``enable()`` called inside it still holds."""
    with spi.enabled() as p:
        assert enabled_for_the_test() is p
    torch.compile(f_sin_on_side)(torch.randn(8))  # first compiled after the block
    assert [r.graph for r in p.reports] == ["inference"]


class Block(torch.nn.Module):
    """README's training block: two projections on side streams."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        with sp.stream(1):
            left = torch.relu(self.a(x))
        with sp.stream(2):
            right = torch.sigmoid(self.b(x))
        return (left * right).sum()


def _train_first_step_in_block(make, lr: float, batches):
    """Train a compiled model and an eager copy side by side (SGD at ``lr``), the first step
    inside ``enabled()`` and the rest after it, each loss compared; ``batches``: functions of
    the model giving each step's input. Returns the pass, the model, its copy and the step."""
    torch.manual_seed(0)
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in (model, ref)]
    step = torch.compile(model)
    for i, batch in enumerate(batches):
        x = batch(model)
        if i == 0:
            with spi.enabled(spi.StreamPass(keep_graphs=True)) as p:
                loss = step(x)
        else:
            loss = step(x)
        want = ref(x)
        torch.testing.assert_close(loss, want)
        for out, opt in zip((loss, want), opts):
            out.backward()
            opt.step()
            opt.zero_grad()
    return p, model, ref, step


def test_recompiles_after_the_block_go_through_streampass():
    """A training loop's last batch is smaller and its evaluation runs under no_grad: both
    recompile the model after the block. They still get StreamPass (on CPU, without it, torch's
    own AOT stream pass crashes on the annotated graph; on CUDA the forward would run on its
    streams with no syncs)."""
    batches = [lambda m, n=n: torch.randn(n, 16) for n in (8, 8, 5)]  # the third recompiles (a new size)
    p, model, ref, step = _train_first_step_in_block(Block, 0.1, batches)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
    model.eval()
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(step(x), ref(x))
    assert [r.graph for r in p.reports] == ["forward", "backward", "forward", "backward", "inference"]
    assert all(r.records_added > 0 and sp.verify(r.verified_graph).ok for r in p.reports)


class Gated(torch.nn.Module):
    """A data-dependent branch (a graph break): the second path, and its stream block, are
    compiled the first time a batch takes it."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        with sp.stream(1):
            a = self.lin1(x)
        if a.mean() > 0:
            return a.sin().sum()
        with sp.stream(2):
            b = self.lin2(a).cos()
        return (a * b).sum()


def test_a_continuation_first_reached_after_the_block_goes_through_streampass():
    """The first batch, in the block, takes one side of a graph break; a later batch, after the
    block, the other: dynamo then compiles a new continuation of the same forward. It got no
    StreamPass (on CPU inductor's code failed with NameError: stream1; in training torch's own
    AOT stream pass needed triton)."""
    batches = [  # lin1's mean output positive, then negative
        lambda m, shift=shift: torch.randn(4, 8) + shift * torch.sign(m.lin1.weight.detach().sum(0))
        for shift in (2.0, -2.0, -2.0)
    ]
    p, _, _, _ = _train_first_step_in_block(Gated, 1e-3, batches)
    # stream 2 is only in the continuation, forward and backward, compiled after the block
    assert sorted(r.graph for r in p.reports if 2 in r.streams and r.records_added) == ["backward", "forward"]
    assert all(sp.verify(r.verified_graph).ok for r in p.reports if r.verified_graph is not None)


class WaitBothWays(torch.nn.Module):
    """PyTorch's CUDA-semantics pattern in a training step: the side stream waits for the current
    one before using its tensor, and the current one waits back before the loss."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        # Eager CPU streams cannot wait (no events); neither can torch 2.11's AOT autograd, which
        # runs Stream.wait_stream while tracing (docs/versions.md): there the step has no syncs.
        syncs = torch.compiler.is_compiling() and compat.STREAM_METHODS_ARE_OPS
        with AMB:
            a = self.lin(x).relu()
            if syncs:
                S1.wait_stream(AMB)
            with S1:
                b = self.on_side(a)
            if syncs:
                AMB.wait_stream(S1)
            return self.loss(a, b)

    def on_side(self, a):
        return a.sum(1) * 2

    def loss(self, a, b):
        return (b + a.mean(1)).sum()


class BuffersOnTheSideStream(WaitBothWays):
    """A batch norm (running statistics) and an EMA of the weight updated in place on the side
    stream, after it waits for the current one (timm's ModelEma on an "ema stream")."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(16)
        self.register_buffer("ema", torch.zeros(16, 16))

    def on_side(self, a):
        self.ema.mul_(0.9).add_(self.lin.weight.detach(), alpha=0.1)
        return self.bn(a)

    def loss(self, a, b):
        return (b * a).sum()


@pytest.mark.parametrize("make", [WaitBothWays, BuffersOnTheSideStream], ids=["wait_stream", "buffers"])
def test_a_training_step_with_wait_stream_both_ways(make):
    """torch 2.13 threaded the loss's incoming gradient (``tangents_1``) through the forward's
    ``AMB.wait_stream(S1)``, and AOT's partitioner refused the joint graph ("Node sum_2 was
    invalid, but is output"), with or without streampass; ``enabled()`` now keeps a forward
    wait's dependencies to the forward (compat.py). With buffers updated on the waiting stream,
    torch made functionalization's copy back into them write its passthrough ("n=copy_,
    n.args[0]=getitem_3"). Three steps, backward after the block."""
    batches = [lambda m: torch.randn(8, 16)] * 3
    p, model, ref, _ = _train_first_step_in_block(make, 0.1, batches)
    for a, b in zip([*model.parameters(), *model.buffers()], [*ref.parameters(), *ref.buffers()]):
        torch.testing.assert_close(a, b)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    assert all(r.verified_graph is not None and sp.verify(r.verified_graph).ok for r in p.reports)
    forward = sp.read_streams(p.reports[0].verified_graph)
    if compat.STREAM_METHODS_ARE_OPS:  # torch 2.11 runs wait_stream while tracing
        assert sum(call.target is ops.WAIT_STREAM for call in forward.syncs.values()) == 2


class ResetAfterWait(torch.nn.Module):
    """The current stream waits for the side stream, which used the buffers in an earlier step,
    then updates one in place and overwrites another (``zero_``: a factory and an epilogue
    ``copy_``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.ones(16))
        self.register_buffer("acc", torch.ones(16))

    def forward(self, x):
        with AMB:
            a = x * 3
            if torch.compiler.is_compiling():  # eager CPU streams cannot wait
                AMB.wait_stream(S1)
            self.ema.mul_(0.5)
            self.acc.zero_()
            return a + self.ema


@pytest.mark.skipif(not compat.STREAM_METHODS_ARE_OPS, reason="torch 2.11 runs wait_stream while tracing")
def test_buffers_written_after_a_wait_stream_stay_after_it():
    """The copies back into the buffers follow the user's wait in the graph inductor schedules:
    the overwritten one had nothing to order it (its zeros depend on nothing, and the guard
    points the copy back at the buffer), so on CUDA it could be written before the wait (review)."""
    model, ref = ResetAfterWait(), ResetAfterWait()
    with spi.enabled(spi.StreamPass(keep_graphs=True)) as p:
        out = torch.compile(model)(torch.ones(4, 16))
    torch.testing.assert_close(out, ref(torch.ones(4, 16)))
    torch.testing.assert_close([model.ema, model.acc], [ref.ema, ref.acc])
    (graph,) = [r.verified_graph.graph for r in p.reports]
    waits = [n for n in graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_STREAM]
    copies = graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
    assert len(waits) == 1 and len(copies) == 2
    assert all(waits[0] in ancestors(c) for c in copies)


class ParallelBlock(torch.nn.Module):
    """A GPT-J style block: attention and the MLP read the same normalised input, one stream each."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln, self.heads = torch.nn.LayerNorm(d), heads
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        y = self.ln(x)
        b, t, c = y.shape
        with sp.stream(1):
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(y).split(c, -1))
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            att = self.proj(att.transpose(1, 2).reshape(b, t, c))
        with sp.stream(2):
            mlp = self.fc2(torch.nn.functional.gelu(self.fc1(y)))
        return x + att + mlp


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=64, d=32, layers=2):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Parameter(torch.zeros(16, d))
        self.blocks = torch.nn.ModuleList(ParallelBlock(d) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, idx, target):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


@pytest.mark.slow
def test_a_language_model_training_loop():
    """AdamW, gradient clipping, a smaller last batch, then evaluation: every graph the loop
    compiles goes through StreamPass and verifies, and the losses equal eager's."""
    torch.manual_seed(0)
    model, ref = TinyLM(), TinyLM()
    ref.load_state_dict(model.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref)]
    step = torch.compile(model)
    batches = [(torch.randint(0, 64, (n, 16)), torch.randint(0, 64, (n, 16))) for n in (8, 8, 3)]
    for i, (idx, target) in enumerate(batches):
        if i == 0:
            with spi.enabled(spi.StreamPass(keep_graphs=True)) as p:
                loss = step(idx, target)
        else:
            loss = step(idx, target)
        want = ref(idx, target)
        torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
        for m, out, opt in zip((model, ref), (loss, want), opts):
            out.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    model.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(step(*batches[0]), ref(*batches[0]), rtol=1e-4, atol=1e-4)
    assert [r.graph for r in p.reports] == ["forward", "backward", "forward", "backward", "inference"]
    assert all(r.streams == [0, 1, 2] and sp.verify(r.verified_graph).ok for r in p.reports)


class NormedBranches(torch.nn.Module):
    """Two branches, one on a side stream, into a BatchNorm whose running statistics the
    forward writes: a loss that depends on every parameter, so a lost update shows."""

    def __init__(self, d=16):
        super().__init__()
        self.a, self.b, self.bn = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.BatchNorm1d(d)

    def forward(self, x):
        with sp.stream(1):
            left = torch.relu(self.a(x))
        right = torch.sigmoid(self.b(x))
        return self.bn(left * right).pow(2).mean()


@pytest.mark.parametrize("way", ["accumulate", "autocast", "compiled_optimizer"])
def test_other_ways_to_write_a_training_step(way):
    """Gradient accumulation (two micro-batches, each backward right after its forward, one
    optimizer step); a bf16 ``torch.autocast`` forward; ``torch.compile(opt.step)`` compiled under
    the block too. Three steps; parameters and BatchNorm statistics equal eager's, the stream
    graphs verify and the optimizer's graph, which has no streams, goes through untouched."""
    torch.manual_seed(0)
    model, ref = NormedBranches(), NormedBranches()
    ref.load_state_dict(model.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    compiled, micro = torch.compile(model), 2 if way == "accumulate" else 1
    opt_step = torch.compile(opts[0].step) if way == "compiled_optimizer" else opts[0].step
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if way == "autocast" else contextlib.nullcontext()
    p = sp.StreamPass(keep_graphs=True)
    for _ in range(3):
        xs = [torch.randn(8, 16) for _ in range(micro)]
        with spi.enabled(p):
            for x in xs:
                with cast:
                    loss = compiled(x)
                loss.backward()
            opt_step()
        for x in xs:
            with copy.deepcopy(cast):
                want = ref(x)
            want.backward()
        opts[1].step()
        for opt in opts:
            opt.zero_grad()
    tol = {"rtol": 2e-2, "atol": 1e-3} if way == "autocast" else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(model.state_dict(), ref.state_dict(), **tol)
    streamed = [r for r in p.reports if r.streams != [0]]
    assert [r.graph for r in streamed] == ["forward", "backward"] and all(
        sp.verify(r.verified_graph).ok for r in streamed
    )
    untouched = [r for r in p.reports if r.streams == [0]]
    assert len(untouched) == (way == "compiled_optimizer") and not any(r.changed for r in untouched)


class ConvAndLinearBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.conv = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm1d(16)

    def forward(self, x, img):
        with sp.stream(1):
            left = torch.relu(self.a(x))
            pooled = self.conv(img).mean()
        return self.bn(left * torch.sigmoid(self.b(x))) + pooled


@inductor_config.patch(freezing=True)
def test_frozen_inference_reads_its_frozen_weights_as_inputs():
    """``freezing=True`` (inductor's CPU inference setting) turns the parameters into constants,
    ``get_attr`` nodes the side stream's packed linear and convolution read: the graph verifies,
    and the result equals eager."""
    model, x, img = ConvAndLinearBranches().eval(), torch.randn(8, 16), torch.randn(2, 3, 8, 8)
    with torch.no_grad(), spi.enabled(sp.StreamPass(keep_graphs=True)) as p:
        torch.testing.assert_close(torch.compile(model)(x, img), model(x, img))
    (report,) = p.reports
    g = report.verified_graph.graph
    frozen = {n for n in g.find_nodes(op="get_attr") if not n.name.startswith("streampass")}
    on_side = [n for n in g.nodes if n.meta.get("custom", {}).get("stream") == 1 and frozen & set(n.all_input_nodes)]
    assert on_side, "no side-stream op reads a frozen weight: this test no longer tests freezing"
    assert report.streams == [0, 1] and sp.verify(report.verified_graph).ok


def f_sin_on_side(x):
    with sp.stream(1):
        a = x.sin()
    b = x.cos()
    return a * b


def f_cos_on_side(x):  # the same code as f_sin_on_side: only where its streams are differs
    a = x.sin()
    with sp.stream(1):
        b = x.cos()
    return a * b


def _side_ops(report) -> list[str]:
    return [n.target.__name__ for n in report.verified_graph.graph.nodes if n.meta.get("custom", {}).get("stream") == 1
            and n.op == "call_function" and n.target in (torch.ops.aten.sin.default, torch.ops.aten.cos.default)]  # fmt: skip


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_where_the_streams_are_is_part_of_torchs_cache_keys(training):
    """Two programs with the same code and different stream annotations never share a cache
    entry (torch hashes the code, not node.meta); a second compile of each hits its own."""
    from torch._dynamo.utils import counters

    x = torch.randn(8, requires_grad=training)
    p = sp.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        for fn in (f_sin_on_side, f_cos_on_side):
            out = torch.compile(fn)(x)
            if training:
                out.sum().backward()
    per_graph = 2 if training else 1
    side = [(r.graph, _side_ops(r)) for r in p.reports]
    assert [ops for graph, ops in side if graph != "backward"] == [["sin.default"], ["cos.default"]]
    if training:  # each backward as its own program made it (what a backward recomputes varies by release)
        assert [graph for graph, _ in side] == ["forward", "backward"] * 2 and side[1] != side[3]
    assert counters["inductor"]["fxgraph_cache_miss"] == 2 * per_graph
    torch._dynamo.reset()  # as a new process would: nothing compiled, the caches on disk
    counters.clear()
    with spi.enabled(p):
        for fn in (f_sin_on_side, f_cos_on_side):
            torch.testing.assert_close(torch.compile(fn)(x), fn(x))
    assert counters["inductor"]["fxgraph_cache_hit"] == 2 * per_graph
    assert counters["inductor"]["fxgraph_cache_miss"] == 0 and len(p.reports) == 2 * per_graph


def test_a_pass_given_as_compile_options_keys_the_cache_too():
    p = sp.StreamPass(keep_graphs=True)
    for fn in (f_sin_on_side, f_cos_on_side):
        torch.compile(fn, options={"post_grad_custom_post_pass": p})(torch.randn(8))
    assert [_side_ops(r) for r in p.reports] == [["sin.default"], ["cos.default"]]


BLOCKS = {"sp.stream": lambda: sp.stream(1), "torch.Stream": lambda: S1}


@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_a_graph_break_inside_a_stream_block_runs_the_function_eagerly(block):
    """dynamo cannot resume a frame inside either block, so it runs the frame eagerly, as plain
    torch does; ``sp.stream`` must then work as it does outside torch.compile (it used to come
    back as a function and fail the ``with``)."""

    def f(x):
        with block():
            a = x.sin()
            torch._dynamo.graph_break()
            b = a.cos()
        return b + x

    x = torch.randn(4)
    with spi.enabled() as p:
        torch.testing.assert_close(torch.compile(f)(x), f(x))
    assert p.reports == []  # nothing compiled


def _breaks(x):
    a = x.sin()
    torch._dynamo.graph_break()
    return a.cos()


@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_a_graph_break_in_a_function_called_in_a_stream_block(block):
    """The block runs eagerly around the call; the called function's two pieces are compiled as
    frames of their own: under ``sp.stream(1)`` their nodes are still on stream 1, under a
    ``torch.Stream`` block on none (they run on the stream the eager block made current)."""

    def f(x):
        with block():
            b = _breaks(x)
        return b + x

    x = torch.randn(4)
    with spi.enabled(spi.StreamPass(keep_graphs=True)) as p:
        torch.testing.assert_close(torch.compile(f)(x), f(x))
    side = [
        [
            n.name
            for n, k in sp.read_streams(r.verified_graph).stream.items()
            if k == 1 and n.target in (aten.sin.default, aten.cos.default)
        ]
        for r in p.reports
        if r.verified_graph is not None
    ]
    if block is BLOCKS["sp.stream"]:
        assert [r.streams for r in p.reports] == [[0, 1], [0, 1]] and side == [["sin"], ["cos"]]
    else:
        assert [r.streams for r in p.reports] == [[0], [0]] and side == []


def test_exported_program_through_aot_inductor_keeps_its_streams(tmp_path):
    """torch.export's default (non-strict) tracer, then AOTInductor's package: the pass sees the
    program's side stream, and the packaged code runs the syncs it planned."""
    model, x = Block().eval(), torch.randn(4, 16)
    ep = torch.export.export(model, (x,))
    p = sp.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    (r,) = p.reports
    assert r.streams == [0, 1, 2] and r.records_added > 0 and sp.verify(r.verified_graph).ok
    loaded = torch._inductor.aoti_load_package(path)
    before = sum(spi.RUNTIME_SYNCS.values())
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    assert sum(spi.RUNTIME_SYNCS.values()) - before >= planned_syncs(r.verified_graph)


def two_user_streams(x):
    with S1:
        a = x.sin()
    with S2:
        b = x.cos()
    return a + b


def test_first_user_stream_is_a_side_stream_on_cpu(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="streampass"):
        p, _ = compile_and_compare(two_user_streams, torch.randn(4))
    (r,) = p.reports
    assert r.streams == [0, 1, 2] and r.indices == "dynamo+1"
    line = next(rec.getMessage() for rec in caplog.records if rec.name.startswith("streampass"))
    assert "streams [0, 1, 2]" in line and "dynamo's index + 1" in line
    # both user streams are side streams: the ambient stream waits for both at exit
    assert r.hazards_before.get("exit", 0) >= 2


@pytest.mark.skipif(not hasattr(torch.compile(abs), "aot_compile"), reason="no aot_compile before torch 2.12")
@pytest.mark.parametrize("fn", [two_user_streams, s_branches], ids=["torch.Stream", "sp.stream"])
def test_a_precompiled_function_keeps_its_streams_and_its_loaded_copy_runs_the_syncs(fn, tmp_path):
    """dynamo's precompile (``torch.compile(f, fullgraph=True).aot_compile(...)``, saved and
    loaded with ``torch.compiler.load_compiled_function``) calls the backend after capturing the
    frame, outside dynamo's tracer: the user's first ``torch.Stream`` was read as the ambient
    stream on CPU (streams [0, 1] for two user streams), folding it in with no overlap planned."""
    args = (torch.randn(4),) if fn is two_user_streams else tuple(torch.randn(8, 8) for _ in range(3))
    p = sp.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        compiled = torch.compile(fn, fullgraph=True).aot_compile((args, {}))
    (r,) = p.reports
    assert r.streams == [0, 1, 2] and sp.verify(r.verified_graph).ok
    assert r.indices == ("dynamo+1" if fn is two_user_streams else "dynamo")
    compiled.save_compiled_function(str(tmp_path / "f.bin"))
    with open(tmp_path / "f.bin", "rb") as f:
        loaded = torch.compiler.load_compiled_function(f, f_globals=globals())
    for call in (compiled, loaded):
        before = sum(spi.RUNTIME_SYNCS.values())
        torch.testing.assert_close(call(*args), fn(*args))
        assert sum(spi.RUNTIME_SYNCS.values()) - before >= planned_syncs(r.verified_graph)


def test_sp_stream_indices_are_read_as_they_are():
    p, _ = compile_and_compare(s_branches, *[torch.randn(8, 8) for _ in range(3)])
    assert [r.indices for r in p.reports] == ["dynamo"] and p.reports[0].streams == [0, 1, 2]


def test_a_compile_outside_dynamo_reads_its_own_indices_whatever_dynamo_compiled_before():
    """torch._inductor.compile of a make_fx graph (AOT inductor's path) runs no dynamo frame:
    dynamo's object table still holds the last frame's objects, and its index 0 made this
    graph's streams read one up ([0, 2], "dynamo+1")."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def compiled_outside_dynamo():
        p, x = spi.StreamPass(), torch.randn(4)
        with spi.enabled(p):
            torch._inductor.compile(make_fx(lambda x: _on_stream_k(x, 1))(x), [x])(x)
        return [(r.streams, r.indices) for r in p.reports]

    assert compiled_outside_dynamo() == [([0, 1], "dynamo")]
    compile_and_compare(two_user_streams, torch.randn(4))  # index 0 of the table: a user stream
    assert compiled_outside_dynamo() == [([0, 1], "dynamo")]


@torch._dynamo.config.patch(caching_precompile=True)
def test_a_dynamo_graph_compiled_later_reads_its_own_indices_whatever_dynamo_traced_since():
    """A graph a backend kept, compiled later (after dynamo traced a frame with user streams):
    with ``caching_precompile`` dynamo marks every graph with the backend id its precompile
    marks its own with, and reading that mark as "the table is this graph's" moved the graph's
    indices up ([0, 2, 3], "dynamo+1"). Only a compile inside the precompile trusts the table."""
    graphs, args = [], [torch.randn(8, 8) for _ in range(3)]
    torch.compile(s_branches, backend=lambda gm, example_inputs: graphs.append(gm) or gm)(*args)
    torch.compile(two_user_streams, backend="eager")(torch.randn(4))  # index 0 of the table: a user stream
    p = sp.StreamPass()
    with spi.enabled(p):
        torch._inductor.compile_fx.compile_fx(graphs[0], list(args))
    assert [(r.streams, r.indices) for r in p.reports] == [([0, 1, 2], "dynamo")]


def sp0_inside_a_user_stream(x):
    with S1:
        a = x.sin()
        with sp.stream(0):  # dynamo's index 0 on CPU: S1, the first object the function uses
            b = x.cos()
    return a + b


def sp1_next_to_two_user_streams(x):
    c = two_user_streams(x)
    with sp.stream(1):  # dynamo's index 1: S2
        d = x.tan()
    return c * d


def sp1_next_to_one_user_stream(x):
    with S1:  # index 0
        a = x.sin()
    with sp.stream(1):  # index 1: no object of the function's there
        b = x.cos()
    return a + b


@pytest.mark.parametrize("fn", [sp0_inside_a_user_stream, sp1_next_to_two_user_streams], ids=lambda f: f.__name__)
def test_sp_stream_on_an_index_a_user_stream_holds_is_that_stream_and_warns(fn):
    with pytest.warns(
        sp.StreamPassWarning,
        match=r"sp.stream\(\d\) is index \d of dynamo's object table, which holds this function's Stream",
    ):
        p, _ = compile_and_compare(fn, torch.randn(4))
    (r,) = p.reports
    n_user = 1 if fn is sp0_inside_a_user_stream else 2
    assert r.streams == list(range(n_user + 1)) and not r.hazards_after  # one stream for both


def test_sp_stream_next_to_user_streams_on_a_free_index_is_a_stream_of_its_own(recwarn):
    p, _ = compile_and_compare(sp1_next_to_one_user_stream, torch.randn(4))
    assert p.reports[0].streams == [0, 1, 2] and not [w for w in recwarn if w.category is sp.StreamPassWarning]


# --------------------------------------------------------------------------------------------
# Activation checkpointing: the backward recomputes stream work
# --------------------------------------------------------------------------------------------
def _checkpointed(inner):
    def f(x, w, w2):
        y = torch.utils.checkpoint.checkpoint(inner, x, w, use_reentrant=False)
        with sp.stream(2):
            z = torch.sigmoid(x @ w2)
        return y + z

    return f


def _checkpoint_inputs():
    return [torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16)]


def _torch_stream_block(x, w):
    with S1:
        y = torch.relu(x @ w)
    return y * 2


def _sp_stream_block(x, w):
    with sp.stream(1):
        y = torch.relu(x @ w)
    return y * 2


def _synced_block(x, w):
    with AMB:
        e = torch.Event("cpu")
        with S1:
            y = torch.relu(x @ w)
            e.record()
        e.wait()
        return y * 2


@pytest.mark.parametrize("inner", [_torch_stream_block, _sp_stream_block], ids=["torch.Stream", "sp.stream"])
def test_a_checkpointed_stream_block_is_recomputed_on_its_stream(inner):
    """``torch.utils.checkpoint`` makes the backward recompute the block's relu instead of saving
    it: the recomputation runs on the block's stream, and the backward's syncs cover it."""
    p, _ = compile_and_compare(_checkpointed(inner), *_checkpoint_inputs(), training=True)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    backward = p.reports[1].verified_graph
    relus = [n for n in backward.graph.nodes if n.target is torch.ops.aten.relu.default]
    assert relus, "the checkpointed relu was saved, not recomputed: this test no longer tests recomputation"
    assert {sp.read_streams(backward).stream[n] for n in relus} == {1}


def test_user_syncs_inside_a_checkpointed_block_fail_in_torch_not_in_streampass(tmp_path, monkeypatch):
    """An ``Event.record()``/``wait()`` pair inside a checkpointed block: torch's min-cut
    partitioner (before any post-grad pass) cannot recompute a ``control_deps`` sync, and
    refuses the joint graph on torch 2.13 and 2.15. Under streampass the compile must work or fail
    exactly as it does with plain AOT autograd and no streampass at all."""
    monkeypatch.chdir(tmp_path)  # a failing partition draws min_cut_failed*.svg into the working directory
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.compilers import nop
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    fn = _checkpointed(_synced_block)
    inputs = _checkpoint_inputs()
    plain = aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=min_cut_rematerialization_partition)
    try:
        with spi.cpu_safe_aot_stream_passes():  # torch's own AOT stream pass crashes on CPU first
            torch.compile(fn, backend=plain)(*[t.clone().requires_grad_() for t in inputs]).sum().backward()
        torch_says = None
    except torch._dynamo.exc.BackendCompilerFailed as e:
        torch_says = str(e).splitlines()[1]
    except RuntimeError as e:  # torch 2.11 partitions it; its eager CPU events then cannot run
        if "doesn't support events" not in str(e):
            raise
        torch_says = None
    torch._dynamo.reset()
    # the reference's serial run cannot skip syncs inside checkpoint's subgraph: the same math, unsynced
    same = _checkpointed(_torch_stream_block)
    if torch_says is None:
        compile_and_compare(fn, *inputs, training=True, eager=same)
        return
    # Without Graphviz's `dot`, torch's failure report trips over its own drawing first (it draws
    # the min cut with pydot, which streampass installs): torch's message, under streampass too.
    assert "failed to partition" in torch_says or ("dot" in torch_says and shutil.which("dot") is None)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as raised:
        compile_and_compare(fn, *inputs, training=True, eager=same)
    assert str(raised.value).splitlines()[1] == torch_says


# --------------------------------------------------------------------------------------------
# The pass in torch's deep-copied config (item 4)
# --------------------------------------------------------------------------------------------
def f_one(x):
    with sp.stream(1):
        y = x.sin()
    return y + 1


def f_two(x):
    with sp.stream(1):
        y = x.cos()
    return y * 2


def test_a_pass_that_kept_graphs_survives_the_next_compile():
    p = sp.StreamPass(keep_graphs=True)
    assert copy.deepcopy(p) is p
    with spi.enabled(p):
        torch.compile(f_one)(torch.ones(4))
        torch.compile(f_two)(torch.ones(4))
    assert len(p.reports) == 2 and all(sp.verify(r.verified_graph).ok for r in p.reports)


# --------------------------------------------------------------------------------------------
# A training loop, cold and warm caches, in fresh processes
# --------------------------------------------------------------------------------------------
def _job(mode: str, cache: str, model: str = "two_branch") -> dict:
    """tests/training_job.py in a process of its own (``mode``: enabled, enable, auto, eager;
    ``model``: two_branch, wait_stream)."""
    return job("training_job.py", mode, model, cache=cache)


@pytest.mark.slow
def test_training_loop_cold_then_warm(tmp_path):
    cache = str(tmp_path / "cache")
    eager = _job("eager", cache)
    cold = _job("enabled", cache)
    warm = _job("enabled", cache)
    for run in (cold, warm):
        assert run["losses"] == pytest.approx(eager["losses"], rel=1e-5)
        assert run["checksum"] == pytest.approx(eager["checksum"], rel=1e-5) and run["steps"] == 3
    # cold: both graphs compiled through StreamPass and verified clean
    assert cold["fx_miss"] == 2 and cold["aot_miss"] == 1
    assert [r[0] for r in cold["reports"]] == ["forward", "backward"] and all(r[3] for r in cold["reports"])
    assert all(r[1] > 0 and r[2] > 0 for r in cold["reports"])
    # warm: everything from the caches, the pass never ran, the same syncs ran
    assert warm["aot_hit"] == 1 and warm["aot_miss"] == 0 and warm["reports"] == []
    assert warm["syncs"] == cold["syncs"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not compat.STREAM_METHODS_ARE_OPS, reason="torch 2.11 runs wait_stream while tracing")
def test_a_warm_process_takes_the_backward_of_a_forward_with_wait_stream_from_the_cache(tmp_path):
    """A forward with ``s.wait_stream(...)`` compiles in every process on 2.13 and later (its
    ``control_deps`` keep it out of the FX-graph cache); its backward has no user sync and comes
    from the cache warm. torch 2.13 threads the wait's dependencies in a set's order, which
    differs between processes, so the saved tensors, and with them the backward's cache key,
    changed: the warm process compiled the backward again (streampass.aot_guard puts them in
    graph order)."""
    cache = str(tmp_path / "cache")
    eager = _job("eager", cache, "wait_stream")
    cold = _job("enabled", cache, "wait_stream")
    warm = _job("enabled", cache, "wait_stream")
    for run in (cold, warm):
        assert run["losses"] == pytest.approx(eager["losses"], rel=1e-5)
        assert run["checksum"] == pytest.approx(eager["checksum"], rel=1e-5) and run["steps"] == 3
        assert all(r[3] for r in run["reports"])
    assert [r[0] for r in cold["reports"]] == ["forward", "backward"]
    # the forward too comes from the cache where torch wraps no control_deps around it (2.12)
    assert "backward" not in [r[0] for r in warm["reports"]] and warm["fx_hit"] >= 1
    assert warm["syncs"] == cold["syncs"] > 0


@pytest.mark.slow
def test_training_loop_warm_on_a_fresh_machine_from_saved_cache_artifacts(tmp_path):
    """torch's portable caches (``torch.compiler.save_cache_artifacts`` after a cold run, loaded
    into an empty cache folder by a new process, as a job warms a fresh machine): the warm
    process takes both graphs from them, StreamPass has nothing to compile, and the cached code
    runs the same syncs and trains as eager does."""
    artifacts = tmp_path / "artifacts.bin"
    cold = job("training_job.py", "enabled", "two_branch", f"save={artifacts}", cache=str(tmp_path / "a"))
    warm = job("training_job.py", "enabled", "two_branch", f"load={artifacts}", cache=str(tmp_path / "b"))
    eager = _job("eager", str(tmp_path / "c"))
    assert [r[0] for r in cold["reports"]] == ["forward", "backward"] and all(r[3] for r in cold["reports"])
    assert warm["reports"] == [] and warm["fx_hit"] == 2 and warm["fx_miss"] == 0
    assert warm["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert warm["checksum"] == pytest.approx(eager["checksum"], rel=1e-5)
    assert warm["syncs"] == cold["syncs"] > 0


@pytest.mark.slow
def test_training_loop_after_enable(tmp_path):
    run = _job("enable", str(tmp_path / "cache"))
    eager = _job("eager", str(tmp_path / "cache"))
    assert run["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert [r[0] for r in run["reports"]] == ["forward", "backward"] and all(r[3] for r in run["reports"])
    assert run["syncs"] > 0


def test_standalone_compile_of_a_dynamo_graph_and_its_saved_artifact_run_the_syncs(tmp_path):
    """``torch._inductor.standalone_compile`` (how serving engines precompile the graphs dynamo
    hands their backend) under ``enabled()``, then the artifact saved and loaded again: both
    run every sync the pass planned and compute what the function does."""
    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm

    args = [torch.randn(8, 8) for _ in range(3)]
    torch.compile(s_branches, backend=grab)(*args)
    p = sp.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        artifact = torch._inductor.standalone_compile(graphs[0], list(args), dynamic_shapes="from_example_inputs")
    (r,) = p.reports
    assert r.streams == [0, 1, 2] and sp.verify(r.verified_graph).ok
    artifact.save(path=str(tmp_path / "artifact.bin"), format="binary")
    loaded = torch._inductor.CompiledArtifact.load(path=str(tmp_path / "artifact.bin"), format="binary")
    for compiled in (artifact, loaded):
        before = sum(spi.RUNTIME_SYNCS.values())
        (got,) = compiled(*args)
        torch.testing.assert_close(got, s_branches(*args))
        assert sum(spi.RUNTIME_SYNCS.values()) - before >= planned_syncs(r.verified_graph)


def test_an_out_of_process_compile_mode_still_compiles_with_streampass(monkeypatch):
    """``TORCHINDUCTOR_FX_COMPILE_MODE=subprocess`` (read once, into ``compile_fx.fx_compile_mode``)
    sends the compile worker inductor's config without post-grad custom passes: the annotated
    graph compiled without StreamPass (on CPU: ``NameError: name 'stream1' is not defined``; on a
    GPU it would run with no syncs). Compiles with StreamPass stay in process, with a warning,
    forward and backward; the mode is put back after each."""
    from torch._inductor import compile_fx

    monkeypatch.setattr(compile_fx, "fx_compile_mode", compile_fx.FxCompileMode.SUBPROCESS)
    args_e = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    args_c = [t.detach().clone().requires_grad_() for t in args_e]
    want = s_branches(*args_e)
    want.sum().backward()
    p = sp.StreamPass(keep_graphs=True)
    before = sum(spi.RUNTIME_SYNCS.values())
    with pytest.warns(sp.StreamPassWarning, match="compiled in this process"):
        with spi.enabled(p):
            got = torch.compile(s_branches)(*args_c)
        got.sum().backward()
    torch.testing.assert_close(got, want)
    for c, e in zip(args_c, args_e):
        torch.testing.assert_close(c.grad, e.grad)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    assert all(sp.verify(r.verified_graph).ok for r in p.reports)
    assert sum(spi.RUNTIME_SYNCS.values()) - before >= sum(planned_syncs(r.verified_graph) for r in p.reports)
    assert compile_fx.fx_compile_mode == compile_fx.FxCompileMode.SUBPROCESS


def test_threads_overlapping_in_the_out_of_process_override_keep_it_until_the_last_is_done(monkeypatch):
    """torch's out-of-process switch is a module global. Two compiles with StreamPass in two
    threads: the second starts while the first's override holds (it sees the in-process mode)
    and must keep it after the first is done, or it compiles out of process without StreamPass."""
    from torch._inductor import compile_fx

    from streampass import compile_hook

    SUBPROCESS, NORMAL = compile_fx.FxCompileMode.SUBPROCESS, compile_fx.FxCompileMode.NORMAL
    monkeypatch.setattr(compile_fx, "fx_compile_mode", SUBPROCESS)
    first, second = compile_hook._in_process(), compile_hook._in_process()
    with pytest.warns(sp.StreamPassWarning):
        first.__enter__()
    second.__enter__()  # the other thread, started inside the first's override
    first.__exit__(None, None, None)
    assert compile_fx.fx_compile_mode == NORMAL
    second.__exit__(None, None, None)
    assert compile_fx.fx_compile_mode == SUBPROCESS


def test_compiled_autograd_runs_the_backward_right_on_one_stream():
    """Compiled autograd copies the AOT backward's nodes, stream annotations included, into its
    own graph, but dynamo re-traces that graph and drops them (torch 2.13): the backward
    StreamPass sees is on one stream. Results must still equal eager (docs/inductor.md)."""
    args_e = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    args_c = [t.detach().clone().requires_grad_() for t in args_e]
    s_branches(*args_e).sum().backward()
    p = sp.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        out = torch.compile(s_branches)(*args_c)
        with torch._dynamo.compiled_autograd._enable(torch.compile):
            out.sum().backward()
    for c, e in zip(args_c, args_e):
        torch.testing.assert_close(c.grad, e.grad)
    forward = next(r for r in p.reports if r.graph == "forward")
    assert forward.streams == [0, 1, 2] and sp.verify(forward.verified_graph).ok
    assert len(p.reports) >= 2  # the compiled-autograd graph went through the pass too


def _on_stream_k(x, k):
    with sp.stream(k):
        y = x.sin()
    return y + x.cos()


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic dynamic", "dynamic=True"])
def test_a_stream_index_passed_as_an_argument_may_change_between_calls(dynamic):
    """dynamo makes an int argument that changed between calls symbolic (every int with
    dynamic=True), and the annotation needs a constant: this crashed inside dynamo
    (AsPythonConstantNotImplementedError). sp.stream now pins k's value with guards, so each k
    compiles once and runs on its own stream."""
    torch._dynamo.reset()
    p = spi.StreamPass()
    x = torch.randn(8)
    f = torch.compile(_on_stream_k, dynamic=dynamic)
    with spi.enabled(p):
        for k in (1, 2, 3, 2):
            torch.testing.assert_close(f(x, k), _on_stream_k(x, k))
    assert sorted({tuple(r.streams) for r in p.reports}) == [(0, 1), (0, 2), (0, 3)]


def test_compiling_a_graph_run_already_rewrote_gives_the_graphs_result():
    """torch.compile of sp.run's result: dynamo cannot trace the control_deps syncs (a graph
    break at each) and compiles each shared sync body on its own frame, where the event index,
    an argument that changes between calls, becomes a graph input. StreamPass refused that
    graph (InductorError: "argument 'event_index' must be an int, got arg0_1"); it leaves it as
    it is, with a warning, and the result is plain torch.compile's."""

    def f(x, w):
        with sp.stream(1):
            a = (x @ w).relu()
        return a + x.sin()

    torch._dynamo.reset()
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w)
    assert sp.run(gm).ok
    with pytest.warns(sp.StreamPassWarning, match="index known only at run time"), spi.enabled() as p:
        out = torch.compile(gm)(x, w)
    torch.testing.assert_close(out, f(x, w))
    assert p.reports  # the graphs with nothing of the kind went through the pass as usual


def test_a_compile_inside_an_eager_stream_block_warns(fresh_caches):
    """An eager `with sp.stream(1):` around a call of a compiled function: dynamo copied the
    block's annotation onto the whole graph with no guard, so whichever call compiled first
    decided the streams of every later call, silently. It still does (torch's), but says so."""

    def inner(x):
        return (x.sin() * 2).cos()

    x = torch.randn(8)
    compiled = torch.compile(inner)
    with spi.enabled():
        with sp.stream(1), pytest.warns(sp.StreamPassWarning, match=r"inside an eager `with sp.stream\(1\)` block"):
            torch.testing.assert_close(compiled(x), inner(x))
    torch._dynamo.reset()
    with spi.enabled(), warnings.catch_warnings():
        warnings.simplefilter("error", sp.StreamPassWarning)
        torch.testing.assert_close(torch.compile(inner)(x), inner(x))  # no block: no warning


@pytest.mark.parametrize(
    "k, says",
    [
        (-1, "stream index must be >= 0, got -1"),
        (2**19, "indices above 524287 are streampass's own"),
        (1.5, r"stream index must be an int, got 1.5 \(float\)"),
        (torch.tensor(1), "stream index must be an int, got a Tensor"),
    ],
    ids=["negative", "streampass's own", "float", "tensor"],
)
@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_refused_sp_stream_index_says_why_under_torch_compile(k, says, fullgraph):
    """Review: under ``torch.compile`` a bad ``sp.stream(k)`` failed inside dynamo, which could
    not build a StreamPassError (nor print a tensor): ``Attempted to call a super() attribute``.
    Without ``fullgraph`` it now reaches the caller; with it, dynamo reports the exception it
    raised, as it does for any exception in a full graph."""

    def f(x):
        with sp.stream(k):
            return x.sin()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=fullgraph)
    if not fullgraph:
        with pytest.raises(sp.StreamPassError, match=says), spi.enabled():
            compiled(torch.ones(3))
        return
    with pytest.raises(Exception, match=r"raised exception StreamIndexError\(.*" + says) as caught, spi.enabled():
        compiled(torch.ones(3))
    assert not isinstance(caught.value, sp.StreamPassError)  # dynamo's own error, naming ours


def sp1_on_the_index_of_an_event(x):
    s = torch.Stream("cpu")  # index 0 on CPU
    with s:
        e = torch.Event("cpu")  # index 1
        e.record()
        with sp.stream(1):
            y = x.sin()
        e.wait()
    return y + x


def test_sp_stream_on_an_index_an_event_holds_is_refused_naming_it():
    """Kernels cannot run on an event: refused before any edit, on CPU as on CUDA, with the index
    the user wrote. Before, CPU warned "one stream", then the reading refused "index 2" (found by
    a compile fuzz)."""
    with spi.enabled(), pytest.raises(Exception, match=r"sp.stream\(1\) is index 1 .* holds this function's Event"):
        torch.compile(sp1_on_the_index_of_an_event)(torch.randn(4))

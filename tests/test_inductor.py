"""torch.compile + inductor with StreamPass as the post-grad custom pass, end to end on CPU."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd import graph_capture
from torch._inductor.custom_graph_pass import CustomGraphPass

import streampass as sp
import streampass.inductor as spi
from streampass import aot_guard, ops
from streampass.compat import post_grad_config
from streampass.ops import AMBIENT

from graphs import ancestors, reserve_stream_indices, wrap_syncs_in_control_deps

# --------------------------------------------------------------------------------------------
# Scenarios: each takes ``ctx(k)``, the way a block says "run on stream k".
# --------------------------------------------------------------------------------------------


def branches(ctx, x, y):
    a = x.sin()
    with ctx(1):
        b = y.cos() * 2
    with ctx(2):
        c = x.exp() + 1
    return a * b + c


def fanout(ctx, x, y):
    with ctx(1):
        p = (x * y).sin()
    with ctx(2):
        a = p.cos()
    with ctx(3):
        b = p.exp()
    d = p + 1
    return a + b * d


def nested(ctx, x, y):
    with ctx(1):
        a = x.sin()
        with ctx(2):
            b = a.cos() * y
        c = a * b
    return c + x


def chain(ctx, x, y):
    for i in range(8):
        with ctx(1 + i % 2):
            y = (y * x).sin() + 1
    return y


def inplace(ctx, buf, y):
    with ctx(1):
        buf.add_(y.detach() * 2)
    return buf * y + 1


def ambient(ctx, x, y):
    return (x.sin() * y).cos() + 1


SCENARIOS = {f.__name__: f for f in (branches, fanout, nested, chain, inplace, ambient)}
MULTI_STREAM = {"branches", "fanout", "nested", "chain", "inplace"}

# dynamo-captured torch.Stream contexts: one CPU stream object per index. On CPU dynamo gives
# index 0 to the first stream the function uses; StreamPass moves every index up by one so that
# it is a side stream like the others (streampass.transform.dynamo_indices).
_CPU_STREAMS = {k: torch.Stream("cpu") for k in (1, 2, 3)}
STYLES = {
    "sp.stream": sp.stream,
    "torch.Stream": lambda k: _CPU_STREAMS[k],
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """No FX/AOT cache reuse between tests: several compile the same program, and each must see
    the pass run (tests/test_compile_use.py runs with the caches on)."""
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def _inputs(name):
    torch.manual_seed(0)
    return torch.randn(8, 8), torch.randn(8, 8)


def compare_with_eager(cfn, reference, x, y, mode, inplace, warmup=False):
    """Run the compiled ``cfn`` and ``reference`` on copies of (x, y): outputs, mutated x, grads."""
    if mode == "inference":
        with torch.no_grad():
            xc, xe = x.clone(), x.clone()
            if warmup:
                cfn(xc.clone(), y)  # compile outside whatever the caller measures
            return (cfn(xc, y), xc), (reference(xe, y), xe)
    xc, xe = x.clone(), x.clone()
    if not inplace:
        xc.requires_grad_(), xe.requires_grad_()
    yc, ye = y.clone().requires_grad_(), y.clone().requires_grad_()
    out_c, out_e = cfn(xc, yc), reference(xe, ye)
    out_c.sum().backward()
    out_e.sum().backward()
    got = (out_c, xc.detach(), yc.grad) + ((xc.grad,) if xc.requires_grad else ())
    want = (out_e, xe.detach(), ye.grad) + ((xe.grad,) if xe.requires_grad else ())
    return got, want


def _compile_and_run(name, style, mode, pass_=None):
    """Compile scenario ``name`` under StreamPass; returns (outputs, eager outputs, pass, run-time syncs)."""
    scenario, ctx = SCENARIOS[name], STYLES[style]

    def fn(x, y):
        return scenario(ctx, x, y)

    x, y = _inputs(name)
    pass_ = pass_ if pass_ is not None else spi.StreamPass(keep_graphs=True)
    syncs0 = sum(spi.RUNTIME_SYNCS.values())
    with spi.enabled(pass_):
        cfn = torch.compile(fn, backend="inductor", fullgraph=True)
        got, want = compare_with_eager(cfn, fn, x, y, mode, inplace=name == "inplace")
    return got, want, pass_, sum(spi.RUNTIME_SYNCS.values()) - syncs0


CASES = [(name, style, mode) for name in SCENARIOS for style in STYLES for mode in ("inference", "training")]


@pytest.mark.parametrize("name,style,mode", CASES, ids=["-".join(c) for c in CASES])
def test_end_to_end(name, style, mode):
    got, want, p, runtime_syncs = _compile_and_run(name, style, mode)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    kinds = [r.graph for r in p.reports]
    assert kinds == (["inference"] if mode == "inference" else ["forward", "backward"])
    for r in p.reports:
        if r.result is not None:
            assert r.result.after.ok, r.result.after
            assert sp.verify(r.verified_graph).ok
            # nothing stream-related reaches inductor's CPU codegen
            assert r.lowering == "cpu"
    if name in MULTI_STREAM:
        fwd = p.reports[0]
        assert fwd.changed and fwd.records_added > 0 and fwd.waits_added > 0
        assert len(fwd.streams) >= 2 and fwd.cross_stream_edges > 0
        assert sum(fwd.hazards_before.values()) > 0 and not fwd.hazards_after
        assert runtime_syncs >= fwd.records_added + fwd.waits_added
    else:
        assert all(r.records_added == r.waits_added == 0 and r.streams == [0] for r in p.reports)
        assert runtime_syncs == 0
        assert all(not r.changed and r.lowering == "none" for r in p.reports)
    if style == "torch.Stream" and name in MULTI_STREAM:
        # dynamo's index 0 is the first user stream: read as a side stream, not the ambient one
        assert {r.indices for r in p.reports} == {"dynamo+1"}
        kept = [r.verified_graph for r in p.reports if r.verified_graph is not None]
        assert kept and AMBIENT not in {s for gm in kept for s in _annotated_streams(gm)}


def _annotated_streams(gm):
    return {n.meta["custom"]["stream"] for n in gm.graph.nodes if "stream" in n.meta.get("custom", {})}


# --------------------------------------------------------------------------------------------
# Installing next to a user's pass; a graph with only the ambient stream is left alone
# --------------------------------------------------------------------------------------------
class Recorder(CustomGraphPass):
    """A user's post-grad pass: remembers the graph code it saw."""

    def __init__(self, tag):
        self.tag, self.seen = tag, []

    def __call__(self, graph):
        graph.owning_module.recompile()
        self.seen.append(graph.owning_module.code)

    def uuid(self):
        return self.tag


def test_with_streampass_composes_and_does_not_double():
    user = Recorder("user")
    passes = spi.with_streampass(user)
    assert passes[0] is user and isinstance(passes[1], spi.StreamPass)
    assert spi.with_streampass(passes) == passes
    assert spi.with_streampass(None)[0].__class__ is spi.StreamPass
    with inductor_config.patch(post_grad_custom_post_pass=user):
        with spi.enabled() as p:
            assert inductor_config.post_grad_custom_post_pass == post_grad_config([user, p])
        assert inductor_config.post_grad_custom_post_pass is user


def test_user_pass_runs_and_ambient_graph_is_unchanged():
    before, after = Recorder("before"), Recorder("after")
    p = spi.StreamPass()
    chain = post_grad_config([before, p, after])  # a list where inductor takes one (torch >= 2.13)
    with inductor_config.patch(post_grad_custom_post_pass=chain), spi.cpu_safe_aot_stream_passes():
        fn = lambda x, y: ambient(None, x, y)
        x, y = _inputs("ambient")
        torch.testing.assert_close(torch.compile(fn, backend="inductor")(x, y), fn(x, y))
    assert len(before.seen) == len(after.seen) == 1
    assert before.seen == after.seen
    assert [(r.changed, r.lowering) for r in p.reports] == [(False, "none")]


def test_user_pass_kept_when_streams_are_used():
    user = Recorder("user")
    with inductor_config.patch(post_grad_custom_post_pass=user):
        got, want, p, _ = _compile_and_run("branches", "sp.stream", "inference")
    torch.testing.assert_close(got, want)
    assert len(user.seen) == 1 and p.reports[0].records_added > 0
    # the user's pass ran first: it saw the graph without streampass's syncs
    assert "control_deps" not in user.seen[0] and "streampass" not in user.seen[0]


# --------------------------------------------------------------------------------------------
# uuid and inductor's FX graph cache
# --------------------------------------------------------------------------------------------
def test_uuid_stable_across_instances_and_processes():
    import subprocess
    import sys

    here = spi.StreamPass().uuid()
    assert here == spi.StreamPass(keep_graphs=True).uuid() and isinstance(here, bytes)
    code = "import streampass.inductor as s; print(s.StreamPass().uuid().hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == here.hex()


@pytest.mark.parametrize("name", ["branches", "ambient"])
def test_each_compiled_graph_is_read_once(name, monkeypatch):
    """One reading of each graph, before the pass, which ``run`` and the report share; run's
    region check and the lowering use the edit's kept reading of the result (it was four)."""
    import sys

    from streampass.analysis import reading

    original, read = reading.read_streams, []

    def counted(g, *args, **kwargs):
        read.append(id(getattr(g, "graph", g)))
        return original(g, *args, **kwargs)

    for module in [m for n, m in sys.modules.items() if n.startswith("streampass")]:
        if getattr(module, "read_streams", None) is original:
            monkeypatch.setattr(module, "read_streams", counted)
    got, want, p, _ = _compile_and_run(name, "sp.stream", "training")
    torch.testing.assert_close(got, want)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    per_graph = sorted(read.count(g) for g in set(read))
    assert per_graph == [1, 1]


@pytest.mark.parametrize("lower", ["lower_for_cpu", "lower_for_gpu"])
def test_a_failed_lowering_leaves_the_graph_as_run_left_it(lower, monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    from streampass.transform import lower as lowering

    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + x.cos()

    gm = make_fx(f)(torch.ones(4))
    sp.run(gm)
    code, nodes = gm.code, [(n.name, n.target, n.args) for n in gm.graph.nodes]

    def fails(_gm):
        raise RuntimeError("a lowering step failed")

    monkeypatch.setattr(lowering, "_drop_unused_subgraphs", fails)  # the last edit of both lowerings
    with pytest.raises(RuntimeError, match="a lowering step failed"):
        getattr(lowering, lower)(gm)
    assert gm.code == code and [(n.name, n.target, n.args) for n in gm.graph.nodes] == nodes
    torch.testing.assert_close(gm(torch.ones(4)), f(torch.ones(4)))


def _copied_sources(tmp_path, monkeypatch):
    files = []
    root = Path(spi.__file__).resolve().parent
    for f in spi._source_files():
        dst = tmp_path / Path(f).relative_to(root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(Path(f).read_text())
        files.append(str(dst))
    monkeypatch.setattr(spi, "_source_files", lambda: tuple(files))
    return files


def test_uuid_changes_when_pass_source_changes(tmp_path, monkeypatch):
    original = spi.StreamPass().uuid()
    files = _copied_sources(tmp_path, monkeypatch)
    assert spi.StreamPass().uuid() == original
    for f in files:
        if f.endswith("transform/plan.py"):
            with open(f, "a") as fh:
                fh.write("\n# a change\n")
    assert spi.StreamPass().uuid() != original


def test_fx_graph_cache_hit_then_miss_after_uuid_change(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    files = _copied_sources(tmp_path / "src", monkeypatch)

    def compile_once():
        torch._dynamo.reset()
        counters.clear()
        p = spi.StreamPass()
        syncs0 = sum(spi.RUNTIME_SYNCS.values())
        with inductor_config.patch(fx_graph_cache=True, fx_graph_remote_cache=False), spi.enabled(p):
            fn = lambda x, y: branches(sp.stream, x, y)
            x, y = _inputs("branches")
            torch.testing.assert_close(torch.compile(fn, backend="inductor")(x, y), fn(x, y))
        c = counters["inductor"]
        return c["fxgraph_cache_hit"], c["fxgraph_cache_miss"], len(p.reports), sum(spi.RUNTIME_SYNCS.values()) - syncs0

    first = compile_once()
    assert first[:3] == (0, 1, 1)
    second = compile_once()
    assert second[:3] == (1, 0, 0)  # a hit: the pass did not even run
    assert second[3] == first[3] > 0  # and the cached code still performs every sync
    with open(files[0], "a") as fh:
        fh.write("\n# streampass changed\n")
    third = compile_once()
    assert third[:3] == (0, 1, 1)


# --------------------------------------------------------------------------------------------
# torch's own AOT syncs: reused, and only the missing ones added
# --------------------------------------------------------------------------------------------
def _backward_graph():
    """p on stream 1, read on stream 2 and on the ambient stream; tagged as backward nodes."""
    g = torch.fx.Graph()
    v = torch.empty(4, device="meta")  # not CPU: insert_backward_syncs skips CPU producers
    x = g.placeholder("x")
    x.meta["val"] = v

    def op(fn, args, s):
        n = g.call_function(fn, args)
        n.meta.update(val=v, custom={"stream": s}, partitioner_tag="is_backward")
        return n

    aten = torch.ops.aten
    p = op(aten.sin.default, (x,), 1)
    a = op(aten.cos.default, (p,), 2)
    b = op(aten.exp.default, (p,), 0)
    g.output((op(aten.add.Tensor, (a, b), 0),))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _waits(gm):
    return [c.node for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_EVENT]


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "control_deps"])
def test_reuses_torch_backward_syncs_and_adds_only_missing(wrapped):
    from torch._dynamo import graph_bytecode_inputs
    from torch._functorch._aot_autograd import streams as aot_streams

    reserve_stream_indices(3)
    gm = _backward_graph()
    aot_streams.insert_backward_syncs(gm)
    if wrapped:
        wrap_syncs_in_control_deps(gm)
    gm.recompile()
    graph_bytecode_inputs.reset_user_object_tracking()
    torch_waits = _waits(gm)
    assert len(torch_waits) == 2
    missing = sp.verify(gm)
    # torch's pass leaves the fan-out read of p on the ambient stream without a wait
    assert any(h.kind == "raw" and "exp" in h.message for h in missing.hazards)

    p = spi.StreamPass(keep_graphs=True)
    p(gm.graph, is_inference=False)
    (report,) = p.reports
    result, out = report.result, report.verified_graph
    assert result.ok and sp.verify(out).ok
    # one wait per missing requirement and per capture join, torch's two waits reused, none duplicated
    assert len(missing.hazards) == 4
    assert result.waits_added == len(missing.hazards) + result.plan.capture_joins
    assert len(_waits(out)) == len(torch_waits) + result.waits_added
    # as many waits in all as planning from scratch adds: torch's 2 are reused, not doubled
    scratch = sp.run(_backward_graph(), bind_runtime=False)
    assert scratch.waits_added == len(torch_waits) + result.waits_added


# --------------------------------------------------------------------------------------------
# Observability
# --------------------------------------------------------------------------------------------
def test_one_info_line_per_compiled_graph(caplog):
    with caplog.at_level(logging.INFO, logger="streampass"):
        _compile_and_run("branches", "sp.stream", "training")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("streampass")]
    assert len(lines) == 2
    assert lines[0].startswith("streampass [forward, cpu]: streams [0, 1, 2]")
    assert lines[1].startswith("streampass [backward, cpu]")
    for line in lines:
        assert "cross-stream edge(s)" in line and "record(s)" in line and "wait(s)" in line
        assert "-> 0 after" in line and "hazards 0 before" not in line


def test_report_is_a_structured_trace_artifact():
    calls = []

    def fake_trace_structured(name, metadata_fn=None, payload_fn=None, **kw):
        if name == "artifact" and metadata_fn is not None and metadata_fn().get("name") == "streampass_report":
            calls.append((metadata_fn(), payload_fn()))

    with mock.patch.object(torch._logging, "trace_structured", fake_trace_structured):
        _, _, p, _ = _compile_and_run("fanout", "sp.stream", "inference")
    assert len(calls) == 1
    meta, payload = calls[0]
    assert meta == {"name": "streampass_report", "encoding": "json"}
    data = json.loads(payload)
    r = p.reports[0]
    assert data["graph"] == "inference" and data["streams"] == [0, 1, 2, 3]
    assert data["records_added"] == r.records_added > 0 and data["waits_added"] == r.waits_added
    assert data["hazards_after"] == {} and sum(data["hazards_before"].values()) > 0


# --------------------------------------------------------------------------------------------
# The guard for torch's AOT stream passes
# --------------------------------------------------------------------------------------------
def test_aot_guard_skips_cpu_graphs_only_and_restores():
    original = graph_capture.sync_deallocations
    seen = []
    with mock.patch.object(graph_capture, "sync_deallocations", lambda gm: seen.append(gm)):
        inner = graph_capture.sync_deallocations
        aot_guard._guarded_sync_deallocations.cache_clear()
        try:
            with spi.cpu_safe_aot_stream_passes():
                with spi.cpu_safe_aot_stream_passes():
                    guarded = graph_capture.sync_deallocations
                assert graph_capture.sync_deallocations is guarded  # still on in the outer block
                cpu, meta = _backward_graph(), _backward_graph()
                for n in cpu.graph.nodes:
                    if "val" in n.meta:
                        n.meta["val"] = torch.empty(4)
                guarded(cpu)
                guarded(meta)
            assert graph_capture.sync_deallocations is inner
        finally:
            aot_guard._guarded_sync_deallocations.cache_clear()
    assert seen == [meta]
    assert graph_capture.sync_deallocations is original


@contextlib.contextmanager
def _aot_streams_function_in_the_guard(name: str, fake):
    """``fake`` stands in for torch's ``streams.<name>``; inside, the AOT guard is on and the
    function it installed for ``name`` is yielded; after, ``fake`` is back, then torch's own."""
    from torch._functorch._aot_autograd import streams

    original = getattr(streams, name, None)
    with mock.patch.object(streams, name, fake, create=True):
        aot_guard._sync_deps_guards.cache_clear()
        try:
            with spi.cpu_safe_aot_stream_passes():
                yield getattr(streams, name)
            assert getattr(streams, name) is fake
        finally:
            aot_guard._sync_deps_guards.cache_clear()
    assert getattr(streams, name, None) is original


def test_sync_deps_guards_drop_backward_deps_of_a_forward_wait_inside_the_guard_only():
    """torch 2.13's pre-pass of wrap_all_sync_nodes_with_control_deps (aot_guard.py) is swapped
    inside the guard and back after it: a forward wait drops what only the backward has
    (``tangents_1``) and keeps the rest, a graph input copied back into included; a backward
    wait keeps the backward's."""
    g = torch.fx.Graph()
    x, buf, t = g.placeholder("primals_1"), g.placeholder("primals_2"), g.placeholder("tangents_1")
    t.meta["partitioner_tag"] = "is_backward"
    fw_wait = g.call_function(ops.WAIT_STREAM, (0, 1))
    bw_wait = g.call_function(ops.WAIT_STREAM, (0, 1))
    bw_wait.meta["partitioner_tag"] = "is_backward"
    g.call_function(torch.ops.aten.copy_.default, (buf, x))
    found = {fw_wait: [x, buf, t], bw_wait: [x, buf, t]}
    with _aot_streams_function_in_the_guard("_collect_wait_stream_forward_deps", lambda graph: found) as guarded:
        assert guarded(g) == {fw_wait: [x, buf], bw_wait: [x, buf, t]}


def test_sync_deps_guards_drop_backward_deps_of_every_forward_sync_from_2_14s_pre_pass():
    """torch 2.14 and 2.15 collect, before wrapping, what each wait and each CPU barrier threads
    (``_collect_sync_forward_deps``: two maps, sync -> dependencies) and count an untagged
    gradient view as forward, so a forward sync could get ``tangents_1`` (aot_guard.py). Inside
    the guard a forward sync of either map drops the backward's, a backward sync keeps them all,
    the kind of set torch returns is kept, and torch's own function is back after it."""
    from torch.utils._ordered_set import OrderedSet

    g = torch.fx.Graph()
    x, t = g.placeholder("primals_1"), g.placeholder("tangents_1")
    t.meta["partitioner_tag"] = "is_backward"
    # the guard reads partitions, not targets (torch 2.11, where this test runs too, has no synchronize ops)
    fw_wait, fw_barrier = g.call_function(ops.WAIT_STREAM, (0, 1)), g.call_function(ops.WAIT_EVENT, (3, 1))
    bw_wait = g.call_function(ops.WAIT_STREAM, (0, 1))
    bw_wait.meta["partitioner_tag"] = "is_backward"

    def collect(graph):
        return {fw_wait: OrderedSet([t, x]), bw_wait: OrderedSet([t, x])}, {fw_barrier: OrderedSet([x, t])}

    with _aot_streams_function_in_the_guard("_collect_sync_forward_deps", collect) as guarded:
        waits, barriers = guarded(g)
    assert waits == {fw_wait: OrderedSet([x]), bw_wait: OrderedSet([t, x])} and list(waits[bw_wait]) == [t, x]
    assert barriers == {fw_barrier: OrderedSet([x])}
    assert all(type(deps) is OrderedSet for deps in (*waits.values(), *barriers.values()))


@pytest.mark.parametrize("shape", ["2.13", "2.14"])
def test_a_forward_sync_is_wrapped_without_backward_deps_inside_the_guard_only(shape):
    """torch 2.12 and 2.13 thread every graph input, ``tangents_1`` included, through a forward
    ``e.synchronize()`` on an event the graph does not record (aot_guard.py): inside the guard
    the wrapping of a forward sync (of any kind) gets only the forward's dependencies, a
    backward sync keeps them all, and torch's own function is back after it. 2.14's wrapper (a fifth argument, its
    dependencies scoped to their partition) is left alone."""
    g = torch.fx.Graph()
    x, t = g.placeholder("primals_1"), g.placeholder("tangents_1")
    t.meta["partitioner_tag"] = "is_backward"
    fw_sync = g.call_function(ops.WAIT_EVENT, (3, 0))
    bw_sync = g.call_function(ops.WAIT_EVENT, (3, 0))
    bw_sync.meta["partitioner_tag"] = "is_backward"
    given = []

    def wrap_213(gm, sync_node, deps_before_sync, visited):
        given.append((sync_node, deps_before_sync))

    def wrap_214(gm, sync_node, deps_before_sync, visited, partition_scoped_deps=None):
        given.append((sync_node, deps_before_sync))

    fake = wrap_213 if shape == "2.13" else wrap_214
    with _aot_streams_function_in_the_guard("_wrap_sync_node", fake) as guarded:
        guarded(None, fw_sync, [x, t], set())
        guarded(None, bw_sync, [x, t], set())
    assert given == [(fw_sync, [x] if shape == "2.13" else [x, t]), (bw_sync, [x, t])]


def _buffer_read_after_a_wait() -> tuple[torch.fx.GraphModule, dict]:
    """``side`` (stream 1) wrote ``buf`` before the graph and computes ``y`` in it; the current
    stream (0) waits for it, then updates ``buf`` in place: functionalization's ``add`` and its
    epilogue ``copy_``."""
    g = torch.fx.Graph()
    buf, x = g.placeholder("primals_1"), g.placeholder("primals_2")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    y.meta["custom"] = {"stream": 1}
    wait = g.call_function(ops.WAIT_STREAM, (0, 1))
    add = g.call_function(torch.ops.aten.add.Tensor, (buf, 1))
    copy = g.call_function(torch.ops.aten.copy_.default, (buf, add))
    g.output((add, y))
    for node in (buf, x, y, add):
        node.meta["val"] = torch.zeros(4)
    return torch.fx.GraphModule(torch.nn.Module(), g), {"buf": buf, "wait": wait, "add": add, "copy": copy}


def _after_user_wait(node: torch.fx.Node) -> bool:
    """Whether ``node`` depends, through its inputs, on a ``control_deps`` running a wait_stream."""
    return any((c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_STREAM for n in ancestors(node))


@pytest.mark.skipif(
    not hasattr(graph_capture, "wrap_all_sync_nodes_with_control_deps"),
    reason="torch 2.11 does not wrap user syncs",
)
def test_a_buffer_read_after_a_wait_stays_after_it_and_is_still_copied_back_into():
    """The guard dropped a buffer copied back into from what torch threads through a wait, and
    with it the only ordering of its read after the wait: on CUDA the waiting stream is the
    current one, StreamPass sees no hazard inside the graph, and inductor could read ``buf``
    before the wait. The buffer is threaded again, and the epilogue copy writes ``buf`` itself
    (what AOT autograd asks), before and after StreamPass."""
    from torch._functorch._aot_autograd import streams

    threads = any(hasattr(streams, f) for f in ("_collect_wait_stream_forward_deps", "_collect_sync_forward_deps"))
    gm, n = _buffer_read_after_a_wait()
    with spi.cpu_safe_aot_stream_passes():
        graph_capture.wrap_all_sync_nodes_with_control_deps(gm)
    assert n["copy"].args[0] is n["buf"]
    assert _after_user_wait(n["add"]) == threads  # torch orders the read from 2.13 on
    sp.run(gm)  # and StreamPass on every version (transform/user_waits.py)
    assert n["copy"].args[0] is n["buf"] and _after_user_wait(n["add"])
    gm, n = _buffer_read_after_a_wait()
    graph_capture.wrap_all_sync_nodes_with_control_deps(gm)  # torch's alone loses the copy's input
    assert (n["copy"].args[0] is not n["buf"]) == threads


def test_a_pass_given_while_another_is_enabled_is_refused_not_dropped():
    """enable() then enabled(StreamPass(keep_graphs=True)), or an inner enabled(p) in an outer
    one, compiled through the pass already enabled: the given pass (its keep_graphs, its
    assign) was silently ignored. It is refused, and the config is left as it was."""
    before = inductor_config.post_grad_custom_post_pass
    installed = spi.enable()
    try:
        with pytest.raises(sp.StreamPassError, match="another StreamPass is enabled"):
            with spi.enabled(spi.StreamPass(keep_graphs=True)):
                pass
        with pytest.raises(sp.StreamPassError, match="another StreamPass is enabled"):
            spi.enable(assign="auto")
        with spi.enabled() as p, spi.enabled(installed) as q:  # the enabled pass, asked for or not
            assert p is q is installed
        assert spi.enable() is installed
    finally:
        spi.disable()
    assert inductor_config.post_grad_custom_post_pass is before
    outer = spi.StreamPass()
    with spi.enabled(outer):
        with pytest.raises(sp.StreamPassError, match="another StreamPass is enabled"):
            with spi.enabled(assign="auto"):
                pass
        with spi.enabled() as inner:
            assert inner is outer

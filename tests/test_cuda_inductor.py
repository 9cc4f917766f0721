"""StreamPass under torch.compile on CUDA: results equal eager, kernels run on their streams.

Skipped without a CUDA device. On CUDA the graph keeps its ``custom.stream`` annotations, so
inductor's native multi-stream codegen issues the kernels; the profiler shows on which stream
each kernel ran.
"""

from __future__ import annotations

import contextlib
import json
import warnings

import pytest
import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config

import streampass as sp
import streampass.inductor as spi
from streampass.transform.one_stream import ordered_after_syncs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from test_inductor import MULTI_STREAM, SCENARIOS, compare_with_eager  # noqa: E402  (same scenarios as on CPU)

_streams: dict[int, torch.cuda.Stream] = {}


def _cuda_stream(k):
    if k not in _streams:
        _streams[k] = torch.cuda.Stream()
    return _streams[k]


STYLES = {"sp.stream": sp.stream, "torch.cuda.Stream": lambda k: torch.cuda.stream(_cuda_stream(k))}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def _inputs():
    torch.manual_seed(0)
    # big enough that a kernel takes a while, so a missing sync would show up as a wrong result
    return torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")


def _run(name, style, mode, profile=False):
    scenario, ctx = SCENARIOS[name], STYLES[style]

    def fn(x, y):
        return scenario(ctx, x, y)

    def reference(x, y):  # serial semantics: sp.stream is a no-op outside tracing
        return scenario(sp.stream, x, y)

    x, y = _inputs()
    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        cfn = torch.compile(fn, backend="inductor", fullgraph=True)
        got, want = compare_with_eager(cfn, reference, x, y, mode, inplace=name == "inplace", warmup=True)
        kernel_streams = None
        if profile:
            kernel_streams = _kernel_streams(lambda: cfn(x.clone(), y))
    torch.cuda.synchronize()
    return got, want, p, kernel_streams


def _kernel_streams(call) -> set[int]:
    """The CUDA streams the kernels of one call ran on (from the profiler's trace)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, torch.no_grad():
        call()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile("w+", suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as saved:
            trace = json.load(saved)
    return {
        e["args"]["stream"] for e in trace["traceEvents"] if e.get("cat") == "kernel" and "stream" in e.get("args", {})
    }


CASES = [(n, s, m) for n in SCENARIOS for s in STYLES for m in ("inference", "training")]


@pytest.mark.parametrize("name,style,mode", CASES, ids=["-".join(c) for c in CASES])
def test_cuda_end_to_end(name, style, mode):
    got, want, p, _ = _run(name, style, mode)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert [r.graph for r in p.reports] == (["inference"] if mode == "inference" else ["forward", "backward"])
    for r in p.reports:
        if r.result is not None:
            assert r.result.after.ok and sp.verify(r.verified_graph).ok
            assert r.lowering == "native"
    if name in MULTI_STREAM:
        assert p.reports[0].records_added > 0 and len(p.reports[0].streams) >= 2


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("name", ["branches", "fanout", "chain"])
def test_side_stream_kernels_run_on_their_own_streams(name, style):
    _, _, p, kernel_streams = _run(name, style, "inference", profile=True)
    side = len(p.reports[0].streams) - 1
    assert side >= 1
    # the ambient stream plus at least one side stream: inductor's native codegen really
    # switched streams (the graph kept custom.stream on CUDA)
    assert len(kernel_streams) >= 2, kernel_streams


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_auto_assigned_streams_run_on_cuda_and_equal_eager(training):
    """``assign="auto"`` on CUDA: the chosen side streams (indices from AUTO_STREAMS up, which no
    one registered) resolve to real side streams, the kernels run there, results equal eager."""
    from test_assign_compile import Towers

    torch.manual_seed(0)
    model, x = Towers(width=2048).cuda(), torch.randn(4096, 2048, device="cuda")
    with torch.set_grad_enabled(training):
        want = model(x)
    if training:
        want.sum().backward()
        want_grads = [q.grad.clone() for q in model.parameters()]
        model.zero_grad()
    p = spi.StreamPass(keep_graphs=True, assign="auto")  # the device's own costs: these matmuls pay
    with spi.enabled(p), torch.set_grad_enabled(training):
        cfn = torch.compile(model)
        got = cfn(x)
    if training:
        got.sum().backward()
        for g, w in zip((q.grad for q in model.parameters()), want_grads):
            torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert all(r.assigned["side_streams"] >= 1 and r.lowering == "native" for r in p.reports), [
        r.line() for r in p.reports
    ]
    if not training:  # (_kernel_streams calls under no_grad: a training graph would recompile)
        assert len(_kernel_streams(lambda: cfn(x))) >= 2


def test_an_event_recorded_eagerly_is_waited_on_by_a_compiled_graph():
    """On CUDA eager code can record for real: the compiled graph's wait on that event is kept
    and treated as a wait on a record made before the graph ran (tests/test_compile_events.py)."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    e = torch.cuda.Event()
    x = torch.randn(1 << 16, device="cuda")
    with torch.cuda.stream(s1):
        y = x * 2
        e.record()

    def g(y):
        with torch.cuda.stream(s2):
            e.wait()
            return y.sin() + 1

    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        got = torch.compile(g)(y)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, (x * 2).sin() + 1)
    (r,) = p.reports
    assert r.external_events and sp.verify(r.verified_graph, r.external_events).ok, r.line()


def test_a_frame_of_syncs_alone_keeps_them_on_cuda():
    """A graph with syncs and no tensor is on its streams' device (it was read as a CPU graph,
    and the CPU lowering dropped the syncs: tests/test_compile_use.py)."""
    from torch._inductor.utils import run_and_get_code

    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def f(x):
        e = torch.cuda.Event()
        e.record(s1)
        s2.wait_event(e)
        return 3

    p = spi.StreamPass()
    with spi.enabled(p):
        out, code = run_and_get_code(torch.compile(f), torch.ones(4, device="cuda"))
    assert out == 3
    (r,) = p.reports
    assert r.device.startswith("cuda") and r.lowering == "native", r.line()
    assert all(op in "".join(code) for op in ("record_event", "wait_event")), code


def test_ops_whose_subgraphs_inductor_inlines_train_on_a_side_stream():
    """Flex attention (forward and backward: its score, mask and joint subgraphs are lowered into
    triton templates) and a pointwise ``associative_scan`` (its combine function, CUDA only) on a
    side stream: StreamPass leaves their subgraphs alone, results and gradients equal eager
    (docs/inductor.md; on CPU, tests/test_bodies.py)."""
    from torch._higher_order_ops.associative_scan import associative_scan
    from torch.nn.attention.flex_attention import flex_attention

    def program(block):
        def f(q, k, v, w):
            with block(1):
                a = flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 0.5)
                c = associative_scan(lambda x, y: x + y, w, dim=0, combine_mode="pointwise")
            return a * torch.tanh(q), c.sin()

        return f

    f, serial = program(sp.stream), program(lambda k: contextlib.nullcontext())

    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 128, 64, device="cuda") for _ in range(3)] + [torch.randn(64, 64, device="cuda")]
    want_in = [t.clone().requires_grad_() for t in inputs]
    got_in = [t.clone().requires_grad_() for t in inputs]
    want = torch.compile(serial, backend="aot_eager")(*want_in)  # flex attention needs a compile
    sum(o.sum() for o in want).backward()
    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        got = torch.compile(f)(*got_in)
    sum(o.sum() for o in got).backward()
    torch.cuda.synchronize()
    for g, w in zip([*got, *(t.grad for t in got_in)], [*want, *(t.grad for t in want_in)]):
        torch.testing.assert_close(g, w, rtol=2e-3, atol=2e-3)
    assert [r.graph for r in p.reports] == ["forward", "backward"], [r.line() for r in p.reports]
    assert p.reports[0].streams == [0, 1] and all(r.lowering == "native" for r in p.reports)


def _with_bodies():
    from test_native_lowering import WITH_BODIES

    return sorted(WITH_BODIES)


@pytest.mark.parametrize("name", _with_bodies())
def test_graphs_with_bodies_or_constants_run_on_cuda_and_equal_eager(name):
    """Higher-order ops' bodies with streams, a tensor constant and invoke_quant on a side stream
    (tests/test_native_lowering.py: before, none of them compiled through the GPU lowering)."""
    from test_native_lowering import WITH_BODIES

    fn = WITH_BODIES[name][0]
    torch.manual_seed(0)
    args = [torch.randn(1 << 20, device="cuda") for _ in range(fn.__code__.co_argcount)]
    want = fn(*args)  # eager: sp.stream does nothing outside a compile
    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        got = torch.compile(fn)(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want)
    assert any(r.streams != [0] for r in p.reports) and all(r.lowering in ("native", "none") for r in p.reports)


def test_an_aot_inductor_package_with_streams_runs_on_cuda_and_equals_eager(tmp_path):
    """AOT Inductor's C++ wrapper cannot switch streams: the package issues every kernel on the
    current stream, with every planned sync, and equals eager (tests/test_native_lowering.py
    reads the same package's code on CPU; before, its C++ compile failed on ``with stream1:``)."""
    from test_native_lowering import TwoBranches, says_one_stream_in_cpp

    torch.manual_seed(0)
    args = tuple(torch.randn(1024, 1024, device="cuda") for _ in range(3))
    model = TwoBranches()
    ep = torch.export.export(model, args)
    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p), says_one_stream_in_cpp():
        path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    loaded = torch._inductor.aoti_load_package(path)
    got = loaded(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, model(*args))
    (r,) = p.reports
    assert r.streams == [0, 1, 2] and r.lowering == "native" and sp.verify(r.verified_graph).ok


_LEFT_ON = {}  # the side stream of the two tests below, made on first use (a CUDA stream needs the device)


def _read_on_side_stream(x):
    with torch.cuda.stream(_LEFT_ON["s"]):
        y = x * 3
    torch.cuda.current_stream().wait_stream(_LEFT_ON["s"])
    return y


def _compiled_with_cpp_wrapper():
    _LEFT_ON.setdefault("s", torch.cuda.Stream())
    with spi.enabled(), warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.StreamPassWarning)
        f = torch.compile(_read_on_side_stream, options={"cpp_wrapper": True})
        f(torch.ones(1 << 20, device="cuda"))  # compiled and run once, with nothing left on s
    torch.cuda.synchronize()
    return f, _LEFT_ON["s"]


NO_JOINS = f"torch {torch.__version__} orders no kernel after a sync: no join (docs/inductor.md, Known limits)"


@pytest.mark.skipif(not ordered_after_syncs(), reason=NO_JOINS)
def test_a_cpp_wrapper_graph_follows_work_left_on_its_side_stream():
    """Under the C++ wrapper every kernel runs on the current stream. The graph's ``x * 3`` is
    meant for ``s``, so it must wait for the ``fill_`` the caller left sleeping on ``s`` (the
    entry join), as it would on ``s``; the current stream is idle, so without the join it reads
    ``x`` before the fill."""
    f, s = _compiled_with_cpp_wrapper()
    x = torch.ones(1 << 20, device="cuda")
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        x.fill_(2.0)
    y = f(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.full_like(y, 6.0))


@pytest.mark.skipif(not ordered_after_syncs(), reason=NO_JOINS)
def test_a_cpp_wrapper_graph_comes_before_work_put_on_its_side_stream_after_the_call():
    """The caller's ``add_`` on ``s`` after the call must wait for the graph's ``x * 3``, meant
    for ``s`` and run on the busy current stream (the exit join), as it would on ``s``."""
    f, s = _compiled_with_cpp_wrapper()
    x = torch.full((1 << 20,), 2.0, device="cuda")
    torch.cuda._sleep(100_000_000)  # the current stream busy, so the kernel comes late
    y = f(x)
    with torch.cuda.stream(s):
        y.add_(1)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.full_like(y, 7.0))

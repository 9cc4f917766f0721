"""The standalone rewrite on a real GPU: two independent matmul branches on their own streams.

Skipped without CUDA (CI has none); run on a GPU machine with ``python -m pytest tests/test_cuda_run.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def two_branches(x, w1, w2):
    with sp.stream(1):
        a = x
        for _ in range(4):
            a = torch.tanh(a @ w1)
    with sp.stream(2):
        b = x
        for _ in range(4):
            b = torch.tanh(b @ w2)
    return a + b


def _inputs(n=2048):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(n, n, device="cuda", generator=g) / n**0.5 for _ in range(3)]


def test_branches_on_streams_match_one_stream_and_use_their_streams():
    args = _inputs()
    expected = two_branches(*args)  # eager: annotations do nothing, one stream
    gm = make_fx(two_branches)(*args)
    result = sp.run(gm)
    assert result.ok
    for _ in range(3):  # repeated calls reuse the graph's streams and events
        got = sp.execute(gm, *args)
        torch.cuda.synchronize()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        sp.execute(gm, *args)
        torch.cuda.synchronize()
    streams = {e.device_resource_id for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert len(streams) >= 3, f"kernels ran on {len(streams)} stream(s)"


def test_plain_call_runs_on_the_current_stream_with_syncs():
    args = _inputs(256)
    expected = two_branches(*args)
    gm = make_fx(two_branches)(*args)
    sp.run(gm)
    torch.testing.assert_close(gm(*args), expected, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# CUDA-graph capture (docs/plan.md §6): run's result is captured and replayed like eager
# --------------------------------------------------------------------------------------------
def _captured(fn, static_inputs, warmup: int = 3):
    """``fn(*static_inputs)`` captured in a CUDA graph (after warm-up on a side stream, as torch's
    docs prescribe) and replayed once; returns the replay's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static_inputs)
    graph.replay()
    torch.cuda.synchronize()
    return out


def test_run_result_is_captured_in_a_cuda_graph_and_replays_as_eager():
    from streampass.analysis.capture import unjoined

    args = _inputs(512)
    expected = two_branches(*args)
    gm = make_fx(two_branches)(*args)
    assert sp.run(gm).ok and unjoined(gm) == []
    got = _captured(lambda *a: sp.execute(gm, *a), args)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_training_step_captured_in_a_cuda_graph_matches_eager():
    from functorch.compile import aot_function, make_boxed_func

    def compiler(gm, _):
        assert sp.run(gm).ok
        return make_boxed_func(lambda *a: sp.execute(gm, *a, device="cuda"))

    def block(x, w1, w2):
        with sp.stream(1):
            a = torch.tanh(x @ w1)
        with sp.stream(2):
            b = torch.sigmoid(x @ w2)
        return (a * b).sum()

    x, w1, w2 = _inputs(256)
    params = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
    ref = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
    block(x, *ref).backward()
    compiled = aot_function(block, fw_compiler=compiler, bw_compiler=compiler)

    def step(x, p1, p2):
        p1.grad = p2.grad = None
        compiled(x, p1, p2).backward()

    _captured(step, [x, *params])
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-4)

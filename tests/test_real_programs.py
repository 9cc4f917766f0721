"""Stream patterns from serving and training code bases, compiled the way their users run them.

Each model below re-expresses, at toy sizes and in our own code, one way a public code base puts
work on a side stream (the code base is named in the model's docstring):

* shared experts on a side stream next to the routed ones, their input cloned and
  ``record_stream``-ed for it, the streams fenced with ``wait_stream`` both ways (vLLM's
  ``FusedMoE``, SGLang's dual-stream MoE blocks);
* a KV cache written each decode step, K on the current stream and V on a side stream, fenced
  both ways (SGLang's ``set_kv_buffer`` under graph capture);
* an ``autograd.Function`` that saves a copy of its input made on a side stream and, in backward,
  synchronizes that stream before reading it (activation offloading, hansonw/mefft);
* block weights kept off the device and brought in one block ahead on a load stream, two events
  used in turn (lightx2v's ``WeightAsyncStreamManager``: weight streaming for inference);
* the next batch normalized on a side stream, in place, while the step computes on this one, then
  fenced with ``wait_stream`` and ``record_stream`` (apex's ImageNet ``data_prefetcher``).

A training loop of three steps: the first forward compiled under ``streampass.inductor.enabled()``,
backward and an SGD step after the block; torch's FX-graph and AOT caches on in a fresh directory;
then the same again warm (dynamo reset, the caches filled). Outputs, parameters and buffers equal
eager's at every step, every graph the pass saw verifies, and the compiled code ran at least the
syncs the plans hold. CUDA's current stream is the CPU stand-in the corpus uses (tests/test_corpus.py).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import streampass as sp
import streampass.inductor as spi

from reference import TORCH, planned_syncs
from test_corpus import _in_current_stream
from user_stream_programs import CpuStream, current_stream, make_event, record_stream

pytestmark = pytest.mark.usefixtures("fresh_caches")


def _mlp(width: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, width))


class SharedExpertsMoE(nn.Module):
    """Routed experts on the current stream, shared experts on a side stream made at init
    (vLLM's ``FusedMoE`` shared-experts stream; SGLang's ``forward_normal_dual_stream``)."""

    def __init__(self, width: int = 16, experts: int = 4, top: int = 2):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(_mlp(width, 24) for _ in range(experts))
        self.shared = _mlp(width, 32)
        self.top = top
        self.side = CpuStream("cpu")

    def forward(self, x):
        x = self.inp(x)
        cur = current_stream()
        h = x.clone()  # the side stream's own copy, kept alive for it
        if TORCH >= (2, 13):  # 2.11 and 2.12 run Tensor.record_stream on fake tensors
            record_stream(h, self.side)
        self.side.wait_stream(cur)
        weights, chosen = torch.softmax(self.router(x), -1).topk(self.top, -1)
        weights = weights / weights.sum(-1, keepdim=True)
        routed = sum((weights * (chosen == e)).sum(-1, keepdim=True) * ex(x) for e, ex in enumerate(self.experts))
        with self.side:
            shared = self.shared(h)
        cur.wait_stream(self.side)
        return routed + shared


class KVCacheAttention(nn.Module):
    """One attention layer over a KV cache it writes each decode step: K on the current stream,
    V on a side stream (SGLang's ``MHATokenToKVPool.set_kv_buffer`` with an alt stream)."""

    def __init__(self, width: int = 16, heads: int = 2, slots: int = 13):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.heads = heads
        self.register_buffer("k_cache", torch.zeros(slots, heads, width // heads))
        self.register_buffer("v_cache", torch.zeros(slots, heads, width // heads))
        self.side = CpuStream("cpu")

    def forward(self, x, loc):
        split = (x.shape[0], self.heads, -1)
        cur = current_stream()
        self.side.wait_stream(cur)
        self.k_cache[loc] = self.k(x).view(split)
        with self.side:
            self.v_cache[loc] = self.v(x).view(split)
        cur.wait_stream(self.side)
        scores = torch.einsum("thd,shd->hts", self.q(x).view(split), self.k_cache) / 8**0.5
        out = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), self.v_cache)
        return self.o(out.reshape(x.shape[0], -1))


OFFLOAD = CpuStream("cpu")


class OffloadedSiLU(torch.autograd.Function):
    """Saves a copy of its input made on a side stream; backward synchronizes that stream before
    reading the copy (the activation offloading of hansonw/mefft's ``OffloadCheckpointer``, whose
    backward recomputes its block with ``torch.autograd.backward``, which dynamo does not trace:
    here the gradient is written out)."""

    @staticmethod
    def forward(ctx, x):
        saved = torch.empty_like(x)
        with OFFLOAD:
            saved.copy_(x)
        ctx.save_for_backward(saved)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        OFFLOAD.synchronize()
        sig = torch.sigmoid(saved)
        return grad * sig * (1 + saved * (1 - sig))


class OffloadedBlocks(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList(nn.ModuleList((nn.Linear(width, 32), nn.Linear(32, width))) for _ in range(2))

    def forward(self, x):
        x = self.inp(x)
        for up, down in self.blocks:
            x = down(OffloadedSiLU.apply(up(x))) + x
        return x


class StreamedWeights(nn.Module):
    """Each block's weight lives off the device (``host``); a load stream brings the next block's
    in while this one computes, each copy announced by one of two events used in turn
    (ModelTC/lightx2v's ``WeightAsyncStreamManager``, whose ``to_cuda_async`` makes a new device
    tensor on the load stream: here a clone)."""

    def __init__(self, width: int = 16, blocks: int = 4):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.register_buffer("host", torch.randn(blocks, width, width) / width**0.5)
        self.load = CpuStream("cpu")

    def forward(self, x):
        x = self.inp(x)
        loaded, weights = [make_event(), make_event()], [None, None]
        with self.load:
            weights[0] = self.host[0].clone()
            loaded[0].record()
        for i in range(len(self.host)):
            slot = i % 2
            if i + 1 < len(self.host):
                with self.load:
                    weights[1 - slot] = self.host[i + 1].clone()
                    loaded[1 - slot].record()
            loaded[slot].wait()
            x = torch.relu(x @ weights[slot]) + x
        return x


class PrefetchingStep(nn.Module):
    """Returns the next batch, normalized in place on a side stream while the step computes on
    this one, then fenced for the current stream (NVIDIA/apex's ImageNet example's
    ``data_prefetcher``: ``float().sub_(mean).div_(std)`` on its stream, ``wait_stream``,
    ``record_stream``)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.net = _mlp(width, 32)
        self.register_buffer("mean", torch.full((width,), 2.0))
        self.register_buffer("std", torch.full((width,), 1.5))
        self.side = CpuStream("cpu")

    def forward(self, x, raw_next):
        cur = current_stream()
        with self.side:
            nxt = raw_next.float().sub_(self.mean).div_(self.std)
        out = self.net(x)
        cur.wait_stream(self.side)
        if TORCH >= (2, 13):  # 2.11 and 2.12 run Tensor.record_stream on fake tensors
            record_stream(nxt, cur)
        return out, nxt


def _one_batch(seed: int):
    """Inputs of step k: one batch of 8 x 16, seeded ``seed + k``."""
    return lambda step: (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed + step)),)


def _decode_inputs(step):
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(200 + step)), torch.arange(4) + 1 + 4 * step)


def _prefetch_inputs(step):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(8, 16, generator=g), torch.randint(0, 5, (8, 16), generator=g)


#: name -> (model, inputs of step k, training, the oldest torch whose dynamo traces it)
CASES = {
    "shared_experts_moe": (SharedExpertsMoE, _one_batch(100), True, (2, 11)),
    "kv_cache_decode": (KVCacheAttention, _decode_inputs, False, (2, 11)),
    "offloaded_checkpoint": (OffloadedBlocks, _one_batch(300), True, (2, 12)),
    "streamed_weights": (StreamedWeights, _one_batch(400), False, (2, 11)),
    "prefetching_step": (PrefetchingStep, _prefetch_inputs, True, (2, 11)),
}
#: what an older torch's dynamo says, with any backend, of what it cannot trace
OLDER_TORCH_FAILS = {"offloaded_checkpoint": "lift_tracked_freevar_to_input should not be called on root"}
HERE = [name for name, case in CASES.items() if case[3] <= TORCH]
NEWER = [name for name in CASES if name not in HERE]


def _loop(make, inputs, training, passes=None, steps=3):
    """Outputs of each step and the model's final state; the first forward compiled under
    ``enabled(passes)`` when ``passes`` is given, every backward and SGD step after it. The loss
    is the first output's, where the model returns several."""
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    call = model if passes is None else torch.compile(_in_current_stream(model), fullgraph=True)
    outs = []
    for step in range(steps):
        with torch.set_grad_enabled(training):
            if passes is not None and step == 0:
                with spi.enabled(passes):
                    out = call(*inputs(step))
            else:
                out = call(*inputs(step))
        out = out if isinstance(out, tuple) else (out,)
        if training:
            out[0].pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        outs.append(tuple(o.detach() for o in out))
    return outs, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", HERE)
def test_a_pattern_from_real_code_trains_cold_then_warm(name):
    make, inputs, training, _ = CASES[name]
    want = _loop(make, inputs, training)
    for run in ("cold", "warm"):
        torch._dynamo.reset()
        counters.clear()
        passes = spi.StreamPass(keep_graphs=True)
        before = sum(spi.RUNTIME_SYNCS.values())
        got = _loop(make, inputs, training, passes)
        ran = sum(spi.RUNTIME_SYNCS.values()) - before
        torch.testing.assert_close(got, want, msg=lambda m, run=run: f"{run}: {m}")
        # every graph inductor compiled went through the pass; warm, those the caches served did not
        compiled = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_bypass"]
        assert len(passes.reports) == compiled, run
        kept = [r for r in passes.reports if r.verified_graph is not None]
        assert all(sp.verify(r.verified_graph).ok for r in kept), run
        assert ran >= sum(planned_syncs(r.verified_graph) for r in kept), run
        if run == "cold":
            assert any(len(r.streams) > 1 for r in passes.reports)  # the side stream was read
            if training:  # the backward, compiled after the block, went through the pass too
                assert [r.graph for r in passes.reports].count("backward") >= 1
        if run == "warm":  # the caches serve every graph they took cold; the rest compile again
            assert counters["inductor"]["fxgraph_cache_miss"] == 0, dict(counters["inductor"])


def test_what_an_older_torch_leaves_out_it_cannot_trace_without_streampass_either():
    """The cases ``since`` leaves out on this torch (none on 2.12 and later): torch's own dynamo
    fails them with any backend, so streampass is not what is missing."""
    assert set(NEWER) <= set(OLDER_TORCH_FAILS) and set(HERE) | set(NEWER) == set(CASES)
    for name in NEWER:
        make, inputs, training, _ = CASES[name]
        compiled = torch.compile(_in_current_stream(make()), backend="eager", fullgraph=True)
        with pytest.raises(AssertionError, match=OLDER_TORCH_FAILS[name]):
            out = compiled(*inputs(0))
            if training:
                out.sum().backward()


def test_an_event_recorded_after_its_stream_wrote_an_input_is_refused_by_torch_itself():
    """Why ``StreamedWeights`` loads into new tensors, not into preallocated buffers: dynamo
    refuses the record with any backend (docs/inductor.md, Known limits)."""
    load = torch.Stream("cpu")

    def load_into_slot(slot, w):
        with load:
            slot.copy_(w)
            loaded = torch.Event("cpu")
            loaded.record()
        loaded.wait()
        return slot * 2

    older = TORCH < (2, 12)  # 2.11 fails on the same program with an IndexError of its own
    message = "deque index out of range" if older else "event was recorded on a stream where a graph input was"
    with pytest.raises(Exception, match=message):
        torch.compile(load_into_slot, backend="eager", fullgraph=True)(torch.zeros(4), torch.ones(4))

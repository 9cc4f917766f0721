"""Models with side-stream branches, and how the benchmarks capture their graphs.

Both blocks put independent work on side streams with ``streampass.stream(k)``:

* ``TransformerBlock``: pre-norm attention (K and V projections on streams 1 and 2, Q on the
  ambient stream) and an MLP split in two halves, one on stream 1.
* ``ResNetBlock``: a bottleneck (1x1, 3x3, 1x1 convs with batch norm) on the ambient stream,
  the projection shortcut (1x1 conv + BN) on stream 1 and a squeeze-excite gate on stream 2.

``capture_fw_bw`` traces forward and backward with ``functorch.compile.aot_function`` on meta
tensors. aot_autograd runs torch's own stream passes on the joint graph as part of tracing (and
they need an accelerator); for the benchmark they are switched off during capture so that both
passes start from the same annotated, unsynchronised forward and backward graphs.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import streampass as sp


class Annotated(nn.Module):
    """``streams = False`` runs the blocks' ``sp.stream`` blocks on the ambient stream (what
    ``assign="auto"`` starts from in benchmarks/gpu_assign.py)."""

    streams = True

    def on(self, k: int):
        return sp.stream(k) if self.streams else contextlib.nullcontext()


class TransformerBlock(Annotated):
    def __init__(self, d: int = 1024, heads: int = 16, hidden: int = 4096):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up_a, self.up_b = nn.Linear(d, hidden // 2), nn.Linear(d, hidden // 2)
        self.down_a, self.down_b = nn.Linear(hidden // 2, d), nn.Linear(hidden // 2, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)

        def split(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        with self.on(1):
            k = split(self.k(h))
        with self.on(2):
            v = split(self.v(h))
        q = split(self.q(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.ln2(x)
        with self.on(1):
            ya = self.down_a(F.gelu(self.up_a(h)))
        yb = self.down_b(F.gelu(self.up_b(h)))
        return x + ya + yb


class ResNetBlock(Annotated):
    def __init__(self, cin: int = 256, mid: int = 128, cout: int = 512):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.cs, self.bs = nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.se1, self.se2 = nn.Linear(cin, cin // 4), nn.Linear(cin // 4, cout)

    def forward(self, x):
        with self.on(1):
            short = self.bs(self.cs(x))
        with self.on(2):
            gate = torch.sigmoid(self.se2(F.relu(self.se1(x.mean((2, 3))))))
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y * gate[:, :, None, None] + short)


def model_inputs(name: str, device="meta", dtype=torch.bfloat16, small: bool = False):
    """(module, example input) on ``device``."""
    if name == "transformer":
        m = TransformerBlock() if not small else TransformerBlock(256, 4, 1024)
        x = (
            torch.randn(8, 1024, m.ln1.normalized_shape[0], device=device, dtype=dtype)
            if not small
            else torch.randn(2, 128, 256, device=device, dtype=dtype)
        )
    elif name == "resnet":
        m = ResNetBlock() if not small else ResNetBlock(64, 32, 128)
        x = (
            torch.randn(32, m.c1.in_channels, 56, 56, device=device, dtype=dtype)
            if not small
            else torch.randn(4, 64, 16, 16, device=device, dtype=dtype)
        )
    else:
        raise ValueError(name)
    return m.to(device=device, dtype=dtype), x


@contextlib.contextmanager
def torch_stream_passes_off():
    """Switch off the stream passes aot_autograd runs while it traces (restored afterwards)."""
    import torch._functorch._aot_autograd.graph_capture as gc

    names = ("insert_backward_syncs", "sync_deallocations", "wrap_all_sync_nodes_with_control_deps")
    saved = {n: getattr(gc, n) for n in names}
    try:
        for n in names:
            setattr(gc, n, lambda *a, **k: None)
        yield
    finally:
        for n, f in saved.items():
            setattr(gc, n, f)


def capture_fw_bw(module: nn.Module, x: torch.Tensor) -> dict[str, torch.fx.GraphModule]:
    """The forward and backward graphs aot_function partitions, with stream annotations."""
    from functorch.compile import aot_function, make_boxed_func

    graphs: dict[str, torch.fx.GraphModule] = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())

    def f(params, buffers, x):
        return torch.func.functional_call(module, (params, buffers), (x,))

    with torch_stream_passes_off():
        fn = aot_function(f, fw_compiler=keep("forward"), bw_compiler=keep("backward"))
        out = fn(params, buffers, x.requires_grad_(True))
        out.sum().backward()
    return graphs

"""Random multi-stream graphs, for property tests and benchmarks.

Graphs are built node by node with ``torch.fx.Graph`` (tracing 64k ops would dominate a
benchmark), each node's ``meta["val"]`` computed on meta tensors. Values stay in [-1, 1]
(``mul``, ``lerp``, ``maximum``, ``sin``, ``tanh``, ``mm/n``) so eager runs on real
tensors compare bit for bit without overflow.
"""

from __future__ import annotations

import operator
import random

import torch
import torch.fx

from streampass import ops
from streampass.values import storage_root

aten = torch.ops.aten
_BINARY = [aten.mul.Tensor, aten.maximum.default, aten.minimum.default]
_UNARY = [aten.sin.default, aten.tanh.default]


def random_stream_graph(
    n_nodes: int,
    n_streams: int,
    seed: int = 0,
    style: str = "annotate",
    inplace: float = 0.1,
    matmul: float = 0.1,
    n_inputs: int = 3,
    size: int = 8,
    copy_epilogue: bool = True,
    run_length: int = 4,
    views: float = 0.0,
    multi_output: float = 0.0,
    attributes: float = 0.0,
) -> torch.fx.GraphModule:
    """A random graph of about ``n_nodes`` compute nodes spread over ``n_streams`` streams.

    ``style``: ``"annotate"`` (``custom.stream``), ``"fork_join"`` (nested fork/join regions,
    nodes unannotated) or ``"mixed"``. ``inplace``: share of in-place ``mul_`` on earlier
    values; ``copy_epilogue`` adds functionalization-style ``copy_`` into one input;
    ``views``: share of ops that are views (``t``) of an earlier value; ``multi_output``: share
    of ops that are a multi-output op (``aminmax``) whose two results (getitems) clamp an
    earlier value; ``attributes``: share of operands that are module buffers, read through a
    ``get_attr`` placed at first use as ``make_fx`` does; ``run_length``: the longest stretch of
    consecutive ops on one stream.

    >>> gm = random_stream_graph(20, 3, seed=1)
    >>> import streampass as sp
    >>> len(sp.read_streams(gm).streams) <= 3
    True
    """
    if style not in ("annotate", "fork_join", "mixed"):
        raise ValueError(f"unknown style {style!r}")
    rng = random.Random(seed)
    g = torch.fx.Graph()
    root = torch.nn.Module()
    values: list[torch.fx.Node] = []
    for i in range(n_inputs):
        p = g.placeholder(f"in{i}")
        p.meta["val"] = torch.empty(size, size, device="meta")
        values.append(p)
    inputs = list(values)
    # region stack for fork/join style: streams entered, innermost last
    regions: list[int] = []
    current = 0
    made = 0
    while made < n_nodes:
        s = rng.randrange(n_streams) if n_streams > 1 else 0
        length = rng.randint(1, run_length)
        use_fork = style == "fork_join" or (style == "mixed" and rng.random() < 0.5)
        if use_fork and s != current:
            # close regions until we can fork to s (or are back at ambient for s == 0)
            while regions and (s == 0 or s in regions):
                top = regions.pop()
                outer = regions[-1] if regions else 0
                g.call_function(ops.JOIN, (top, outer))
                current = outer
            if s != current:
                g.call_function(ops.FORK, (current, s))
                regions.append(s)
                current = s
        for _ in range(length):
            if made >= n_nodes:
                break
            if attributes and rng.random() < attributes:
                values.append(_buffer(g, root, rng, size))  # its get_attr stands here, at first use
            created = _random_op(g, rng, values, inputs, inplace, matmul, size, views, multi_output)
            if not use_fork:
                stream_note = s
            elif style == "mixed" and rng.random() < 0.3:
                stream_note = current  # annotation agreeing with the region: both dialects at once
            else:
                stream_note = None
            for node in created:
                if stream_note is not None and (stream_note != 0 or rng.random() < 0.5):
                    node.meta["custom"] = {"stream": stream_note}
            made += 1
            values.append(created[-1])
    while regions:
        top = regions.pop()
        g.call_function(ops.JOIN, (top, regions[-1] if regions else 0))
    if copy_epilogue and n_nodes > 0:
        src = values[-1] if values[-1].op != "placeholder" else values[0]
        if src is not inputs[0] and storage_root(src) is inputs[0]:
            src = inputs[0]  # a view of the input itself: eager refuses the overlapping copy
        c = g.call_function(aten.copy_.default, (inputs[0], src))
        c.meta["val"] = torch.empty(size, size, device="meta")
        if style != "fork_join":
            c.meta["custom"] = {"stream": rng.randrange(n_streams)}
    tail = [v for v in values[-3:] if v.op not in ("placeholder", "get_attr")] or values[:1]
    g.output(tuple(tail))
    return torch.fx.GraphModule(root, g)


def _buffer(g, root: torch.nn.Module, rng, size: int) -> torch.fx.Node:
    name = f"buf{len(root._buffers)}"
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    root.register_buffer(name, torch.rand(size, size, generator=gen) * 2 - 1)
    node = g.get_attr(name)
    node.meta["val"] = torch.empty(size, size, device="meta")
    return node


def _random_op(g, rng, values, inputs, inplace, matmul, size, views=0.0, multi_output=0.0) -> list[torch.fx.Node]:
    def pick() -> torch.fx.Node:
        # prefer recent values: graphs are mostly local, with some long edges
        k = min(len(values), 12)
        return values[-rng.randint(1, k)] if rng.random() < 0.8 else rng.choice(values)

    def call(target, args) -> torch.fx.Node:
        n = g.call_function(target, args)
        n.meta["val"] = torch.empty(size, size, device="meta")
        return n

    if views and rng.random() < views:
        return [call(aten.t.default, (pick(),))]
    if multi_output and rng.random() < multi_output:
        pair = g.call_function(aten.aminmax.default, (pick(),), {"dim": 1, "keepdim": True})
        pair.meta["val"] = (torch.empty(size, 1, device="meta"), torch.empty(size, 1, device="meta"))
        lo, hi = (g.call_function(operator.getitem, (pair, i)) for i in (0, 1))
        lo.meta["val"], hi.meta["val"] = pair.meta["val"]
        clamped = call(aten.minimum.default, (pick(), hi))
        return [pair, lo, hi, clamped, call(aten.maximum.default, (clamped, lo))]
    r = rng.random()
    if r < inplace:
        # not inputs or module buffers: a graph called twice must compute the same
        cands = [v for v in values if v.op != "placeholder" and storage_root(v).op != "get_attr"]
        if cands:
            target, other = rng.choice(cands[-12:]), pick()
            # Eager refuses an in-place op whose input partly overlaps its output, as a
            # transposed view of the same storage does (only graphs with views have those).
            if not views or storage_root(target) is not storage_root(other):
                return [call(aten.mul_.Tensor, (target, other))]
    if r < inplace + matmul:
        mm = call(aten.mm.default, (pick(), pick()))
        return [mm, call(aten.div.Tensor, (mm, float(size)))]
    if rng.random() < 0.5:
        return [call(rng.choice(_UNARY), (pick(),))]
    if rng.random() < 0.3:
        return [call(aten.lerp.Scalar, (pick(), pick(), 0.5))]
    return [call(rng.choice(_BINARY), (pick(), pick()))]


def random_inputs(gm: torch.fx.GraphModule, seed: int = 0) -> list[torch.Tensor]:
    """Real CPU inputs in [-1, 1] for a graph from :func:`random_stream_graph`.

    >>> xs = random_inputs(random_stream_graph(10, 2, seed=3), seed=1)
    >>> len(xs), all(x.abs().max() <= 1 for x in xs)
    (3, True)
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            shape = n.meta["val"].shape
            out.append(torch.rand(shape, generator=gen) * 2 - 1)
    return out

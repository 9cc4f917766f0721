"""The ``streampass`` command line: ``demo`` (the embedded model, end to end) and ``inspect``."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from . import annotate
from .dag import StreamDAG
from .pipeline import run
from .runtime import run_serial


class DemoBlock(torch.nn.Module):
    """An attention-style block: the value projection and a gating MLP run on side streams."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim)
        self.v = torch.nn.Linear(dim, dim)
        self.gate = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with annotate.stream(1):
            v = self.v(x)  # side stream 1: value projection
        with annotate.stream(2):
            g = torch.sigmoid(self.gate(x))  # side stream 2: gating MLP
        q, k = self.q(x), self.k(x)  # ambient stream
        attn = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return self.out(attn @ v) * g


def trace_demo(batch: int = 16, dim: int = 64, seed: int = 0):
    """The demo block traced with make_fx (parameters as inputs), and example inputs."""
    torch.manual_seed(seed)
    block = DemoBlock(dim)
    params = dict(block.named_parameters())
    x = torch.randn(batch, dim)

    def fn(params, x):
        return torch.func.functional_call(block, params, (x,))

    gm = make_fx(fn)(params, x)
    return gm, (params, x)


def describe(dag: StreamDAG) -> list[str]:
    """Lines describing a DAG: streams, nodes per stream, cross-stream edges."""
    a = dag.assignment
    per_stream = Counter(a.stream[n] for n in a.nodes if a.is_compute(n))
    lines = [f"streams: {dag.streams} (0 = ambient)"]
    for s in dag.streams:
        lines.append(f"  stream {s}: {per_stream.get(s, 0)} compute node(s)")
    cross = dag.cross_stream_edges()
    lines.append(f"cross-stream data edges: {len(cross)}")
    for u, v in cross[:12]:
        lines.append(f"  {u} (stream {dag.stream_of(u)}) -> {v} (stream {dag.stream_of(v)})")
    if len(cross) > 12:
        lines.append(f"  ... {len(cross) - 12} more")
    return lines


def demo(args: argparse.Namespace) -> int:
    gm, example = trace_demo()
    expected = run_serial(gm, *example)
    before = StreamDAG.from_graph(gm)
    print("== streampass demo: an attention block with side-stream projections ==")
    print("\n".join(describe(before)))
    hazards = before.hazards()
    kinds = Counter(h.kind for h in hazards)
    print(f"hazards before the pass: {len(hazards)} ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})")
    shown = {}
    for h in hazards:  # one example of each kind, then the count
        shown.setdefault(h.kind, h)
    for h in shown.values():
        print(f"  {h}")
    result = run(gm)
    print(f"pass: {result.summary()}")
    print(f"hazards after the pass: {len(result.after.hazards)}")
    got = gm(*example)
    same = torch.equal(got, expected)
    print(f"rewritten graph called eagerly on CPU equals the original: {same}")
    if not (result.ok and same):
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streampass", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="trace the embedded model, report its streams and hazards, fix them")
    p_demo.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

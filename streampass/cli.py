"""The ``streampass`` command line: ``demo`` (the embedded model, end to end) and ``inspect``."""

from __future__ import annotations

import argparse
import copy
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
    """``streampass demo``: trace the embedded block, report its streams and hazards, run the
    pass, check the result against the original, write the HTML report. Exit 0 on success."""
    gm, example = trace_demo()
    original = copy.deepcopy(gm)  # run() edits gm in place; the HTML report shows both
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
    _write_html(args, original, gm, "streampass demo: attention block with side streams", describe(before) + [f"pass: {result.summary()}"])
    if not (result.ok and same):
        return 1
    return 0


def _write_html(args: argparse.Namespace, before, after, title: str, lines: list[str]) -> None:
    if not getattr(args, "html", None):
        return
    from .report import write_report

    path = write_report(args.html, before, after, title=title, lines=lines)
    print(f"HTML report: {path.resolve()}")


def load_target(target: str, shapes: str | None = None, dtype: str = "float32") -> torch.fx.GraphModule:
    """A graph to inspect: a ``torch.export`` program file (``.pt2``), or ``module:function``
    traced with make_fx on random inputs of ``shapes`` (``"8x16,16x4"``)."""
    import importlib
    import os

    if target.endswith(".pt2") or os.path.isfile(target):
        # the flat ATen graph, parameters as inputs; stream annotations survive strict export only
        return torch.export.load(target).graph_module
    mod_name, sep, attr = target.partition(":")
    if not sep or not attr:
        raise SystemExit(f"streampass inspect: TARGET must be a .pt2 file or module:function, got {target!r}")
    fn = importlib.import_module(mod_name)
    for part in attr.split("."):
        fn = getattr(fn, part)
    dt = getattr(torch, dtype)
    inputs = []
    for spec in (shapes or "").split(","):
        if spec.strip():
            inputs.append(torch.randn(*[int(x) for x in spec.strip().lower().split("x")], dtype=dt))
    return make_fx(fn)(*inputs)


def inspect(args: argparse.Namespace) -> int:
    """``streampass inspect TARGET``: the demo's report for a user's program (see load_target)."""
    from .errors import StreamPassError

    gm = load_target(args.target, args.shapes, args.dtype)
    original = copy.deepcopy(gm)
    dag = StreamDAG.from_graph(gm)
    lines = [f"== streampass inspect {args.target} =="] + describe(dag)
    if dag.streams == [0]:
        lines.append("  (only the ambient stream: torch.export keeps streampass.stream annotations with strict=True)")
    hazards = dag.hazards()
    kinds = Counter(h.kind for h in hazards)
    lines.append(f"hazards before the pass: {len(hazards)} ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})")
    shown = {}
    for h in hazards:
        shown.setdefault(h.kind, h)
    lines += [f"  {h}" for h in shown.values()]
    print("\n".join(lines))
    try:
        result = run(gm)
    except StreamPassError as e:
        print(f"pass refused: {e}")
        _write_html(args, original, None, f"streampass inspect {args.target}", lines + [f"pass refused: {e}"])
        return 2
    tail = [f"pass: {result.summary()}", f"hazards after the pass: {len(result.after.hazards)}"]
    print("\n".join(tail))
    _write_html(args, original, gm, f"streampass inspect {args.target}", lines + tail)
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """The ``streampass`` console script.

    >>> main(["demo", "--html", ""])  # doctest: +ELLIPSIS
    == streampass demo: ...
    0
    """
    parser = argparse.ArgumentParser(prog="streampass", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="trace the embedded model, report its streams and hazards, fix them")
    p_demo.add_argument("--html", default="streampass-demo.html", metavar="PATH", help="write the HTML report here ('' for none)")
    p_demo.set_defaults(func=demo)
    p_insp = sub.add_parser("inspect", help="report a torch.export .pt2 program or a module:function, fix it, write HTML")
    p_insp.add_argument("target", help="a .pt2 file (torch.export.save) or module:function")
    p_insp.add_argument("--shapes", help="example input shapes for module:function, e.g. 8x16,16x4")
    p_insp.add_argument("--dtype", default="float32", help="dtype of the random example inputs")
    p_insp.add_argument("--html", default="streampass-inspect.html", metavar="PATH", help="write the HTML report here ('' for none)")
    p_insp.set_defaults(func=inspect)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""StreamPass inside torch.compile: time per graph, and how often it reads each graph.

    python benchmarks/compile_reads.py [--layers 4] [--out benchmarks/results/compile_reads.json]

Compiles a stack of ``--layers`` transformer blocks (benchmarks/bench_models.py, small sizes,
float32 on CPU; two branches of each block on side streams) under
``streampass.inductor.enabled()``, forward and backward, with inductor's FX-graph cache off so
that every graph really goes through the pass, and kernels compiled in-process
(``compile_threads=1``) so that no compile worker competes with the pass for the CPU. For each graph the pass sees it records

* the time ``StreamPass`` takes (``__call__``: index shift, ``run``, lowering),
* how many times ``read_streams`` ran on the graph during that call (a counter put in place
  of it in every streampass module that imported it),
* the baseline, in the same run: torch's own ``stable_topological_sort`` + FX dead-code
  elimination on copies of the same graph as the pass received it (median of 5),

and prints one markdown table row per graph (pasted into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._inductor.fx_passes.post_grad import stable_topological_sort

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_models  # noqa: E402

import streampass.inductor as spi  # noqa: E402


class Stack(torch.nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(bench_models.TransformerBlock(256, 4, 1024) for _ in range(layers))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def copies(graph: torch.fx.Graph, n: int = 5) -> list[torch.fx.GraphModule]:
    return [torch.fx.GraphModule(graph.owning_module, copy.deepcopy(graph)) for _ in range(n)]


def timed(fn, *args) -> float:
    """Seconds for ``fn(*args)``, what is alive before frozen out of the collector's way (as
    benchmarks/run.py times): otherwise a collection of the benchmark's own copies lands in
    whichever call happens to trigger it."""
    gc.collect()
    gc.freeze()
    try:
        t = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t
    finally:
        gc.unfreeze()


def torch_passes(gm: torch.fx.GraphModule) -> None:
    stable_topological_sort(gm.graph)
    gm.graph.eliminate_dead_code()


READS = [0]


@contextlib.contextmanager
def counting_reads():
    """Put a counting wrapper in place of ``read_streams`` wherever streampass imported it,
    for the block."""
    from streampass.analysis import reading

    original = reading.read_streams

    def counted(*args, **kwargs):
        READS[0] += 1
        return original(*args, **kwargs)

    modules = [m for n, m in list(sys.modules.items()) if n.startswith("streampass")]
    patched = [m for m in modules if getattr(m, "read_streams", None) is original]
    for m in patched:
        m.read_streams = counted
    try:
        yield
    finally:
        for m in patched:
            m.read_streams = original


class Measured(spi.StreamPass):
    """StreamPass that times each call of a whole graph and counts its readings."""

    def __init__(self, assign: str | None = None):
        # priced for an H100: with the default cost a CPU graph keeps one stream, and this measures the search
        super().__init__(assign=assign, assign_cost="h100" if assign else None)
        self.rows: list[dict] = []

    def __call__(self, graph, is_inference=None):
        seen = len(self.reports)
        received = len(graph.nodes)
        baseline = copies(graph)  # as the pass receives it
        READS[0] = 0
        elapsed = timed(super().__call__, graph, is_inference)
        torch_s = statistics.median(timed(torch_passes, gm) for gm in baseline)
        if len(self.reports) > seen:  # a whole graph (a sync subgraph is passed over)
            r = self.reports[-1]
            self.rows.append(
                {
                    "graph": r.graph,
                    "nodes": len(graph.nodes),  # after the pass, as in the tables of docs/benchmarks.md
                    "nodes_received": received,
                    "streampass_s": elapsed,
                    "reads": READS[0],
                    "torch_s": torch_s,
                    "waits_added": r.waits_added,
                    "assigned": r.assigned,
                }
            )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="default: results/compile_reads[_assign].json")
    p.add_argument(
        "--assign", choices=["auto"], help="StreamPass(assign='auto'): streams chosen for what the model left unplaced"
    )
    args = p.parse_args(argv)
    out_path = args.out or HERE / "results" / ("compile_reads_assign.json" if args.assign else "compile_reads.json")
    torch.manual_seed(0)
    model = Stack(args.layers)
    x = torch.randn(2, 64, 256, requires_grad=True)
    passes = Measured(args.assign)
    # compile_threads=1: kernels compile in this process, not in workers that would compete with
    # the pass being timed for the CPU
    with (
        tempfile.TemporaryDirectory() as cache,
        mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}),
        inductor_config.patch(fx_graph_cache=False, compile_threads=1),
        counting_reads(),
    ):
        torch._dynamo.reset()
        t = time.perf_counter()
        with spi.enabled(passes):
            out = torch.compile(model)(x)
        compile_s = {"forward": time.perf_counter() - t}
        t = time.perf_counter()
        out.sum().backward()  # the backward compiles here, after the block
        compile_s["backward"] = time.perf_counter() - t
        torch._dynamo.reset()
    for r in passes.rows:
        r["compile_s"] = compile_s.get(r["graph"])
    print("| graph | nodes | StreamPass | read_streams calls | torch's sort + DCE | ratio | whole compile |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in passes.rows:
        print(
            f"| {r['graph']} | {r['nodes']:,} | {r['streampass_s'] * 1e3:.0f} ms | {r['reads']} | "
            f"{r['torch_s'] * 1e3:.0f} ms | {r['streampass_s'] / r['torch_s']:.1f}x | "
            f"{r['compile_s'] or float('nan'):.1f} s |"
        )
        if r["assigned"]:
            print(f"|   | {r['assigned']} |")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps({"layers": args.layers, "assign": args.assign, "python": platform.python_version(),
                    "torch": torch.__version__, "graphs": passes.rows}, indent=2) + "\n"
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

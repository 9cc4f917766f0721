"""``assign="auto"`` on a real GPU: measured wall time against one stream, next to the simulator's
prediction (issue 15; a script, not a test).

    python benchmarks/gpu_assign.py [--out benchmarks/results/gpu_assign.json] [--iters 30]
    python benchmarks/gpu_assign.py --cpu-dry-run     # tiny sizes on CPU: the numbers mean nothing

The programs are benchmarks/assign.py's (the simulator's table in docs/benchmarks.md), run on
the device instead of traced on meta tensors: the inception block at batch 32 and 256, the MoE
layer, the embedding towers, a training step of the MLP stack (forward compiled, backward after
it, as a training loop does), the transformer block's forward and a ResNet block's training
step, both with their hand annotations off. Each is compiled twice in a fresh dynamo state:

* ``one stream``: plain ``torch.compile`` (what a user has without streampass);
* ``auto``: ``torch.compile`` under ``streampass.inductor.enabled(StreamPass(assign="auto"))``,
  with the default cost, the device's own profile (h200, h100 or a100 by its name), as users get it.

For each: the outputs (and gradients) of both against each other, the median wall time per
call over ``--iters`` after warm-up (CUDA-synchronised), the measured speedup, and the
simulator's prediction for the same graphs (summed over forward and backward: the ``assigned``
numbers of StreamPass's reports, which the pass priced before inductor fused anything). A
program whose assignment stays on one stream is measured too: there the two should be equal.
Writes JSON and prints one line per program; a failure is recorded and the others still run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "gpu_assign.json"
sys.path.insert(0, str(HERE))
import assign as programs  # noqa: E402  (benchmarks/assign.py: the simulator's programs)
import bench_models  # noqa: E402
from gpu_check import median_time  # noqa: E402


def _module_step(name: str, device: str, small: bool):
    """bench_models' block with its annotations off: the transformer's forward, or the ResNet
    block's training step (its loss; the backward reaches the parameters too)."""
    m, x = bench_models.model_inputs(name, device=device, small=small)
    m.streams = False
    if name == "transformer":
        return m, [x], False
    return _Loss(m), [x.requires_grad_()], True


class _Loss(torch.nn.Module):
    """A block's training loss, as a module: the step's backward fills its parameters' grads."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x).float().pow(2).mean()


def program_list(device: str, small: bool) -> dict:
    """name -> a maker of ``(function, args, training)`` on ``device``; ``small``: sizes for a CPU run."""
    if small:
        return {
            "inception, batch 2": lambda: (*programs.inception(2, device, c=16, hw=8), False),
            "MoE (4 experts)": lambda: (*programs.moe(4, 64, 32, 64, device=device), False),
            "embedding towers (2)": lambda: (*programs.towers(2, 16, 8, 50, device=device), False),
            "MLP (2 layers), training step": lambda: (*programs.mlp(2, 16, 32, device=device), True),
            "ResNet block, training step": lambda: _module_step("resnet", device, small),
        }
    return {
        "inception, batch 32": lambda: (*programs.inception(32, device), False),
        "inception, batch 256": lambda: (*programs.inception(256, device), False),
        "MoE (8 experts)": lambda: (*programs.moe(device=device), False),
        "embedding towers (4)": lambda: (*programs.towers(device=device), False),
        "MLP (4 layers), training step": lambda: (*programs.mlp(device=device), True),
        "transformer block": lambda: _module_step("transformer", device, small),
        "ResNet block, training step": lambda: _module_step("resnet", device, small),
    }


def _leaves(fn, args) -> list[torch.Tensor]:
    """What a training step's backward fills: the inputs and the module parameters that need grads."""
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    return [t for t in (*args, *params) if isinstance(t, torch.Tensor) and t.requires_grad]


def _step(compiled, args, leaves: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """One step as a user runs it: inference (``leaves`` None) under no_grad; training, the
    forward and then ``backward()`` after it. Returns the output (and, for training, the
    gradients of ``leaves`` it made)."""
    if leaves is None:
        with torch.no_grad():
            return [compiled(*args)]
    for t in leaves:
        t.grad = None
    out = compiled(*args)
    out.backward()
    return [out.detach(), *(t.grad for t in leaves)]


def measure(name: str, make, iters: int, cost=None) -> dict:
    """``cost``: ``assign_cost``; None, the default, is the device's own (what users get)."""
    import streampass.inductor as spi

    fn, args, training = make()
    leaves = _leaves(fn, args) if training else None
    row: dict = {"program": name, "training": training}
    results = {}
    for mode in ("one stream", "auto"):
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        if mode == "auto":
            p = spi.StreamPass(assign="auto", assign_cost=cost)
            with spi.enabled(p):
                results[mode] = _step(compiled, args, leaves)  # compiles forward (and backward)
            if not p.reports:
                raise RuntimeError("StreamPass saw no graph: a warm compile cache? (main() uses a fresh one)")
            assigned = [r.assigned for r in p.reports if r.assigned]
            row["graphs"] = [r.graph for r in p.reports]
            row["side_streams"] = max((a["side_streams"] for a in assigned), default=0)
            row["predicted_us"] = round(sum(a["predicted_us"] for a in assigned), 1)
            row["predicted_one_stream_us"] = round(sum(a["one_stream_us"] for a in assigned), 1)
            row["predicted_speedup"] = (
                round(row["predicted_one_stream_us"] / row["predicted_us"], 3) if row["predicted_us"] else None
            )
        else:
            results[mode] = _step(compiled, args, leaves)
        row[f"{mode.replace(' ', '_')}_s"] = median_time(
            functools.partial(_step, compiled, args, leaves), iters, warmup=3
        )
    # bf16 programs, two compiles that may fuse differently: agreement to bf16's precision
    row["results_match"] = all(
        torch.allclose(a.float(), b.float(), atol=5e-2, rtol=5e-2)
        for a, b in zip(results["one stream"], results["auto"])
    )
    row["measured_speedup"] = round(row["one_stream_s"] / row["auto_s"], 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--only", nargs="+", metavar="PROGRAM", help="the programs to run (names as printed)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny sizes on CPU, to exercise the script")
    args = ap.parse_args(argv)
    from streampass.assign.in_compile import device_cost

    if args.cpu_dry_run:
        device, iters = "cpu", 1
        # every aten kernel 100 us, so that side streams pay on tiny sizes and the dry run goes
        # through the multi-stream path (assignment, syncs, the backward after the block)
        from streampass.sim.cost import CostModel

        def aten_100us(node):
            t = node.target
            return 1e-4 if isinstance(t, torch._ops.OpOverload) and t.namespace == "aten" else None

        profile = CostModel("h100", overrides=aten_100us)
    elif not torch.cuda.is_available():
        print("gpu_assign: no CUDA device here; nothing measured (--cpu-dry-run exercises the script)", file=sys.stderr)
        return 2
    else:
        device, iters, profile = "cuda", args.iters, None  # the default: the device's own
    torch.manual_seed(0)
    report = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "profile": device_cost(None, torch.device("cuda"))
        if profile is None
        else "h100, every aten kernel 100 us (dry run)",
        "torch": torch.__version__,
        "programs": [],
    }
    # A fresh compile cache: on a hit inductor does not run the pass, and there would be no prediction
    with (
        tempfile.TemporaryDirectory(prefix="gpu_assign_") as cache,
        mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}),
    ):
        failed = _measure_all(args, report, device, iters, profile)
    return 1 if failed else 0


def _measure_all(args, report: dict, device: str, iters: int, profile) -> int:
    """Each program in turn, the JSON rewritten after each; returns how many failed."""
    failed = 0
    for name, make in program_list(device, small=args.cpu_dry_run).items():
        if args.only and name not in args.only:
            continue
        print(f"gpu_assign: {name} ...", file=sys.stderr, flush=True)
        try:
            row = measure(name, make, iters, profile)
        except Exception as e:  # keep the other programs' numbers
            failed += 1
            row = {"program": name, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"}
            print(f"{name}: {row['error']}")
        else:
            print(
                f"{name:32} one stream {row['one_stream_s'] * 1e6:10.1f} us, auto {row['auto_s'] * 1e6:10.1f} us "
                f"({row['side_streams']} side streams): measured {row['measured_speedup']:.2f}x, "
                f"predicted {row['predicted_speedup']}x; results match: {row['results_match']}",
                flush=True,
            )
            failed += not row["results_match"]
        report["programs"].append(row)
        if not args.cpu_dry_run or args.out != DEFAULT_OUT:
            # after every program: a run stopped by a time limit keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    wrote = "" if args.cpu_dry_run and args.out == DEFAULT_OUT else f"; JSON in {args.out}"
    print(f"gpu_assign: {len(report['programs'])} programs, {failed} failed{wrote}", file=sys.stderr)
    return failed


if __name__ == "__main__":
    sys.exit(main())

"""run's final check: the region check against the full re-read, and torch's passes, in one run.

    python benchmarks/final_check.py [--sizes 16000] [--repeats 3] [--out benchmarks/results/final_check.json]

For each size and graph family of benchmarks/run.py, times ``streampass.run`` with
``check="region"`` (the default: the edit's kept reading, only its touched nodes re-read),
``check="full"`` (the whole rewritten graph re-read and verified) and ``check=False``, and
torch's ``insert_backward_syncs`` + ``wrap_all_sync_nodes_with_control_deps`` on the same graphs
as the baseline. Each measurement runs on a fresh deep copy (not timed); best of ``--repeats``.
Prints one markdown table (pasted into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

import streampass as sp  # noqa: E402


def modes():
    return {
        "region": lambda gm: sp.run(gm, check="region"),
        "full": lambda gm: sp.run(gm, check="full"),
        "none": lambda gm: sp.run(gm, check=False),
        "torch": bench.torch_passes(),
    }


def measure(sizes, repeats, seed=0) -> list[dict]:
    rows = []
    fns = modes()
    for n in sizes:
        for family in bench.FAMILIES:
            template = bench.synthetic_graph(n, family, seed)
            best = {}
            for _ in range(repeats):
                for name, fn in fns.items():  # interleaved, so drift hits every mode alike
                    t = bench.timed(fn, copy.deepcopy(template))
                    best[name] = min(best.get(name, t), t)
            check = copy.deepcopy(template)
            result = sp.run(check)
            rows.append(
                {"family": family, "nodes": n, "seconds": best, "ok": result.ok, "full_ok": sp.verify(check).ok}
            )
    return rows


def markdown(rows) -> str:
    lines = [
        "| family | nodes | run, region check | run, full check | run, no check | region / full | "
        "torch's passes | torch / run (region) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["seconds"]
        lines.append(
            f"| {r['family']} | {r['nodes']:,} | {s['region']:.3f} s | {s['full']:.3f} s | {s['none']:.3f} s | "
            f"{s['region'] / s['full']:.2f} | {s['torch']:.3f} s | {s['torch'] / s['region']:.1f}x |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="*", default=[16000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results" / "final_check.json")
    args = p.parse_args(argv)
    rows = measure(args.sizes, args.repeats)
    print(markdown(rows))
    bad = [r for r in rows if not (r["ok"] and r["full_ok"])]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"torch": torch.__version__, "python": platform.python_version(), "machine": bench.machine(), "rows": rows},
            indent=1,
        )
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

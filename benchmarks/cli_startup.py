"""How long the command line takes to answer when it needs no graph, against importing torch.

``python benchmarks/cli_startup.py [--runs N]`` times, in one run and alternating, fresh
processes of ``python -m streampass --help``, ``--version``, a usage error, and
``python -c "import torch"`` (the floor every command that traces a graph pays), and prints
medians and the ratio. No timed unit test: the suite checks only that these paths import no
torch (tests/test_cli.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "streampass --help": [sys.executable, "-m", "streampass", "--help"],
    "streampass --version": [sys.executable, "-m", "streampass", "--version"],
    "streampass inspect (usage error)": [sys.executable, "-m", "streampass", "inspect"],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(args.runs):
        for name, cmd in CASES.items():
            t = time.perf_counter()
            subprocess.run(cmd, capture_output=True)
            times[name].append(time.perf_counter() - t)
    floor = statistics.median(times['python -c "import torch"'])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:36s} {m * 1000:8.1f} ms   {m / floor:6.3f} x import torch")


if __name__ == "__main__":
    main()

"""Does the simulator predict what side streams buy on a real GPU?  (A script, not a test.)

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.json] [--iters 50]

For a two-branch model (two independent chains of matmuls, summed at the end) in two sizes:
``small`` (512x512 bf16: kernels that leave most of the GPU idle, where streams should help)
and ``large`` (4096x4096 bf16: each kernel fills the GPU, so overlap buys little), it

1. traces the model with ``make_fx`` twice: once with the second branch under
   ``streampass.stream(1)``, once with everything on the ambient stream;
2. makes the side-stream graph race-free with ``streampass.run`` and checks both graphs give
   the same result as the plain function;
3. measures wall time per call (median over ``--iters``, after warm-up, CUDA-synchronised),
   in three ways where they work: eager through ``streampass.execute`` (a Python interpreter:
   launch-bound for small kernels), the same replayed as a CUDA graph (no launch overhead),
   and ``torch.compile`` of the annotated function (recorded as an error if it fails);
4. simulates both graphs with the h100 or h200 profile (whichever matches the device;
   ``cpu_launch`` off and on) and writes measured vs predicted times and speedups as JSON.

Exits with status 2 and a message when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo

HERE = Path(__file__).resolve().parent


def branches(x, w, use_streams: bool, depth: int):
    import streampass as sp

    ctx = sp.stream(1) if use_streams else contextlib.nullcontext()
    a = x
    for _ in range(depth):
        a = torch.tanh(a @ w)
    with ctx:
        b = x
        for _ in range(depth):
            b = torch.tanh(b @ w.t())
    return a + b


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_time(fn, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def as_cuda_graph(fn):
    """``fn`` captured once into a CUDA graph; returns a replay function (raises if capture fails)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def check_config(
    name: str, n: int, depth: int, iters: int, profile: str, device: str = "cuda", compile: bool = True
) -> dict:
    from torch.fx.experimental.proxy_tensor import make_fx

    import streampass as sp
    from streampass.sim.simulate import simulate

    torch.manual_seed(0)
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16) / n**0.5
    w = torch.randn(n, n, device=device, dtype=torch.bfloat16) / n**0.5
    expected = branches(x, w, False, depth)

    serial_gm = make_fx(lambda x, w: branches(x, w, False, depth))(x, w)
    stream_gm = make_fx(lambda x, w: branches(x, w, True, depth))(x, w)
    result = sp.run(stream_gm)
    out: dict = {
        "config": name,
        "n": n,
        "depth": depth,
        "syncs": result.summary(),
        "verify_ok": sp.verify(stream_gm).ok,
    }

    got_serial = sp.execute(serial_gm, x, w)
    got_streams = sp.execute(stream_gm, x, w)
    _sync()
    out["results_match"] = bool(
        torch.allclose(got_serial, expected, atol=1e-2) and torch.allclose(got_streams, expected, atol=1e-2)
    )

    measured: dict = {}
    runners = {
        "eager_execute": (lambda: sp.execute(serial_gm, x, w), lambda: sp.execute(stream_gm, x, w)),
    }
    for mode, (one, two) in runners.items():
        measured[mode] = {"one_stream_s": median_time(one, iters), "side_stream_s": median_time(two, iters)}

    def joined(gm):
        # A capture must end with every forked stream joined back into the capturing stream;
        # the waits streampass leaves on side streams at exit (deferred frees) are not joined.
        def call():
            sp.execute(gm, x, w)
            table = sp.runtime.table_of(gm)
            cur = torch.cuda.current_stream()
            for st in table.streams.values() if table is not None else ():
                if st != cur:
                    cur.wait_stream(st)

        return call

    try:
        one = as_cuda_graph(joined(serial_gm))
        two = as_cuda_graph(joined(stream_gm))
        measured["cuda_graph"] = {"one_stream_s": median_time(one, iters), "side_stream_s": median_time(two, iters)}
    except Exception as e:
        measured["cuda_graph"] = {"error": repr(e)[:300]}
    try:
        if not compile:
            raise RuntimeError("skipped (--cpu-dry-run)")
        torch._dynamo.reset()
        c_one = torch.compile(lambda x, w: branches(x, w, False, depth))
        c_two = torch.compile(lambda x, w: branches(x, w, True, depth))
        ok = torch.allclose(c_two(x, w), expected, atol=1e-2)
        measured["torch_compile"] = {
            "one_stream_s": median_time(lambda: c_one(x, w), iters),
            "side_stream_s": median_time(lambda: c_two(x, w), iters),
            "results_match": bool(ok),
        }
    except Exception as e:
        measured["torch_compile"] = {"error": repr(e)[:300]}
    for m in measured.values():
        if "one_stream_s" in m:
            m["speedup"] = m["one_stream_s"] / m["side_stream_s"]
    out["measured"] = measured

    predicted: dict = {}
    for cpu_launch in (False, True):
        s_two = simulate(stream_gm, profile, cpu_launch=cpu_launch)
        s_one = simulate(serial_gm, profile, cpu_launch=cpu_launch)
        predicted["cpu_launch" if cpu_launch else "device_only"] = {
            "one_stream_s": s_one.makespan,
            "side_stream_s": s_two.makespan,
            "critical_path_s": s_two.critical_path_time,
            "speedup": s_one.makespan / s_two.makespan,
            "schedule_races": len(s_two.races),
        }
    out["predicted"] = predicted
    cg = measured.get("cuda_graph", {})
    if "side_stream_s" in cg:
        p = predicted["device_only"]
        out["cuda_graph_vs_prediction"] = {
            "one_stream_ratio": cg["one_stream_s"] / p["one_stream_s"],
            "side_stream_ratio": cg["side_stream_s"] / p["side_stream_s"],
            "speedup_measured": cg["speedup"],
            "speedup_predicted": p["speedup"],
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "results" / "gpu_check.json")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="exercise the script on CPU with tiny sizes (numbers mean nothing; no JSON)",
    )
    args = p.parse_args(argv)
    if args.cpu_dry_run:
        for cfg in (("small", 64, 3), ("large", 128, 2)):
            r = check_config(*cfg, iters=2, profile="h100", device="cpu", compile=False)
            assert r["verify_ok"] and r["results_match"], r
            print(json.dumps(r, indent=1))
        return 0
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing measured. "
            "Run it on a machine with an NVIDIA GPU.",
            file=sys.stderr,
        )
        return 2
    import streampass  # noqa: F401  (after the check: the message above needs no imports)

    name = torch.cuda.get_device_name()
    profile = "h200" if "H200" in name else "h100"
    report = {
        "device": name,
        "profile": profile,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "note": "simulator assumes kernels on different streams never slow each other down",
        "configs": [],
    }
    for cfg in (("small", 512, 16), ("large", 4096, 8)):
        print(f"gpu_check: {cfg[0]} ...", file=sys.stderr, flush=True)
        try:
            report["configs"].append(check_config(*cfg, iters=args.iters, profile=profile))
        except Exception as e:  # keep the other config's numbers
            report["configs"].append({"config": cfg[0], "error": repr(e)[:500]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for c in report["configs"]:
        if "error" in c:
            print(f"{c['config']}: error {c['error']}")
            continue
        for mode, m in c["measured"].items():
            if "speedup" in m:
                print(
                    f"{c['config']:>5} {mode:>14}: one stream {m['one_stream_s'] * 1e6:9.1f} us, "
                    f"side stream {m['side_stream_s'] * 1e6:9.1f} us, speedup {m['speedup']:.2f}x"
                )
            else:
                print(f"{c['config']:>5} {mode:>14}: {m.get('error')}")
        pr = c["predicted"]["device_only"]
        print(
            f"{c['config']:>5} {'predicted':>14}: one stream {pr['one_stream_s'] * 1e6:9.1f} us, "
            f"side stream {pr['side_stream_s'] * 1e6:9.1f} us, speedup {pr['speedup']:.2f}x"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

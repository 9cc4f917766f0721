"""streampass vs torch's own stream passes: pass time, syncs added, races left, simulated makespan.

    python benchmarks/run.py            # full: 1k, 4k, 16k, 64k nodes, 3 repeats
    python benchmarks/run.py --quick    # 1k and 4k nodes, 1 repeat (about a minute and a half on 2 cores)

Prints markdown tables (pasted into docs/benchmarks.md) and writes
benchmarks/results/<quick|full>.json.

torch's side is ``torch._functorch._aot_autograd.streams.insert_backward_syncs`` followed by
``wrap_all_sync_nodes_with_control_deps``, the passes aot_autograd runs on a joint graph.
They only touch nodes tagged ``partitioner_tag="is_backward"`` and ask the accelerator for the
current stream of any node without an explicit ``custom.stream``, so every node is tagged and
every call node annotated (stream 0 where it had none) before either pass runs; streampass
reads the same graphs. Each measurement runs on a fresh deep copy; copying is not timed.

Graphs are ``_LazyGraphModule``s, the class aot_autograd and inductor give their passes: both
passes end in ``gm.recompile()``, which then only marks the Python code stale instead of
regenerating it (code neither compiler runs). The collector stays on, as in real use.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

import streampass as sp
from streampass import ops
from streampass.sim.simulate import simulate
from streampass.synthetic import random_stream_graph
from streampass.transform.pipeline import collector_paused

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_models  # noqa: E402

# -- torch's passes ---------------------------------------------------------------------------------


def torch_passes():
    from torch._dynamo import graph_bytecode_inputs as table
    from torch._functorch._aot_autograd.streams import (
        insert_backward_syncs,
        wrap_all_sync_nodes_with_control_deps,
    )

    def run(gm):
        # Under torch.compile dynamo's object table holds the graph's streams when these passes
        # run, and their new events take the next indices. Outside a frame the table is empty and
        # events would start at 0, the ambient stream's index: fill it as dynamo would.
        table.reset_user_object_tracking()
        streams = [(n.meta.get("custom") or {}).get("stream", 0) for n in gm.graph.nodes]
        for _ in range(max(streams, default=0) + 1):
            table.register_graph_created_object(torch.Stream("cpu"), lambda index, cg: None)
        try:
            insert_backward_syncs(gm)
            wrap_all_sync_nodes_with_control_deps(gm)
        finally:
            table.reset_user_object_tracking()

    return run


def tag_for_torch(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """What torch's pass needs: backward tags, and an explicit stream on every call node."""
    for node in gm.graph.nodes:
        node.meta["partitioner_tag"] = "is_backward"
        if node.op == "call_function":
            custom = node.meta.get("custom")
            if not isinstance(custom, dict):
                node.meta["custom"] = custom = {}
            custom.setdefault("stream", 0)
    return gm


def sync_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    a = sp.read_streams(gm)
    c = Counter(call.target for call in a.syncs.values())
    return {
        "sync_nodes": len(a.syncs),
        "records": c[ops.RECORD_EVENT],
        "waits": c[ops.WAIT_EVENT] + c[ops.WAIT_STREAM] + c[ops.SYNC_DEALLOC],
    }


def added(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def timed(fn, gm) -> float:
    # Freeze what the benchmark holds (templates, earlier results) so the collector does not
    # rescan it during the pass: without this, a pass gets slower the more graphs are alive.
    gc.collect()
    gc.freeze()
    try:
        t = time.perf_counter()
        fn(gm)
        return time.perf_counter() - t
    finally:
        gc.unfreeze()


def run_sp(gm):
    sp.run(gm)


def run_sp_unchecked(gm):
    sp.run(gm, check=False)


def paused(fn):
    """``fn`` with Python's cyclic collector paused, as streampass.run pauses it for itself:
    shows how much of torch's time is the collector rather than its pass."""

    def run(*args):
        with collector_paused():
            fn(*args)

    return run


def _arg_names(a):
    return torch.fx.map_arg(a, lambda x: x.name)


def _shape(gm: torch.fx.GraphModule) -> list[tuple]:
    return [
        (n.name, n.op, n.target, _arg_names(n.args), _arg_names(n.kwargs), n.meta.get("custom")) for n in gm.graph.nodes
    ]


def _swaps(old_args, new_args) -> list[tuple[str, str]] | None:
    """The (old input, new input) name pairs that turn ``old_args`` into ``new_args``, if the two
    differ only in which nodes they hold (same structure, same constants); else None."""
    a, b = [], []

    def flat(x, out):
        if isinstance(x, (tuple, list)):
            out.append((type(x), len(x)))
            for y in x:
                flat(y, out)
        elif isinstance(x, dict):
            out.append((dict, tuple(x)))
            for y in x.values():
                flat(y, out)
        else:
            out.append(x)

    flat(old_args, a)
    flat(new_args, b)
    if len(a) != len(b):
        return None
    pairs, kept = {}, set()
    for x, y in zip(a, b):
        if isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node):
            if x.name == y.name:
                kept.add(x.name)
            elif pairs.setdefault(x.name, y.name) != y.name:
                return None  # one input read two new ways: not a plain swap
        elif x != y or isinstance(x, torch.fx.Node) or isinstance(y, torch.fx.Node):
            return None
    if kept & pairs.keys():
        return None  # an input swapped in one place and kept in another: replace_input_with swaps all
    return list(pairs.items())


_SAME = object()  # an edit step's field that does not change


def edit_script(template: torch.fx.GraphModule, result: torch.fx.GraphModule) -> tuple[list[tuple], list[str]]:
    """The graph edits that turn ``template`` into ``result`` (streampass's output), node by node
    in ``result``'s order: ("keep", name), ("swap", name, [(old input, new input), ...]),
    ("edit", name, target, args, kwargs, custom meta), each field ``_SAME`` where it does not
    change, or ("new", name, op, target, args, kwargs, meta); then the names ``result`` dropped."""
    old = {n.name: n for n in template.graph.nodes}
    names = _arg_names
    script = []
    for n in result.graph.nodes:
        o = old.get(n.name)
        if o is None:
            script.append(("new", n.name, n.op, n.target, n.args, n.kwargs, dict(n.meta)))
            continue
        target = _SAME if o.target is n.target else n.target
        args = _SAME if names(o.args) == names(n.args) else n.args
        kwargs = _SAME if names(o.kwargs) == names(n.kwargs) else n.kwargs
        custom = _SAME if o.meta.get("custom") == n.meta.get("custom") else n.meta.get("custom")
        if target is kwargs is custom is _SAME and (args is _SAME or _swaps(o.args, n.args) is not None):
            # Nothing, or only inputs swapped (a consumer now reads through a wait): FX's cheapest edit.
            script.append(("keep", n.name) if args is _SAME else ("swap", n.name, _swaps(o.args, n.args)))
        else:
            script.append(("edit", n.name, target, args, kwargs, custom))
    kept = {n.name for n in result.graph.nodes}
    return script, [name for name in old if name not in kept]


def edit_floor(template: torch.fx.GraphModule, result: torch.fx.GraphModule, repeats: int) -> float:
    """The time FX itself takes to make streampass's edits, with no analysis at all.

    Replays :func:`edit_script` on a fresh copy of ``template`` the cheapest way FX allows
    (nodes inserted after their predecessor, made without arguments and then given them;
    swapped inputs through ``replace_input_with``; the collector paused) and checks that the
    copy ends up node for node like ``result``. Any pass that produces this graph through FX
    pays at least this, so torch's time divided by it caps the speedup any such pass can
    reach. Median of ``repeats``.
    """
    script, dropped = edit_script(template, result)
    times = []
    for _ in range(repeats):
        gm = copy.deepcopy(template)
        for name, sub in result.named_children():  # the few shared sync subgraphs: not timed
            if not hasattr(gm, name):
                gm.add_submodule(name, sub)
        graph = gm.graph
        env = {n.name: n for n in graph.nodes}
        lookup = env.__getitem__

        def replay(_gm, env=env, lookup=lookup, graph=graph):
            prev = None
            for step in script:
                if step[0] == "keep":
                    prev = env[step[1]]
                    continue
                if step[0] == "swap":
                    node = env[step[1]]
                    for old, new in step[2]:
                        node.replace_input_with(env[old], env[new])
                elif step[0] == "edit":
                    _, name, target, args, kwargs, custom = step
                    node = env[name]
                    if target is not _SAME:
                        node.target = target
                    if args is not _SAME:
                        node.args = torch.fx.map_arg(args, lambda x: lookup(x.name))
                    if kwargs is not _SAME:
                        node.kwargs = torch.fx.map_arg(kwargs, lambda x: lookup(x.name))
                    if custom is not _SAME:
                        node.meta["custom"] = custom
                else:
                    _, name, op, target, args, kwargs, meta = step
                    with graph.inserting_after(prev) if prev is not None else graph.inserting_before(None):
                        node = graph.create_node(op, target, (), name=name)
                    node.args = torch.fx.map_arg(args, lambda x: lookup(x.name))
                    if kwargs:
                        node.kwargs = torch.fx.map_arg(kwargs, lambda x: lookup(x.name))
                    node.meta = meta
                    env[name] = node
                prev = node
            for name in dropped:
                graph.erase_node(env[name])

        times.append(timed(paused(replay), gm))
        if _shape(gm) != _shape(result):
            raise RuntimeError("edit_floor: the replay did not reproduce streampass's output")
    return statistics.median(times)


def read_floor(template: torch.fx.GraphModule, result: torch.fx.GraphModule, repeats: int) -> float:
    """The time a bare loop takes to look once at every node of the input and of the output
    (its stream annotation and its inputs), the collector paused: the least any pass spends
    that reads its input and checks its result. Median of ``repeats``."""

    def look(gm):
        stream: dict[torch.fx.Node, object] = {}
        crossing = 0
        for n in gm.graph.nodes:
            custom = n.meta.get("custom")
            s = custom.get("stream") if custom else None
            stream[n] = s
            for x in ops.input_nodes(n):
                crossing += stream[x] != s
        return crossing

    def both(_gm):
        look(template)
        look(result)

    return statistics.median(timed(paused(both), None) for _ in range(repeats))


# Two families of random 4-stream graphs (streampass.synthetic.random_stream_graph), told apart
# by how long a stretch of consecutive ops stays on one stream (uniform in 1..run_length):
#   regions      1-32 ops per stretch, like `with stream(k):` blocks around a few layers;
#   interleaved  1-4 ops per stretch: the stream changes every 2.5 ops on average, the
#                adversarial case where almost every edge crosses streams.
FAMILIES = {"regions": 32, "interleaved": 4}


def lazy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The module class aot_autograd and inductor hand to graph passes (`recompile()` only marks
    the code stale), so neither pass's time includes regenerating Python code it never runs."""
    return _LazyGraphModule(gm, gm.graph)


def synthetic_graph(n: int, family: str, seed: int) -> torch.fx.GraphModule:
    g = random_stream_graph(n, 4, seed=seed, inplace=0.0, copy_epilogue=False, run_length=FAMILIES[family])
    return lazy(tag_for_torch(g))


def bench_synthetic(sizes, repeats, seed=0, torch_max=None, families=tuple(FAMILIES), log=print) -> list[dict]:
    torch_run = torch_passes()
    passes = {
        "streampass": run_sp,
        "streampass_unchecked": run_sp_unchecked,
        "torch": torch_run,
        "torch_nogc": paused(torch_run),
    }
    for fn in passes.values():  # lazy imports and first-call costs are not measured
        fn(synthetic_graph(200, "interleaved", seed + 1))
    rows = []
    for family in families:
        for n in sizes:
            t = time.perf_counter()
            template = synthetic_graph(n, family, seed)
            gen = time.perf_counter() - t
            nodes = len(template.graph.nodes)
            base = sync_counts(template)
            before = sp.verify(template).by_kind()
            names = [k for k in passes if not k.startswith("torch") or torch_max is None or n <= torch_max]
            times: dict[str, list[float]] = {k: [] for k in names}
            out: dict[str, torch.fx.GraphModule] = {}
            for _ in range(repeats):  # side by side: alternate the passes
                for name in names:
                    out.pop(name, None)
                    g = copy.deepcopy(template)
                    times[name].append(timed(passes[name], g))
                    out[name] = g
            row = {
                "family": family,
                "run_length": FAMILIES[family],
                "nodes": n,
                "graph_nodes": nodes,
                "generate_s": gen,
                "hazards_before": before,
            }
            for name in names:
                row[name] = {
                    "times_s": times[name],
                    "median_s": statistics.median(times[name]),
                    "node_growth": len(out[name].graph.nodes) / nodes,
                    **added(base, sync_counts(out[name])),
                    "races_left": sp.verify(out[name]).by_kind(),
                }
            row["edit_floor_s"] = edit_floor(template, out["streampass"], repeats)
            row["read_floor_s"] = read_floor(template, out["streampass"], repeats)
            row["floor_s"] = row["edit_floor_s"] + row["read_floor_s"]
            if "torch" in row:
                row["speedup"] = row["torch"]["median_s"] / row["streampass"]["median_s"]
                row["speedup_unchecked"] = row["torch"]["median_s"] / row["streampass_unchecked"]["median_s"]
            log(
                f"  {family:>11} {n:>6} nodes: streampass {row['streampass']['median_s']:.3f} s"
                + (f", torch {row['torch']['median_s']:.3f} s ({row['speedup']:.1f}x)" if "torch" in row else "")
            )
            rows.append(row)
            del out, template
    return rows


# -- (c): real graphs ----------------------------------------------------------------------------------


def sched(gm, profile="h100") -> dict:
    s = simulate(gm, profile)
    return {
        "makespan_us": s.makespan * 1e6,
        "serial_us": s.serial_time * 1e6,
        "critical_path_us": s.critical_path_time * 1e6,
        "speedup": s.speedup,
        "schedule_races": len(s.races),
        "below_critical_path": s.below_critical_path,
    }


def bench_blocks(repeats, small=False, log=print, trace_dir=None) -> list[dict]:
    torch_run = torch_passes()
    rows = []
    for model in ("transformer", "resnet"):
        m, x = bench_models.model_inputs(model, small=small)
        graphs = bench_models.capture_fw_bw(m, x)
        for part, gm in graphs.items():
            template = lazy(tag_for_torch(gm))
            base = sync_counts(template)
            row = {
                "graph": f"{model} {part}",
                "graph_nodes": len(template.graph.nodes),
                "hazards_before": sp.verify(template).by_kind(),
                "unsynchronised": sched(template),
            }
            for name, fn in (("streampass", run_sp), ("torch", torch_run)):
                times, out = [], None
                for _ in range(repeats):
                    g = copy.deepcopy(template)
                    try:
                        times.append(timed(fn, g))
                    except Exception as e:  # report, don't hide
                        row[name] = {"error": repr(e)}
                        break
                    out = g
                if out is None:
                    continue
                row[name] = {
                    "median_s": statistics.median(times),
                    **added(base, sync_counts(out)),
                    "races_left": sp.verify(out).by_kind(),
                    "schedule": sched(out),
                }
                if trace_dir is not None:
                    simulate(out, "h100").save_chrome_trace(Path(trace_dir) / f"{model}_{part}_{name}.trace.json")
            log(f"  {row['graph']}: done")
            rows.append(row)
    return rows


# -- reporting -------------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            total = next((line for line in f if line.startswith("MemTotal")), None)
        if total is not None:
            mem = round(int(total.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "streampass": sp.__version__,
        "networkx": __import__("networkx").__version__,
    }


def races(d: dict) -> str:
    total = sum(d.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {v}" for k, v in d.items() if v) + ")"


def markdown(result: dict) -> str:
    out = []
    m = result["machine"]
    out.append(
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; "
        f"Python {m['python']}, torch {m['torch']}, networkx {m['networkx']}. "
        f"Command: `{result['command']}`.\n"
    )
    syn = result["synthetic"]
    out.append(
        "#### Pass time and node growth, random 4-stream graphs (median of "
        f"{len(syn[0]['streampass']['times_s'])}; fresh copy per run)\n"
    )
    out.append(
        "| family | nodes | streampass.run | run(check=False) | torch insert_backward_syncs + wrap "
        "| torch / run | torch / run(check=False) | node growth: streampass / torch | edit floor | read floor "
        "| torch / floor |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in syn:
        s, u, t = r["streampass"], r["streampass_unchecked"], r.get("torch")
        out.append(
            f"| {r['family']} | {r['nodes']:,} | {s['median_s']:.3f} s | {u['median_s']:.3f} s | "
            + (
                f"{t['median_s']:.3f} s | **{r['speedup']:.1f}x** | {r['speedup_unchecked']:.1f}x | "
                f"{s['node_growth']:.2f}x / {t['node_growth']:.2f}x | {r['edit_floor_s'] * 1e3:.0f} ms | "
                f"{r['read_floor_s'] * 1e3:.0f} ms | {t['median_s'] / r['floor_s']:.0f}x |"
                if t
                else f"not run | | | {s['node_growth']:.2f}x / | {r['edit_floor_s'] * 1e3:.0f} ms | "
                f"{r['read_floor_s'] * 1e3:.0f} ms | |"
            )
        )
    nogc = [r for r in syn if "torch_nogc" in r]
    if nogc:
        out.append("")
        out.append(
            "torch's passes with the collector paused too (streampass.run pauses it for itself): "
            + "; ".join(
                f"{r['family']} {r['nodes']:,}: {r['torch_nogc']['median_s']:.3f} s "
                f"({r['torch_nogc']['median_s'] / r['streampass']['median_s']:.1f}x streampass.run, "
                f"{r['torch_nogc']['median_s'] / r['floor_s']:.0f}x the floor)"
                for r in nogc
            )
            + "."
        )
    g = result.get("growth")
    if g:
        out.append("")
        for family, steps in g.items():
            out.append(
                f"Time growth for 4x the nodes ({family}): "
                + "; ".join(
                    f"{k}: streampass {v['streampass']:.2f}x" + (f", torch {v['torch']:.2f}x" if v.get("torch") else "")
                    for k, v in steps.items()
                )
                + "."
            )
    out.append("\n#### Syncs added and races left (`streampass.analysis.verify` on each result)\n")
    out.append(
        "| family | nodes | hazards before | streampass: records / waits | races left | "
        "torch: records / waits | races left |"
    )
    out.append("|---|---:|---|---:|---|---:|---|")
    for r in syn:
        s, t = r["streampass"], r.get("torch")
        out.append(
            f"| {r['family']} | {r['nodes']:,} | {races(r['hazards_before'])} | {s['records']} / {s['waits']} | "
            f"{races(s['races_left'])} | "
            + (f"{t['records']} / {t['waits']} | {races(t['races_left'])} |" if t else "| |")
        )
    out.append("\n#### Traced blocks (aot_function forward and backward), H100 profile\n")
    out.append(
        "| graph | nodes | hazards before | pass | time | records / waits | races left | "
        "makespan | serial | critical path | schedule races |"
    )
    out.append("|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|")
    for r in result["models"]:
        u = r["unsynchronised"]
        out.append(
            f"| {r['graph']} | {r['graph_nodes']} | {races(r['hazards_before'])} | none | | | | "
            f"{u['makespan_us']:.1f} us | {u['serial_us']:.1f} us | {u['critical_path_us']:.1f} us | "
            f"{u['schedule_races']} |"
        )
        for name in ("streampass", "torch"):
            p = r.get(name)
            if p is None:
                continue
            if "error" in p:
                out.append(f"| | | | {name} | error: `{p['error'][:80]}` | | | | | | |")
                continue
            s = p["schedule"]
            out.append(
                f"| | | | {name} | {p['median_s'] * 1e3:.1f} ms | {p['records']} / {p['waits']} | "
                f"{races(p['races_left'])} | {s['makespan_us']:.1f} us | {s['serial_us']:.1f} us | "
                f"{s['critical_path_us']:.1f} us | {s['schedule_races']} |"
            )
    return "\n".join(out)


def growth(rows) -> dict:
    out: dict[str, dict] = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        by = {r["nodes"]: r for r in rows if r["family"] == family}
        steps = {}
        for lo, hi in ((16000, 64000), (4000, 16000), (1000, 4000)):
            if lo in by and hi in by:
                g = {"streampass": by[hi]["streampass"]["median_s"] / by[lo]["streampass"]["median_s"]}
                if "torch" in by[hi] and "torch" in by[lo]:
                    g["torch"] = by[hi]["torch"]["median_s"] / by[lo]["torch"]["median_s"]
                steps[f"{hi // 1000}k/{lo // 1000}k"] = g
        if steps:
            out[family] = steps
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1k and 4k nodes, one repeat")
    p.add_argument("--sizes", type=int, nargs="*", help="node counts (default 1000 4000 16000 64000)")
    p.add_argument("--repeats", type=int, help="measurements per size (default 3, quick 1)")
    p.add_argument("--torch-max", type=int, default=None, help="skip torch's pass above this size")
    p.add_argument(
        "--families",
        nargs="*",
        choices=list(FAMILIES),
        default=list(FAMILIES),
        help="which random-graph families to run (default: all)",
    )
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/<quick|full>.json)")
    p.add_argument("--traces", type=Path, help="also write Chrome traces of the traced blocks here")
    args = p.parse_args(argv)
    sizes = args.sizes or ([1000, 4000] if args.quick else [1000, 4000, 16000, 64000])
    repeats = args.repeats or (1 if args.quick else 3)
    out = args.out or HERE / "results" / ("quick.json" if args.quick else "full.json")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    log("synthetic graphs:")
    syn = bench_synthetic(sizes, repeats, torch_max=args.torch_max, families=args.families, log=log)
    log("traced blocks:")
    if args.traces:
        args.traces.mkdir(parents=True, exist_ok=True)
    models = bench_blocks(repeats, log=log, trace_dir=args.traces)
    result = {
        "command": " ".join(
            [
                "python benchmarks/run.py",
                *(["--quick"] if args.quick else []),
                *([f"--repeats {args.repeats}"] if args.repeats else []),
                *([f"--sizes {' '.join(map(str, args.sizes))}"] if args.sizes else []),
                *([f"--families {' '.join(args.families)}"] if args.families != list(FAMILIES) else []),
            ]
        ),
        "machine": machine(),
        "synthetic": syn,
        "growth": growth(syn),
        "models": models,
        "wall_s": time.perf_counter() - t0,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    log(f"wrote {out} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Automatic stream assignment against its baselines, on the simulator (docs/assign.md).

For each graph (traced with make_fx on meta tensors, so the cost model sees real shapes, and
with no stream annotation): one stream, Nimble's chain cover, round robin over branches, and the
critical path on the ambient stream with the rest round robin, each annotated on a copy, made
race-free by ``streampass.run`` and simulated (H100 profile, ``cpu_launch=True``), then
``streampass.assign_streams``. Prints a table and writes benchmarks/results/assign.json.

    python benchmarks/assign.py [--max-streams 4] [--keep-fusions]
    python benchmarks/assign.py --scale 1 4 16 32

``--keep-fusions`` prices as ``assign="auto"`` does inside torch.compile: each chain inductor
fuses stays on one stream (in the baselines too) and costs one kernel. ``--scale`` measures
``assign_streams`` against the ``run`` that follows it on the training graph (forward and
backward) of a stack of that many transformer blocks instead, and writes
benchmarks/results/assign_scale.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models

import streampass as sp
from streampass.assign import candidates as cand
from streampass.assign.dag import work_graph
from streampass.assign.evaluate import evaluate
from streampass.assign.fusion import fused_cost, fusion_groups, keep_together
from streampass.sim.cost import CostModel
from streampass.transform.assign_apply import annotated_copy, drop_streams

BF16 = torch.bfloat16


def tensor(*shape, device="meta", dtype=BF16):
    """A random tensor (an empty one on the meta device, which make_fx traces for its shapes)."""
    if device == "meta":
        return torch.empty(*shape, device=device, dtype=dtype)
    return torch.randn(*shape, device=device, dtype=dtype) / max(shape[-1], 1) ** 0.5


# Each program is ``(function, arguments)``: traced with make_fx on meta tensors for the simulator
# (GRAPHS below), and compiled and timed on a GPU by benchmarks/gpu_assign.py.
def inception(batch: int = 32, device="meta", c: int = 256, hw: int = 28):
    def conv(x, w, pad=0):
        return F.relu(F.conv2d(x, w, padding=pad))

    def f(x, w1, w3a, w3, w5a, w5, wp):
        b1 = conv(x, w1)
        b3 = conv(conv(x, w3a), w3, 1)
        b5 = conv(conv(x, w5a), w5, 2)
        bp = conv(F.max_pool2d(x, 3, 1, 1), wp)
        return torch.cat([b1, b3, b5, bp], 1)

    shapes = [(64, c, 1, 1), (96, c, 1, 1), (128, 96, 3, 3), (16, c, 1, 1), (32, 16, 5, 5), (32, c, 1, 1)]
    return f, [tensor(batch, c, hw, hw, device=device), *[tensor(*s, device=device) for s in shapes]]


def moe(experts: int = 8, tokens: int = 8192, d: int = 1024, hidden: int = 4096, device="meta"):
    def f(x, router, *ws):
        probs = torch.softmax(x @ router, -1)  # [tokens, experts]
        chunks = x.view(experts, tokens // experts, d)  # tokens already dispatched, fixed capacity
        outs = []
        for i in range(experts):
            h = F.gelu(chunks[i] @ ws[2 * i]) @ ws[2 * i + 1]
            outs.append(h * probs.view(experts, tokens // experts, experts)[i, :, i : i + 1])
        return torch.stack(outs).view(tokens, d)

    ws = [tensor(*s, device=device) for _ in range(experts) for s in ((d, hidden), (hidden, d))]
    return f, [tensor(tokens, d, device=device), tensor(d, experts, device=device), *ws]


def towers(n: int = 4, batch: int = 4096, dim: int = 128, rows: int = 100_000, device="meta"):
    def f(*args):
        ids, tables, mlps, head = args[:n], args[n : 2 * n], args[2 * n : 4 * n], args[-1]
        feats = []
        for i in range(n):
            e = F.embedding(ids[i], tables[i]).sum(1)  # [batch, dim], a bag of 20 ids
            feats.append(F.relu(F.relu(e @ mlps[2 * i]) @ mlps[2 * i + 1]))
        return torch.cat(feats, 1) @ head

    if device == "meta":
        ids = [torch.empty(batch, 20, dtype=torch.long, device=device) for _ in range(n)]
    else:
        ids = [torch.randint(0, rows, (batch, 20), device=device) for _ in range(n)]
    tables = [tensor(rows, dim, device=device) for _ in range(n)]
    mlps = [tensor(*s, device=device) for _ in range(n) for s in ((dim, 1024), (1024, 256))]
    return f, [*ids, *tables, *mlps, tensor(256 * n, 1, device=device)]


def mlp(layers: int = 4, batch: int = 8192, d: int = 2048, device="meta"):
    """The loss of an MLP stack; its backward (weight and input gradients independent) is the graph."""

    def f(x, *ws):
        h = x
        for w in ws:
            h = F.gelu(h @ w)
        return h.sum()

    ws = [tensor(d, d, device=device).requires_grad_() for _ in range(layers)]
    return f, [tensor(batch, d, device=device).requires_grad_(), *ws]


def mlp_backward(layers: int = 4, batch: int = 8192, d: int = 2048):
    f, args = mlp(layers, batch, d)
    return make_fx(lambda *a: torch.autograd.grad(f(*a), list(a)))(*args)


def traced(program):
    """A GRAPHS entry: ``program``'s function traced with make_fx on meta tensors."""

    def build():
        f, args = program()
        return make_fx(f)(*args)

    return build


def transformer():
    m, x = bench_models.model_inputs("transformer")
    return drop_streams(make_fx(m)(x))


def resnet_fw_bw():
    m, x = bench_models.model_inputs("resnet")
    params = dict(m.named_parameters())
    names = list(params)

    def f(x, *ps):
        out = torch.func.functional_call(m, dict(zip(names, ps)), (x,))
        return torch.autograd.grad(out.sum(), [x, *ps])

    return drop_streams(make_fx(f)(x.requires_grad_(), *[p.detach().requires_grad_() for p in params.values()]))


def transformer_stack(layers: int):
    """The forward and backward of ``layers`` of bench_models' transformer block, one graph."""
    blocks = torch.nn.Sequential(*[bench_models.TransformerBlock() for _ in range(layers)]).to("meta", BF16)
    params = dict(blocks.named_parameters())
    names = list(params)

    def f(x, *ps):
        out = torch.func.functional_call(blocks, dict(zip(names, ps)), (x,))
        return torch.autograd.grad(out.sum(), [x, *ps])

    x = tensor(8, 1024, 1024).requires_grad_()
    return drop_streams(make_fx(f)(x, *[p.detach().requires_grad_() for p in params.values()]))


GRAPHS = {
    "inception (4 branches)": traced(inception),
    "inception, batch 256": traced(lambda: inception(256)),
    "MoE (8 experts)": traced(moe),
    "embedding towers (4)": traced(towers),
    "MLP backward (4 layers)": mlp_backward,
    "transformer block": transformer,
    "ResNet bottleneck fw+bw": resnet_fw_bw,
}
REPEAT = 5


BASELINES = {
    "one stream": lambda w, slots: cand.one_stream(w),
    "nimble": cand.chain_cover,
    "round robin": cand.round_robin,
    "critical path + rr": cand.critical_round_robin,
}


def measure(name: str, gm: torch.fx.GraphModule, model: CostModel, max_streams: int, fused: bool = False) -> dict:
    """``fused``: as ``assign="auto"`` inside torch.compile prices: what inductor fuses kept on
    one stream and priced as one kernel, in the baselines too (``assign.fusion``)."""
    a = sp.read_streams(gm)
    base = model  # what assign_streams is given; with fused, it builds the fused model itself
    groups = fusion_groups(a) if fused else []
    if groups:
        model = fused_cost(a, groups, model)
    w = work_graph(a, model)
    slots = cand.stream_slots(a, max_streams)
    free = {n.name for n in w.free}
    rows = {}
    for label, make in BASELINES.items():
        streams, _ = make(w, slots)
        if groups:
            streams, _ = keep_together(w, streams, groups)
        e = evaluate(gm, label, {n.name: s for n, s in streams.items()}, free, model)
        assert e.schedule.ok, (name, label)
        rows[label] = dict(makespan_us=e.makespan * 1e6, waits=e.waits, peak_mib=e.peak_bytes / 2**20, streams=e.used)
    choice, run_s, applied = timed_choice(gm, base, max_streams, REPEAT, fused)
    assert math.isclose(sp.simulate(applied, model, cpu_launch=True).makespan, choice.makespan, rel_tol=1e-9), name
    rows["assign_streams"] = dict(
        makespan_us=choice.makespan * 1e6,
        waits=choice.waits,
        peak_mib=choice.peak_bytes / 2**20,
        streams=choice.used,
        candidate=choice.candidate,
    )
    best = min(r["makespan_us"] for k, r in rows.items() if k != "assign_streams")
    return dict(
        graph=name,
        compute_nodes=len(w.nodes),
        critical_path_us=choice.schedule.critical_path_time * 1e6,
        rows=rows,
        assign_s=choice.seconds,
        run_s=run_s,
        candidates=len(choice.candidates),
        skipped=len(choice.skipped),
        assign_over_run=choice.seconds / run_s,
        meets_best_baseline=choice.makespan * 1e6 <= best * (1 + 1e-9),
        never_slower_than_one=choice.makespan <= choice.single_stream,
        waits_le_nimble=choice.waits <= rows["nimble"]["waits"],
        # the other targets, reported as measured (docs/assign.md says which are missed)
        within_115_critical_path=choice.makespan <= 1.15 * choice.schedule.critical_path_time,
        memory_le_125_one_stream=choice.peak_bytes <= 1.25 * rows["one stream"]["peak_mib"] * 2**20,
        assign_le_run=choice.seconds <= run_s,
    )


def timed_choice(gm, model: CostModel, max_streams: int, repeat: int, fused: bool = False):
    """``(choice, run seconds, the graph as assigned and run)``: the best of ``repeat`` for both
    timings, taken in turns (an assignment, then the run after it), so that both see the same
    machine: on a shared machine the speed of the same code drifts by a third from one minute
    to the next. The first call of either warms caches the other shares."""
    choice, run_s = None, float("inf")
    for _ in range(repeat):
        c = sp.assign_streams(gm, model, max_streams=max_streams, keep_fusions=fused)
        if choice is None or c.seconds < choice.seconds:
            choice = c
        applied = annotated_copy(gm, {})
        c.apply(applied)
        t0 = time.perf_counter()
        result = sp.run(applied, bind_runtime=False)
        run_s = min(run_s, time.perf_counter() - t0)
        assert result.ok and result.waits_added == c.waits
    return choice, run_s, applied


def scale(layers: list[int], model: CostModel, max_streams: int, repeat: int = 4) -> list[dict]:
    """``assign_streams`` against the ``run`` that follows it on ever larger training graphs
    (best of ``repeat`` each)."""
    rows = []
    for n in layers:
        gm = transformer_stack(n)
        choice, run_s, _ = timed_choice(gm, model, max_streams, repeat)
        rows.append(
            dict(
                layers=n,
                nodes=len(gm.graph.nodes),
                compute_nodes=len(choice.streams),
                assign_s=choice.seconds,
                run_s=run_s,
                assign_over_run=choice.seconds / run_s,
                priced=len(choice.candidates),
                skipped=len(choice.skipped),
                candidate=choice.candidate,
                makespan_us=choice.makespan * 1e6,
                single_stream_us=choice.single_stream * 1e6,
            )
        )
        r = rows[-1]
        print(
            f"{n:3d} layers {r['nodes']:6d} nodes: assign {r['assign_s'] * 1e3:8.1f} ms, run {r['run_s'] * 1e3:8.1f} ms, "
            f"assign / run {r['assign_over_run']:.2f}; {r['priced']} priced, {r['skipped']} skipped; "
            f"{r['candidate']}: {r['makespan_us']:.0f} us against {r['single_stream_us']:.0f} us on one stream",
            flush=True,
        )
    return rows


def pictures(folder: Path, model: CostModel, max_streams: int) -> None:
    """docs/img/assign_moe_*.svg: the MoE layer's simulated schedule on one stream and as chosen."""
    from streampass.view.schedule import schedule_svg

    gm = traced(moe)()
    choice = sp.assign_streams(gm, model, max_streams=max_streams)
    one = next(e for e in choice.candidates if e.name == "one stream")
    folder.mkdir(parents=True, exist_ok=True)
    for name, sched, title in (
        ("one_stream", one.schedule, "MoE layer, 8 experts, one stream"),
        ("auto", choice.schedule, f"MoE layer, 8 experts, assign_streams ({choice.candidate})"),
    ):
        (folder / f"assign_moe_{name}.svg").write_text(schedule_svg(sched, title=title), encoding="utf-8")
        print(f"wrote {folder / f'assign_moe_{name}.svg'}: {sched.makespan * 1e6:.1f} us")


#: the graphs' names in docs/benchmarks.md
LABELS = {"inception (4 branches)": "inception, 4 branches, batch 32"}


def markdown(results: list[dict]) -> str:
    """The results as the table in docs/benchmarks.md."""
    cols = ["one stream", "nimble", "round robin", "critical path + rr", "assign_streams"]
    head = ["graph", "nodes", "critical path", "one stream", "Nimble", "round robin", "critical path + rr"]
    head += ["**assign_streams**", "winner", "assign / run", "priced / skipped"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cell = {k: f"{v['makespan_us']:.1f}, {v['waits']} w, {v['peak_mib']:.0f}" for k, v in r["rows"].items()}
        cell["assign_streams"] = f"**{cell['assign_streams']}**"
        row = [LABELS.get(r["graph"], r["graph"]), str(r["compute_nodes"]), f"{r['critical_path_us']:.1f}"]
        row += [cell[k] for k in cols] + [r["rows"]["assign_streams"]["candidate"]]
        row += [f"{r['assign_s'] * 1e3:.1f} / {r['run_s'] * 1e3:.1f} ms", f"{r['candidates']} / {r['skipped']}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-streams", type=int, default=4)
    ap.add_argument(
        "--keep-fusions",
        action="store_true",
        help="price as assign='auto' inside torch.compile does: inductor's fusions kept and priced as one kernel",
    )
    ap.add_argument("--markdown", action="store_true", help="also print the table as docs/benchmarks.md has it")
    ap.add_argument("--out", help="default: benchmarks/results/assign.json (assign_fused.json with --keep-fusions)")
    ap.add_argument(
        "--picture", metavar="DIR", help="also write the MoE layer's schedules (one stream, chosen) as SVG here"
    )
    ap.add_argument(
        "--scale", type=int, nargs="+", metavar="LAYERS", help="time assign against run on transformer stacks instead"
    )
    args = ap.parse_args(argv)
    model = CostModel("h100")
    if args.scale:
        rows = scale(args.scale, model, args.max_streams)
        out = Path(args.out or Path(__file__).resolve().parent / "results" / "assign_scale.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        info = dict(profile="h100", cpu_launch=True, max_streams=args.max_streams, torch=torch.__version__)
        out.write_text(json.dumps(dict(meta=info, results=rows), indent=1) + "\n")
        print(f"wrote {out}")
        return
    if args.picture:
        pictures(Path(args.picture), model, args.max_streams)
    results = []
    for name, build in GRAPHS.items():
        results.append(measure(name, build(), model, args.max_streams, fused=args.keep_fusions))
    labels = [*BASELINES, "assign_streams"]
    print(f"{'graph':26} {'nodes':>5} {'CP us':>8} " + " ".join(f"{k[:18]:>22}" for k in labels) + "  assign/run")
    for r in results:
        cells = " ".join(
            f"{r['rows'][k]['makespan_us']:9.1f}us {r['rows'][k]['waits']:3d}w {r['rows'][k]['peak_mib']:5.0f}M"
            for k in labels
        )
        print(
            f"{r['graph']:26} {r['compute_nodes']:5d} {r['critical_path_us']:8.1f} {cells}  {r['assign_s'] * 1e3:.1f}/{r['run_s'] * 1e3:.1f} ms"
        )
        print(
            f"{'':41}winner: {r['rows']['assign_streams']['candidate']}, streams {r['rows']['assign_streams']['streams']}; "
            f"{r['candidates']} priced, {r['skipped']} skipped by their lower bound"
        )
    if args.markdown:
        print(markdown(results))
    default = "assign_fused.json" if args.keep_fusions else "assign.json"
    out = Path(args.out or Path(__file__).resolve().parent / "results" / default)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta_info = dict(
        profile="h100", cpu_launch=True, max_streams=args.max_streams, keep_fusions=args.keep_fusions,
        torch=torch.__version__,
    )  # fmt: skip
    out.write_text(json.dumps(dict(meta=meta_info, results=results), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""What the ``streampass`` commands do: ``demo`` (the embedded model, end to end) and ``inspect``.

:mod:`streampass.cli` parses the command line without importing torch and calls these.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
import warnings
from collections import Counter

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from streampass import annotate, ops, values
from streampass.analysis.dag import StreamDAG
from streampass.analysis.verify import verify
from streampass.errors import StreamPassError
from streampass.serial import run_serial
from streampass.transform.pipeline import run


class UsageError(Exception):
    """A command-line mistake: the CLI prints it as one line and exits with status 2."""


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    with warnings.catch_warnings():
        # torch's own pytree deprecation, raised while copying make_fx's input spec: not the user's
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        return copy.deepcopy(gm)


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
    original = _copy(gm)  # run() edits gm in place; the HTML report shows both
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
    print(
        f"rewritten graph called eagerly equals the original: {same} (on CPU streams and events are "
        f"no-ops, so this checks the rewrite kept the program's meaning; race-freedom is what the "
        f"static check above proves)"
    )
    auto = compare_assignments()
    print("\n".join(auto))
    _write_html(
        args,
        original,
        gm,
        "streampass demo: attention block with side streams",
        describe(before) + [f"pass: {result.summary()}"] + auto,
    )
    if not (result.ok and same):
        return 1
    return 0


def compare_assignments(batch: int = 2048, dim: int = 1024, cost: str = "h100") -> list[str]:
    """The demo block's hand-written streams against :func:`streampass.assign_streams` on the
    same block without them, both after the pass, simulated at a realistic size (traced on the
    meta device: no memory, no compute)."""
    from streampass.assign.choose import assign_streams
    from streampass.sim.simulate import simulate
    from streampass.transform.assign_apply import drop_streams

    with torch.device("meta"):
        gm, _ = trace_demo(batch, dim)
    plain = drop_streams(_copy(gm))  # the same block as if written without streampass.stream
    run(gm)
    hand = simulate(gm, cost, cpu_launch=True)
    choice = assign_streams(plain, cost)
    us = 1e6
    placed = {s: len(names) for s, names in sorted(choice.groups().items())}
    rows = [
        ("one stream", choice.single_stream, ""),
        ("hand-written streams", hand.makespan, "value projection on 1, gating MLP on 2"),
        (
            f"automatic ({choice.candidate})",
            choice.makespan,
            f"compute nodes per stream {placed}, {choice.waits} waits",
        ),
    ]
    width = max(len(r[0]) for r in rows) + 1
    head = f"== automatic streams (streampass.assign_streams), simulated on {cost} at batch {batch}, width {dim} =="
    return [head] + [f"  {(label + ':').ljust(width)} {t * us:8.1f} us  {why}".rstrip() for label, t, why in rows]


def _write_html(args: argparse.Namespace, before, after, title: str, lines: list[str]) -> None:
    if not getattr(args, "html", None):
        return
    from streampass.view.report import write_report

    path = write_report(args.html, before, after, title=title, lines=lines)
    print(f"HTML report: {path.resolve()}")


def _shape(spec: str) -> tuple[int, ...]:
    if not spec.strip():
        raise UsageError(
            "--shapes: an empty shape between commas; write sizes joined by x, shapes by commas: 8x16,16x4"
        )
    try:
        dims = tuple(int(x) for x in spec.strip().lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or any(d < 0 for d in dims):
        raise UsageError(
            f"--shapes: {spec.strip()!r} is not a shape; write sizes joined by x, shapes by commas: 8x16,16x4"
        )
    return dims


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise UsageError(f"--dtype: torch has no dtype {name!r}; for example float32, float16 or bfloat16")
    if not dt.is_floating_point:
        raise UsageError(f"--dtype: the example inputs are random normal values: {name} is not a floating-point dtype")
    return dt


def _import_target(target: str):
    mod_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: modules next to you are found
    try:
        obj = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name):
            raise UsageError(
                f"cannot import module {mod_name!r}: run from the folder that holds it, or put that folder on PYTHONPATH"
            ) from e
        raise
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        try:
            obj = obj()
        except TypeError as e:
            raise UsageError(
                f"{target}: the module class needs arguments ({e}); name a function that builds and returns "
                f"the module instead, e.g. {mod_name}:make_model"
            ) from e
    if not callable(obj):
        raise UsageError(f"{target} is not a function or module")
    if not isinstance(obj, torch.nn.Module) and _takes_no_arguments(obj):
        built = obj()  # a factory, as the hint above suggests: make_model() -> the module
        if not isinstance(built, torch.nn.Module):
            raise UsageError(f"{target} takes no arguments and returns {type(built).__name__}, not a module")
        obj = built
    return obj


def _takes_no_arguments(fn) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def load_target(
    target: str, shapes: str | None = None, dtype: str = "float32", device: str = "cpu"
) -> tuple[torch.fx.GraphModule, str | None]:
    """``(graph, note)``: the graph to inspect, from a ``torch.export`` program file (``.pt2``)
    or ``module:function`` (or ``module:ModuleClass``, built with no arguments) called on random
    inputs of ``shapes`` (``"8x16,16x4"``). A function is captured as ``torch.compile`` sees it
    (:func:`streampass.dynamo_capture.capture`: its ``torch.Stream`` blocks and syncs included);
    where dynamo cannot capture it as one graph, it is traced with make_fx and ``note`` says why.
    Raises :class:`UsageError` for what the user can fix."""
    if target.endswith(".pt2") or os.path.isfile(target):
        if not os.path.isfile(target):
            raise UsageError(f"no such file: {target}")
        try:
            program = torch.export.load(target)
        except Exception as e:  # a zip error, a key error, a version mismatch: the file is not one
            why = type(e).__name__ + (f": {str(e).strip().splitlines()[0]}" if str(e).strip() else "")
            raise UsageError(f"{target} is not a program torch.export.save wrote ({why})") from e
        # the flat ATen graph, parameters as inputs, with the custom.stream annotations
        gm = program.graph_module
        return gm, _exported_note(gm)
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise UsageError(f"TARGET must be a .pt2 file, module:function or module:Class, got {target!r}")
    dt = _dtype(dtype)
    inputs = [torch.randn(*_shape(spec), dtype=dt, device=device) for spec in shapes.split(",")] if shapes else []
    fn = _import_target(target)
    if isinstance(fn, torch.nn.Module):
        fn = fn.to(device=device)
    from streampass.dynamo_capture import capture

    try:
        return capture(fn, *inputs), None
    except StreamPassError as e:
        note = f"({e}; traced with make_fx instead, which does not see torch.Stream blocks or Event syncs)"
    try:
        return make_fx(fn)(*inputs), note
    except (TypeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        wants_ints = "scalar type" in first or "Long" in first  # e.g. an embedding's token ids
        hint = (
            "the random inputs are floating-point (--dtype): for integer inputs give a .pt2 program "
            "(torch.export.save) or a function that makes them"
            if wants_ints
            else "give --shapes one shape per tensor argument"
        )
        raise UsageError(f"tracing {target} on {len(inputs)} random input(s) failed: {first}; {hint}") from e


def _exported_note(gm: torch.fx.GraphModule) -> str | None:
    """What an exported graph cannot say about its streams. On CPU, dynamo (strict export)
    numbers the first ``torch.Stream`` a program uses 0, the ambient stream's index, and the file
    keeps no object table to tell them apart; non-strict export (torch's default) records no
    ``torch.Stream`` block at all. ``sp.stream`` blocks survive both."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    annotated = {(n.meta.get("custom") or {}).get("stream") for n in calls} - {None}
    if any(ops.as_sync_call(n) is not None for n in calls):
        annotated.add("sync")
    if not annotated:
        return "(torch.export records torch.Stream blocks only with strict=True; sp.stream blocks in either mode)"
    if 0 in annotated and {d.type for d in values.graph_devices(gm)} <= {"cpu"}:
        return (
            "(nodes annotated stream 0 are read as the ambient stream; if the program ran them on a "
            "torch.Stream, this file cannot say so: torch.export on CPU numbers the first torch.Stream 0. "
            "`streampass inspect module:function` reads dynamo's object table and tells them apart)"
        )
    return None


def inspect(args: argparse.Namespace) -> int:
    """``streampass inspect TARGET``: the demo's report for a user's program (see load_target)."""
    gm, note = load_target(args.target, args.shapes, args.dtype)
    original = _copy(gm)
    dag = StreamDAG.from_graph(gm)
    lines = [f"== streampass inspect {args.target} =="] + describe(dag)
    if note:
        lines.append(f"  {note}")
    report = verify(gm)  # the bodies of higher-order ops too
    if report.streams != dag.streams:
        lines.append(f"  the bodies of its higher-order ops (torch.cond, ...) run on streams {report.streams}")
    if report.streams == [0]:
        lines.append("  (only the ambient stream: no node carries a stream annotation or runs in a fork/join region)")
    hazards = report.hazards
    kinds = Counter(h.kind for h in hazards)
    lines.append(
        f"hazards before the pass: {len(hazards)} ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})"
    )
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


def assign(args: argparse.Namespace) -> int:
    """``streampass assign TARGET``: :func:`streampass.assign_streams` on a user's program; prints
    the streams chosen and the predicted schedule against one stream, writes the HTML report
    (the graph as traced, then as assigned and synced)."""
    from streampass.assign.choose import assign_streams

    if args.max_streams < 1:
        raise UsageError(f"--max-streams must be at least 1, got {args.max_streams}")
    from streampass.sim.cost import PROFILES

    if args.cost not in PROFILES:
        raise UsageError(f"--cost: no device profile {args.cost!r}; known: {', '.join(sorted(PROFILES))}")
    gm, note = load_target(args.target, args.shapes, args.dtype, device="meta" if args.meta else "cpu")
    original = _copy(gm)
    choice = assign_streams(gm, args.cost, max_streams=args.max_streams, keep_fusions=args.keep_fusions)
    fused = ", inductor's fusions kept" if args.keep_fusions else ""
    lines = [f"== streampass assign {args.target} ({args.cost}{fused}) =="] + ([f"  {note}"] if note else [])
    lines += choice.explain().splitlines()
    choice.apply(gm)
    result = run(gm)
    lines += [
        f"predicted: {choice.makespan * 1e6:.1f} us with streams {choice.used}, "
        f"{choice.single_stream * 1e6:.1f} us on one stream ({_speedup(choice.single_stream, choice.makespan)})",
        f"pass: {result.summary()}",
    ]
    print("\n".join(lines))
    if getattr(args, "html", None):
        from streampass.view.report import write_report

        path = write_report(
            args.html,
            original,
            gm,
            title=f"streampass assign {args.target}",
            lines=lines,
            cost=choice.model,
            cpu_launch=True,
        )
        print(f"HTML report: {path.resolve()}")
    return 0 if result.ok else 1


def _speedup(single: float, makespan: float) -> str:
    """``single / makespan`` as a factor; a graph with no kernels has none."""
    return f"{single / makespan:.2f}x" if makespan > 0 else "no kernels to time"

"""What a compiled program must compute: eager PyTorch, or, where eager cannot run on CPU, the
program's own graph run in order on one stream with every sync skipped.

On CPU ``torch.Event.record()`` and ``torch.Stream.wait_stream()`` raise ("cpu backend doesn't
support events"), so a program that records an event has no eager result here. For those the
reference is dynamo's graph of the program (before AOT autograd, inductor or streampass) run
by :func:`streampass.serial.run_serial`, which skips stream ops: on one stream, in program
order, every sync is a no-op, which is what the syncs mean on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import streampass as sp
import streampass.inductor as spi
from streampass import ops
from streampass.analysis.reading import events_recorded_outside, read_streams
from streampass.serial import run_serial

#: the running torch as (major, minor)
TORCH = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def planned_syncs(gm: torch.fx.GraphModule) -> int:
    """How many sync ops a graph holds after planning (the user's, torch's and streampass's); a
    compiled graph's waits on events recorded before it ran are read as StreamPass reads them."""
    syncs = read_streams(gm, events_recorded_outside(gm)).syncs.values()
    return sum(1 for c in syncs if c.target not in (ops.FORK, ops.JOIN))


def _serial_backend(gm: torch.fx.GraphModule, example_inputs):
    return lambda *args: run_serial(gm, *args)


def _events_unsupported(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "doesn't support events" in str(e)


def reference(fn, make_inputs):
    """``(output, inputs)`` of ``fn`` on fresh ``make_inputs()``: eager where CPU can run it."""
    inputs = make_inputs()
    try:
        return fn(*inputs), inputs
    except RuntimeError as e:
        if not _events_unsupported(e):
            raise
    torch._dynamo.reset()
    inputs = make_inputs()
    out = torch.compile(fn, backend=_serial_backend)(*inputs)
    torch._dynamo.reset()
    return out, inputs


def compile_and_compare(fn, *inputs, training=False, eager=None):
    """Compile ``fn`` under a keep-graphs StreamPass, call it once (and backward once, after the
    block), compare with the reference (or with ``eager``, the same computation written without
    syncs, where the reference cannot run ``fn``); returns the pass and the syncs the compiled
    code ran."""

    def fresh():
        return [t.clone().requires_grad_(training and t.is_floating_point()) for t in inputs]

    want, args_e = reference(eager or fn, fresh)
    p = spi.StreamPass(keep_graphs=True)
    args_c = fresh()
    before = sum(spi.RUNTIME_SYNCS.values())
    with spi.enabled(p):
        got = torch.compile(fn, fullgraph=True)(*args_c)
    if training:
        got.sum().backward()
    ran = sum(spi.RUNTIME_SYNCS.values()) - before
    torch.testing.assert_close(got, want)
    if training:
        want.sum().backward()
        for c, e in zip(args_c, args_e):
            torch.testing.assert_close(c.grad, e.grad)
    for r in p.reports:
        if r.verified_graph is not None:
            report = sp.verify(r.verified_graph)  # with the external events it carries
            assert report.ok, (r.graph, report)
    return p, ran


def job(script: str, *args: str, cache: str) -> dict:
    """Run ``tests/<script> args...`` in a process of its own, with torch's inductor cache in
    ``cache`` (a second call with the same folder finds it filled: warm), and return the JSON of
    the last line it printed."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    out = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), script), *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])

"""What a compiled program must compute: eager PyTorch, or, where eager cannot run on CPU, the
program's own graph run in order on one stream with every sync skipped.

On CPU ``torch.Event.record()`` and ``torch.Stream.wait_stream()`` raise ("cpu backend doesn't
support events"), so a program that records an event has no eager result here. For those the
reference is dynamo's graph of the program (before AOT autograd, inductor or streampass) run
by :func:`streampass.runtime.run_serial`, which skips stream ops: on one stream, in program
order, every sync is a no-op, which is what the syncs mean on CPU.
"""

from __future__ import annotations

import torch

from streampass import ops
from streampass.analysis.reading import read_streams
from streampass.runtime import run_serial


def planned_syncs(gm: torch.fx.GraphModule) -> int:
    """How many sync ops a graph holds after planning (the user's, torch's and streampass's)."""
    return sum(1 for c in read_streams(gm).syncs.values() if c.target not in (ops.FORK, ops.JOIN))


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

"""Working around torch 2.13's own stream passes where they break CPU graphs.

torch's AOT autograd runs ``sync_deallocations`` (``torch/_functorch/_aot_autograd/streams.py``)
on every joint graph whose nodes carry ``custom.stream``; its cost estimate imports triton,
so on a CPU-only machine training graphs with stream annotations crash with
``ModuleNotFoundError: triton``. The pass only serves CUDA memory (``record_stream`` and
deferred frees), which means nothing on CPU, so :func:`cpu_safe_aot` skips it for graphs
whose tensors are all on the CPU while the block runs. It swaps a module attribute for the
duration of the block (no torch file is edited) and checks the attribute still exists, so a
torch that renames it fails loudly rather than silently.

Checked on torch 2.13.0.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch


def graph_device_types(gm: torch.fx.GraphModule) -> set[str]:
    """Device types of the tensor values recorded in ``gm``'s node metadata."""
    out = set()
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else [val]:
            if isinstance(v, torch.Tensor):
                out.add(v.device.type)
    return out


@functools.cache
def _guarded_sync_deallocations():
    from torch._functorch._aot_autograd import graph_capture

    original = graph_capture.sync_deallocations

    def sync_deallocations(gm: torch.fx.GraphModule) -> None:
        if graph_device_types(gm) <= {"cpu"}:
            # torch's version estimates kernel times with triton and inserts record_stream,
            # which CPU has neither of; streampass plans CPU deallocations itself.
            return None
        return original(gm)

    sync_deallocations.__wrapped__ = original
    return graph_capture, original, sync_deallocations


_guard_depth = 0


def aot_guard_on() -> None:
    """Install the guard (counted: each call needs one :func:`aot_guard_off`)."""
    global _guard_depth
    graph_capture, _, guarded = _guarded_sync_deallocations()
    _guard_depth += 1
    graph_capture.sync_deallocations = guarded


def aot_guard_off() -> None:
    """Undo one :func:`aot_guard_on`; torch's pass is back when none is left."""
    global _guard_depth
    graph_capture, original, _ = _guarded_sync_deallocations()
    _guard_depth = max(_guard_depth - 1, 0)
    if _guard_depth == 0:
        graph_capture.sync_deallocations = original


@contextlib.contextmanager
def cpu_safe_aot() -> Iterator[None]:
    """Let AOT autograd trace CPU training graphs that carry stream annotations (nests).

    >>> import torch, streampass as sp
    >>> from functorch.compile import aot_function, nop
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return (y * x).sum()
    >>> x = torch.randn(3, requires_grad=True)
    >>> with cpu_safe_aot():
    ...     aot_function(f, nop)(x).backward()
    >>> x.grad.shape
    torch.Size([3])
    """
    aot_guard_on()
    try:
        yield
    finally:
        aot_guard_off()

"""Guards around torch's own AOT stream passes (``torch/_functorch/_aot_autograd/streams.py``),
where they break graphs streampass handles; installed for every compile StreamPass has
(:func:`cpu_safe_aot`, docs/versions.md). Each swaps a module attribute for the duration of a
block (no torch file is edited), and only where the torch in use has that attribute.

* ``sync_deallocations`` runs on every joint graph whose nodes carry ``custom.stream``; its
  cost estimate imports triton, so on a CPU-only machine training graphs with stream annotations
  crash with ``ModuleNotFoundError: triton``. The pass only serves CUDA memory
  (``record_stream`` and deferred frees), which means nothing on CPU: skipped for graphs whose
  tensors are all on the CPU (streampass plans CPU deallocations itself).
* ``wrap_all_sync_nodes_with_control_deps`` threads, through the ``control_deps`` of a
  ``wait_stream`` (and a synchronize), the inputs of the later nodes on the waiting stream. On
  torch 2.13 the backward's are among them, the loss's incoming gradient (``tangents_1``)
  included, so the forward's outputs depend on a backward input and AOT's partitioner fails
  ("Node sum_2 was invalid, but is output"): any training program with ``s.wait_stream(...)``
  in its forward, with or without streampass. The backward runs after the forward in a graph of
  its own, so a forward wait needs to order nothing of it: those are dropped.
* The same pass threads every graph input through a forward ``e.synchronize()`` on an event the
  graph does not record (one recorded by eager code or an earlier graph), the tangents included,
  with the same partitioner failure ("Node mul was invalid, but is output"; torch 2.12 and 2.13,
  with or without streampass; 2.14 scopes dependencies to their partition): where
  ``_wrap_sync_node`` still has 2.13's four arguments, a forward sync drops its backward
  dependencies.
* 2.14 and 2.15 scope those dependencies to their partition, but read a node with no
  ``partitioner_tag`` as forward, and the gradient's views that AOT returns for inputs the
  forward concatenated have none: ``_collect_sync_forward_deps`` reaches ``tangents_1`` through
  them, a forward ``s.synchronize()`` after an ``e.record()`` depends on it, and the partitioner
  has no cut ("failed to partition the joint forward-backward graph"). The same rule, applied to
  both maps that function returns.
* The same pass re-points every later use of a threaded value at its passthrough, the epilogue
  ``copy_`` into a graph input included (a buffer updated on the waiting stream: batch norm's
  running statistics, an EMA), and AOT refuses the graph ("n=copy_, n.args[0]=getitem_3";
  torch 2.13 to 2.15 for ``wait_stream``, 2.14 keeps the input for ``wait_event`` only). After
  the pass the copy writes the input again (:func:`streampass.transform.epilogue.
  copy_back_into_inputs`); its reads stay threaded, so a stream's read of a buffer after it
  waits for the stream that wrote it, outside the graph, stays after the wait.
* 2.13's pre-pass returns each wait's dependencies in a set's order, which changes from one
  process to the next, and with it the forward's saved tensors and so the backward's FX-graph
  cache key: a warm process compiled the backward again. They are put in graph order.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator

import torch


@functools.cache
def _guarded_sync_deallocations():
    from torch._functorch._aot_autograd import graph_capture

    original = graph_capture.sync_deallocations

    def sync_deallocations(gm: torch.fx.GraphModule) -> None:
        from streampass import values  # values imports ops, which imports compat

        if {d.type for d in values.graph_devices(gm)} <= {"cpu"}:
            return None
        return original(gm)

    sync_deallocations.__wrapped__ = original
    return graph_capture, original, sync_deallocations


@functools.cache
def _sync_deps_guards() -> tuple:
    """``(module, name, original, guarded)`` for each step of ``wrap_all_sync_nodes_with_
    control_deps`` guarded on this torch (see the module's docstring): 2.13's pre-pass
    ``_collect_wait_stream_forward_deps`` (wait_stream -> its dependencies), the wrapping of one
    sync (2.12 and 2.13), 2.14's pre-pass ``_collect_sync_forward_deps`` (waits and CPU barriers
    -> their dependencies), and the pass itself as AOT autograd's ``graph_capture`` calls it (2.12 on)."""
    from torch._functorch._aot_autograd import graph_capture, streams

    def kept(sync: torch.fx.Node, dep: torch.fx.Node) -> bool:
        return streams.is_bwd_node(sync) or not streams.is_bwd_node(dep)

    guards = []
    original = getattr(streams, "_collect_wait_stream_forward_deps", None)
    if original is not None:

        def keep_forward(graph: torch.fx.Graph, original=original) -> dict:
            # torch returns each list from a set, in an order that differs between processes:
            # graph order keeps the backward's inputs, and so its FX-graph cache key, the same.
            position = {n: i for i, n in enumerate(graph.nodes)}
            return {
                w: sorted((d for d in found if kept(w, d)), key=position.__getitem__)
                for w, found in original(graph).items()
            }

        keep_forward.__wrapped__ = original
        guards.append((streams, "_collect_wait_stream_forward_deps", original, keep_forward))
    original = getattr(streams, "_wrap_sync_node", None)
    if original is not None and list(inspect.signature(original).parameters) == [
        "gm",
        "sync_node",
        "deps_before_sync",
        "visited",
    ]:

        def forward_deps_only(gm, sync_node, deps_before_sync, visited, original=original):
            deps_before_sync = [d for d in deps_before_sync if kept(sync_node, d)]
            return original(gm, sync_node, deps_before_sync, visited)

        forward_deps_only.__wrapped__ = original
        guards.append((streams, "_wrap_sync_node", original, forward_deps_only))
    original = getattr(streams, "_collect_sync_forward_deps", None)
    if original is not None:

        def forward_syncs_keep_forward(graph: torch.fx.Graph, original=original) -> tuple:
            return tuple(
                {sync: type(deps)(d for d in deps if kept(sync, d)) for sync, deps in by_sync.items()}
                for by_sync in original(graph)
            )

        forward_syncs_keep_forward.__wrapped__ = original
        guards.append((streams, "_collect_sync_forward_deps", original, forward_syncs_keep_forward))
    original = getattr(graph_capture, "wrap_all_sync_nodes_with_control_deps", None)
    if original is not None:

        def wrap_then_copy_back(gm: torch.fx.GraphModule, original=original) -> None:
            from streampass.transform.epilogue import copy_back_into_inputs

            original(gm)
            copy_back_into_inputs(gm.graph)  # AOT autograd recompiles the module after

        wrap_then_copy_back.__wrapped__ = original
        guards.append((graph_capture, "wrap_all_sync_nodes_with_control_deps", original, wrap_then_copy_back))
    return tuple(guards)


_guard_depth = 0


def aot_guard_on() -> None:
    """Install the guards (counted: each call needs one :func:`aot_guard_off`)."""
    global _guard_depth
    graph_capture, _, guarded = _guarded_sync_deallocations()
    _guard_depth += 1
    graph_capture.sync_deallocations = guarded
    for module, name, _, replacement in _sync_deps_guards():
        setattr(module, name, replacement)


def aot_guard_off() -> None:
    """Undo one :func:`aot_guard_on`; torch's passes are back when none is left."""
    global _guard_depth
    graph_capture, original, _ = _guarded_sync_deallocations()
    _guard_depth = max(_guard_depth - 1, 0)
    if _guard_depth == 0:
        graph_capture.sync_deallocations = original
        for module, name, torch_s, _ in _sync_deps_guards():
            setattr(module, name, torch_s)


@contextlib.contextmanager
def cpu_safe_aot() -> Iterator[None]:
    """Let AOT autograd trace training graphs that carry stream annotations and user syncs, on
    CPU too (the guards above; nests).

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

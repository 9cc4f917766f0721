"""Saved tensors that share storage are not donated to the backward.

AOT autograd lets inductor reuse the memory of a tensor the forward saves for the backward (a
"donated buffer": the backward may write its results there once it has read it) when the tensor
shares storage with no forward input, user output or backward output
(``collect_bw_donated_buffer_idxs``). It does not compare the saved tensors with each other. A
user sync that torch wraps in ``control_deps`` before partitioning (``s1.wait_stream(s2)``,
``e.wait()``) passes values through, and the forward can then save one storage twice: a value
and its pass-through. Inductor writes a backward result into the first while a kernel still reads
the second, and the gradients come out wrong, with no error (a Linear's weight gradient 55.9 off
on a 4x8 input). So, before the forward compiles, every saved tensor that shares storage with
another saved tensor, a forward input or a user output (by the graph's aliasing, which sees through
pass-throughs, or by its fake tensor's storage) is taken off the donated list.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from streampass import values


def shared_saved_tensors(gm: torch.fx.GraphModule, saved: slice, user_outputs: int) -> set[int]:
    """The positions, among the tensors ``gm``'s output saves for the backward (``saved``, a
    slice of its outputs), of those that share storage with another saved tensor, an input of
    ``gm`` or one of its first ``user_outputs`` outputs.

    >>> import torch
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.ops.aten.sin.default, (x,))
    >>> z = g.call_function(torch.ops.aten.cos.default, (x,))
    >>> t = g.call_function(torch.ops.aten.t.default, (y,))
    >>> _ = g.output((x, y, t, z))  # x for the user; y, t and z saved
    >>> shared_saved_tensors(torch.fx.GraphModule({}, g), slice(1, 4), 1)
    {0, 1}
    """
    outputs = list(gm.graph.output_node().args[0])
    others = [*gm.graph.find_nodes(op="placeholder"), *outputs[:user_outputs]]
    keys = [_storage_keys(n) for n in outputs[saved]]
    seen: dict[Any, int] = {}
    for k in keys:
        for key in k:
            seen[key] = seen.get(key, 0) + 1
    outside = {key for n in others for key in _storage_keys(n)}
    return {i for i, k in enumerate(keys) if any(seen[key] > 1 or key in outside for key in k)}


def _storage_keys(node: Any) -> set:
    """What names ``node``'s storage: the graph value it is a view or pass-through of, and its
    fake tensor's storage (none for a non-tensor)."""
    if not isinstance(node, torch.fx.Node):
        return set()
    val = node.meta.get("val")
    keys: set = set()
    if isinstance(val, torch.Tensor) and val.layout == torch.strided:
        keys.add(("storage", StorageWeakRef(val.untyped_storage())))
    keys.add(("node", values.storage_root(node)))
    return keys


def keep_shared_saved_tensors(gm: torch.fx.GraphModule) -> list[int]:
    """Take the saved tensors of :func:`shared_saved_tensors` off the backward's donated buffers
    (``fw_metadata.bw_donated_idxs`` of the compile under way, which the backward compiles
    with). Call on a forward graph as inductor receives it; returns the backward input positions
    taken off."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    donated = getattr(meta, "bw_donated_idxs", None)
    if not donated:
        return []
    first = meta.num_symints_saved_for_bw or 0
    shared = shared_saved_tensors(gm, meta.tensors_saved_for_backwards_slice, meta.num_forward)
    dropped = [i for i in donated if i - first in shared]
    donated[:] = [i for i in donated if i - first not in shared]  # the list AOT's metadata shares
    return dropped

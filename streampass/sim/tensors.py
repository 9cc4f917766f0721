"""Sizes and bytes of the tensors a node's metadata describes (``meta["val"]``, else
``meta["tensor_meta"]``), read without running anything and without a guard on a symbolic
shape (symbolic sizes count by their hint). Shared by the cost model and the assigner.

>>> import torch
>>> t = torch.empty(3, 4, device="meta")
>>> numel(t), tensor_bytes(t), tensor_bytes(t.expand(5, 3, 4))  # a broadcast view covers 12 floats
(12, 48, 48)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils._pytree import tree_flatten, tree_map


def hint(x: Any) -> int | float | None:
    """A concrete number for ``x``; symbolic values give their hint, or None."""
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        try:
            return x.node.hint
        except Exception:
            return None
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    return None


def _as_tensor(value: Any) -> Any:
    """Turn a ``TensorMetadata`` into an empty meta tensor; pass others through."""
    if not isinstance(value, TensorMetadata):
        return value
    try:
        return torch.empty_strided(tuple(value.shape), tuple(value.stride), dtype=value.dtype, device="meta")
    except Exception:
        return None


def node_value(node: torch.fx.Node) -> Any:
    """The example value of a node: ``meta["val"]``, else ``meta["tensor_meta"]``."""
    if "val" in node.meta:
        return node.meta["val"]
    return tree_map(_as_tensor, node.meta.get("tensor_meta"), is_leaf=lambda v: isinstance(v, TensorMetadata))


def concrete_shape(x: Any) -> Any:
    """A tensor's shape as plain ints (symbolic sizes by hint); others unchanged."""
    if not isinstance(x, torch.Tensor):
        return x
    shape = x.shape
    for s in shape:
        if type(s) is not int:
            break
    else:  # the common case: plain ints already
        return shape
    sizes = [hint(s) for s in shape]
    if any(s is None for s in sizes):
        raise ValueError("size without a hint")
    return torch.Size(sizes)


def numel(t: Any) -> int | None:
    """The number of elements of tensor ``t`` (symbolic sizes by their hint); None for anything
    else, or a size without a hint. Never adds a guard on a symbolic shape.

    >>> numel(torch.empty(3, 4, device="meta")), numel(3)
    (12, None)
    """
    if not isinstance(t, torch.Tensor):
        return None
    out = 1
    for s in t.shape:
        if type(s) is not int:  # symbolic: by hint
            s = hint(s)
            if s is None:
                return None
        out *= s
    return out


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of memory ``t`` covers: numel, or less for broadcast (stride-0) tensors."""
    try:
        itemsize = t.dtype.itemsize
        sizes, strides = t.shape, t.stride()
    except Exception:
        return 0
    for s in (*sizes, *strides):
        if type(s) is not int:
            break
    else:  # the common case: plain ints (what the general path below computes, without its checks)
        count = 1
        for s in sizes:
            count *= s
        if count == 0:
            return 0
        span = 1
        for size, stride in zip(sizes, strides):
            span += (size - 1) * abs(stride)
        return (count if count < span else span) * itemsize
    if not all(type(s) is int for s in (*sizes, *strides)):  # symbolic: by hint
        sizes, strides = [hint(s) for s in sizes], [hint(s) for s in strides]
    if any(s is None for s in sizes):
        return 0
    count = 1
    for s in sizes:
        count *= s
    if count == 0:
        return 0
    if all(s is not None for s in strides):
        span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(sizes, strides))
        count = min(count, span)
    return int(count) * itemsize


def tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in ``tree`` (a value, or a list or tuple of them)."""
    if isinstance(tree, torch.Tensor):  # the common case, without pytree's walk
        return [tree]
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def covered_bytes(node: torch.fx.Node) -> int:
    """Bytes of memory the tensors ``node`` produces cover (:func:`tensor_bytes` of each; 0 when
    its metadata says nothing): what a kernel reading or writing the value moves.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> x.meta["val"] = torch.empty(4, 8, dtype=torch.bfloat16, device="meta").expand(3, 4, 8)
    >>> covered_bytes(x), covered_bytes(g.placeholder("y"))
    (64, 0)
    """
    return sum(tensor_bytes(t) for t in tensors(node_value(node)))

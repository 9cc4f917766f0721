"""Ops that write an argument in place although nothing in their signature says so: the batch
norms that update their running statistics while training. aten's schemas for them carry no
``(a!)`` annotation (``native_batch_norm(..., Tensor? running_mean, ...)``), and
``symbolic_trace`` records ``F.batch_norm`` with no schema at all, so the alias annotations that
:func:`streampass.values.mutated_arg_positions` reads for every other op miss these writes: a
side stream's training batch norm and the ambient stream's read of ``running_mean`` would get no
wait. torch's functionalization knows them by hand too (``_native_batch_norm_legit_functional``).

Each entry names the op, the arguments it writes, and the flag that turns the write on (none:
always). A flag that is not a constant (a graph value) counts as on: a write taken for a read
costs a wait, a missed write a race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx


@dataclass(frozen=True)
class HiddenWrite:
    """The arguments an op writes while ``flag`` (an argument's position and name, and its
    default when left out) is true; ``flag`` None: always."""

    written: tuple[tuple[int, str], ...]
    flag: tuple[int, str, bool] | None


_STATS = ((3, "running_mean"), (4, "running_var"))
_TRAINING = HiddenWrite(_STATS, (5, "training", False))

# By aten's schema name (every overload: the ``.out`` ones annotate their outputs, not these).
_ATEN: dict[str, HiddenWrite] = {
    "aten::native_batch_norm": _TRAINING,
    "aten::batch_norm": _TRAINING,
    "aten::_batch_norm_impl_index": _TRAINING,
    "aten::cudnn_batch_norm": _TRAINING,
    "aten::miopen_batch_norm": _TRAINING,
    "aten::instance_norm": HiddenWrite(_STATS, (5, "use_input_stats", False)),
    "aten::batch_norm_update_stats": HiddenWrite(((1, "running_mean"), (2, "running_var")), None),
    "aten::batch_norm_gather_stats": HiddenWrite(_STATS, None),
    "aten::batch_norm_gather_stats_with_counts": HiddenWrite(_STATS, None),
}

# Calls with no schema, as ``symbolic_trace`` records them: ``torch.nn.functional``'s order of
# arguments differs from aten's (running statistics come second and third).
_FUNCTIONAL = ((1, "running_mean"), (2, "running_var"))
_PYTHON: dict[Any, HiddenWrite] = {
    torch.nn.functional.batch_norm: HiddenWrite(_FUNCTIONAL, (5, "training", False)),
    torch.nn.functional.instance_norm: HiddenWrite(_FUNCTIONAL, (5, "use_input_stats", True)),
    torch.batch_norm: _TRAINING,
    torch.native_batch_norm: _TRAINING,
    torch.instance_norm: HiddenWrite(_STATS, (5, "use_input_stats", False)),
    torch.batch_norm_update_stats: HiddenWrite(((1, "running_mean"), (2, "running_var")), None),
}


def hidden_write(target: Any) -> HiddenWrite | None:
    """The unannotated write ``target`` makes, or None.

    >>> hidden_write(torch.ops.aten.native_batch_norm.default).written
    ((3, 'running_mean'), (4, 'running_var'))
    >>> hidden_write(torch.ops.aten._native_batch_norm_legit.default) is None  # its schema says (a!)
    True
    """
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return _ATEN.get(schema.name)
    try:
        return _PYTHON.get(target)
    except TypeError:  # an unhashable target
        return None


def hidden_writes(node: torch.fx.Node) -> tuple[int, ...]:
    """Positions of the arguments ``node`` writes with no annotation to say so (empty for any
    other node, or while its flag is a constant false).

    >>> g = torch.fx.Graph(); x, rm, rv = g.placeholder("x"), g.placeholder("rm"), g.placeholder("rv")
    >>> bn = torch.ops.aten.native_batch_norm.default
    >>> hidden_writes(g.call_function(bn, (x, None, None, rm, rv, True, 0.1, 1e-5)))
    (3, 4)
    >>> hidden_writes(g.call_function(bn, (x, None, None, rm, rv, False, 0.1, 1e-5)))  # evaluating
    ()
    >>> hidden_writes(g.call_function(torch.nn.functional.batch_norm, (x, rm, rv), {"training": True}))
    (1, 2)
    """
    if node.op != "call_function":
        return ()
    entry = hidden_write(node.target)
    if entry is None:
        return ()
    if entry.flag is not None:
        position, name, default = entry.flag
        on = node.args[position] if position < len(node.args) else node.kwargs.get(name, default)
        if on is False:
            return ()
    return tuple(i for i, _ in entry.written)


def hidden_argument_name(target: Any, i: int) -> str | None:
    """The keyword a call of ``target`` (one with no schema) gives its written argument ``i``
    by, or None.

    >>> hidden_argument_name(torch.nn.functional.batch_norm, 1)
    'running_mean'
    """
    entry = hidden_write(target)
    return dict(entry.written).get(i) if entry is not None else None

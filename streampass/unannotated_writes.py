"""Ops that write an argument in place although nothing in their signature says so: the batch
norms that update their running statistics while training. aten's schemas for them carry no
``(a!)`` annotation (``native_batch_norm(..., Tensor? running_mean, ...)``), and
``symbolic_trace`` records ``F.batch_norm`` with no schema at all, so the alias annotations that
:func:`streampass.values.mutated_arg_positions` reads for every other op miss these writes: a
side stream's training batch norm and the ambient stream's read of ``running_mean`` would get no
wait. torch's functionalization knows them by hand too (``_native_batch_norm_legit_functional``).
A higher-order op writes what its body's graph writes (:func:`body_writes`).

Each entry names the op, the arguments it writes, and the flag that turns the write on (none:
always). A flag that is not a constant (a graph value) counts as on: a write taken for a read
costs a wait, a missed write a race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from streampass import ops


@dataclass(frozen=True)
class HiddenWrite:
    """The arguments an op writes while ``flag`` (an argument's position and name, and its
    default when left out) is set (neither False nor None); ``flag`` None: always."""

    written: tuple[tuple[int, str], ...]
    flag: tuple[int, str, bool | None] | None


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
    # CPU LSTM's oneDNN backward overwrites the workspace its forward saved (found by a scan of
    # every OpInfo and module sample for inputs that change)
    "aten::mkldnn_rnn_layer_backward": HiddenWrite(((22, "workspace"),), None),
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
    # With a max_norm, the rows looked up are renormalized in the weight itself (make_fx records
    # the aten op that does it, embedding_renorm_, whose schema says so)
    torch.nn.functional.embedding: HiddenWrite(((1, "weight"),), (3, "max_norm", None)),
    torch.nn.functional.embedding_bag: HiddenWrite(((1, "weight"),), (3, "max_norm", None)),
}


def hidden_write(target: Any) -> HiddenWrite | None:
    """The unannotated write ``target`` makes, or None.

    >>> hidden_write(torch.ops.aten.native_batch_norm.default).written
    ((3, 'running_mean'), (4, 'running_var'))
    >>> hidden_write(torch.ops.aten._native_batch_norm_legit.default) is None  # its schema says (a!)
    True
    >>> hidden_write(torch.ops.aten.mkldnn_rnn_layer_backward.default).written
    ((22, 'workspace'),)
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
        if on is False or on is None:
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


def body_writes(node: torch.fx.Node) -> tuple[int, ...]:
    """Positions of the operands a higher-order op's body writes in place (``with torch.no_grad():
    buf.mul_(0.9)`` as ``torch.export`` records it: ``wrap_with_set_grad_enabled``), read from the
    body's own graph. A body's inputs are the op's graph values after it, tuples flattened, in
    order (``wrap_with_autocast``, ``invoke_subgraph``, ``cond``'s operands); where they do not
    line up with its placeholders, every operand counts as written. Empty for any other node.

    >>> import torch
    >>> g = torch.fx.Graph(); a = g.placeholder("a"); _ = g.output(g.call_method("mul_", (a, 2)))
    >>> root = torch.nn.Module(); root.body = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> outer = torch.fx.Graph(); x = outer.placeholder("x")
    >>> op = outer.call_function(torch.ops.higher_order.wrap_with_set_grad_enabled, (False, outer.get_attr("body"), x))
    >>> _ = outer.output(op); gm = torch.fx.GraphModule(root, outer)
    >>> body_writes(op)
    (2,)
    """
    if not isinstance(node.target, torch._ops.HigherOrderOperator) or node.target is ops.CONTROL_DEPS:
        return ()
    from streampass.values import graph_module_writes  # values reads this module: a body is read as a graph

    owner = node.graph.owning_module
    if owner is None:
        return ()
    written: set[int] = set()
    for k, body in enumerate(node.args):
        module = (
            ops.attribute(owner, body.target) if isinstance(body, torch.fx.Node) and body.op == "get_attr" else None
        )
        if not isinstance(module, torch.fx.GraphModule):
            continue
        writes = graph_module_writes(module)[1]
        operands = [
            (i, v)
            for i, arg in enumerate(node.args[k + 1 :], start=k + 1)
            for v in (arg if isinstance(arg, (list, tuple)) else [arg])
            if (isinstance(v, torch.fx.Node) and v.op != "get_attr") or _held_tensor(owner, v)
        ]
        inputs = module.graph.find_nodes(op="placeholder")
        if len(operands) == len(inputs):
            written.update(operands[j][0] for j in writes)
        elif writes:
            written.update(i for i, _ in operands)
    return tuple(sorted(written))


def _held_tensor(owner, value) -> bool:
    """Whether ``value`` is a ``get_attr`` of a tensor (an operand), not of a body."""
    return (
        isinstance(value, torch.fx.Node)
        and value.op == "get_attr"
        and isinstance(ops.attribute(owner, value.target), torch.Tensor)
    )

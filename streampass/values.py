"""What a node's value is: the tensors in its metadata, the device a graph runs on, and what an
op does to its arguments (which it writes, whether its result is a view or an alias of one),
read from the op's schema once per op."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from streampass.ops import passthrough_source


@dataclass(frozen=True)
class _SchemaFacts:
    """Alias facts of one op's schema (computed once per target: schemas do not change)."""

    writes: tuple[int, ...]  # argument positions the op writes
    alias_args: tuple[tuple[int, str], ...]  # (position, name) of arguments the output may alias
    returns_alias: bool  # whether the first return carries an alias annotation


_NO_FACTS = _SchemaFacts((), (), False)
# Keyed by id (see STREAM_OP_IDS); the entry holds the target so its id stays unique.
_facts_cache: dict[int, tuple[Any, _SchemaFacts]] = {}


def _schema_facts(target: Any) -> _SchemaFacts:
    hit = _facts_cache.get(id(target))
    if hit is not None and hit[0] is target:
        return hit[1]
    schema = getattr(target, "_schema", None)
    if schema is None:
        return _NO_FACTS  # not cached: plain Python targets can be short-lived
    writes = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    ret = schema.returns[0].alias_info if schema.returns else None
    alias_args: tuple[tuple[int, str], ...] = ()
    if ret is not None:
        # A view (`Tensor(a)`) or an in-place op's result (`Tensor(a!)`) is the argument it
        # aliases. A list of views (`Tensor(a)[]`: split, unbind) exposes no alias set on the
        # list itself in Python: it aliases the argument that has one.
        alias_args = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and (a.alias_info.before_set & ret.before_set or not ret.before_set)
        )
    facts = _SchemaFacts(writes, alias_args, ret is not None)
    _facts_cache[id(target)] = (target, facts)
    return facts


_INPLACE_OPERATORS = frozenset(
    {operator.iadd, operator.isub, operator.imul, operator.imatmul, operator.itruediv, operator.ifloordiv,
     operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift}
)  # fmt: skip


def _in_place_without_schema(node: torch.fx.Node) -> bool:
    """Whether a node with no schema to say so writes its first argument, as ``symbolic_trace``
    records in-place code: ``y.add_(1)`` (a method), ``torch.relu_(y)``, ``y += 1``
    (``operator.iadd``), ``nn.ReLU(inplace=True)`` (a module). Name and ``inplace`` flag are all
    there is to go on; a read taken for a write costs a wait, a missed write a race."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    if node.op == "call_method":
        name = node.target
    elif node.op == "call_function" and getattr(node.target, "_schema", None) is None:
        if node.target in _INPLACE_OPERATORS:
            return True
        name = getattr(node.target, "__name__", "")
    elif node.op == "call_module":
        owner = node.graph.owning_module
        try:
            module = owner.get_submodule(node.target) if owner is not None else None
        except AttributeError:
            return False
        return getattr(module, "inplace", False) is True
    else:
        return False
    return isinstance(name, str) and name.endswith("_") and not name.endswith("__")


def mutated_arg_positions(node: torch.fx.Node) -> tuple[int, ...]:
    """Positions of the arguments an op writes (from its schema's alias annotations; for a node
    with no schema, its in-place name or module flag).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mutated_arg_positions(g.call_function(torch.ops.aten.copy_.default, (x, x)))
    (0,)
    >>> mutated_arg_positions(g.call_method("add_", (x, 1))), mutated_arg_positions(g.call_method("add", (x, 1)))
    ((0,), ())
    >>> mutated_arg_positions(g.call_function(operator.iadd, (x, 1)))  # dynamo's ``y += 1``
    (0,)
    """
    if node.op == "call_function":
        writes = _schema_facts(node.target).writes
        if writes or getattr(node.target, "_schema", None) is not None:
            return writes
    return (0,) if _in_place_without_schema(node) else ()


def is_view(node: torch.fx.Node) -> bool:
    """Whether ``node`` only makes a view (its schema returns an alias and writes nothing).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [is_view(g.call_function(t, (x,))) for t in (torch.ops.aten.t.default, torch.ops.aten.sin.default)]
    [True, False]
    >>> is_view(g.call_function(torch.ops.aten.add_.Tensor, (x, x)))  # in place: writes
    False
    """
    if node.op != "call_function":
        return False
    facts = _schema_facts(node.target)
    return facts.returns_alias and not facts.writes


def aliases_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose storage ``node``'s output shares (a view), or None.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> aliases_input(g.call_function(torch.ops.aten.t.default, (x,))) is x
    True
    >>> aliases_input(g.call_function(torch.ops.aten.sin.default, (x,))) is None
    True
    """
    if node.op != "call_function":
        # an in-place op with no schema returns what it wrote (``y.add_(1)`` is ``y``)
        return node.args[0] if _in_place_without_schema(node) else None
    if node.target is operator.getitem:
        src = passthrough_source(node)
        if src is not None:
            return src
        # A chunk of split/unbind/chunk (`Tensor(a)[]`) is a view of what the list aliases.
        seq = node.args[0]
        if isinstance(seq, torch.fx.Node) and seq.op == "call_function" and _schema_facts(seq.target).returns_alias:
            return seq
        return None
    if getattr(node.target, "_schema", None) is None:
        return node.args[0] if _in_place_without_schema(node) else None
    for i, name in _schema_facts(node.target).alias_args:
        arg = node.args[i] if i < len(node.args) else node.kwargs.get(name)
        if isinstance(arg, torch.fx.Node):
            return arg
    return None


def tensor_values(node: torch.fx.Node) -> list[torch.Tensor]:
    """The tensors in ``node.meta["val"]`` (one, or the tensors of a tuple of outputs).

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: torch.ops.aten.max.dim(x, 0))(torch.ones(2, 3))
    >>> [len(tensor_values(n)) for n in gm.graph.nodes]  # input, the op's two outputs, their getitems, output
    [1, 2, 1, 1, 0]
    """
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def graph_devices(g: torch.fx.GraphModule | torch.fx.Graph) -> list[torch.device]:
    """The devices of the tensor values in ``g``'s metadata, in order of first appearance.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> graph_devices(make_fx(lambda x: x.to("meta") + 1)(torch.ones(2)))
    [device(type='cpu'), device(type='meta')]
    """
    graph = g.graph if isinstance(g, torch.fx.GraphModule) else g
    return list(dict.fromkeys(t.device for n in graph.nodes for t in tensor_values(n)))


def graph_device(g: torch.fx.GraphModule | torch.fx.Graph) -> torch.device:
    """The device a graph runs on: its first accelerator, else its first device, else CPU.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> graph_device(make_fx(torch.sin)(torch.ones(2, device="meta"))), graph_device(torch.fx.Graph())
    (device(type='meta'), device(type='cpu'))
    """
    devices = graph_devices(g)
    accelerators = [d for d in devices if d.type not in ("cpu", "meta")]
    return (accelerators or devices or [torch.device("cpu")])[0]

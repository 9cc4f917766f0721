"""What a call with no schema does to its arguments: the Python code ``symbolic_trace`` and dynamo
record (``y.add_(1)``, ``y += 1``, ``torch.add(a, b, out=c)``, ``F.relu(x, inplace=True)``,
``torch._foreach_add_([x, y], 1)``, ``x.view(-1)``, ``self.relu(x)``). Name, keywords and flags are
all there is to go on: a read taken for a write costs a wait, a missed write a race. aten ops say
it in their schemas (:mod:`streampass.values`).
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.fx

from streampass.ops import attribute
from streampass.schema_facts import schema_facts

# Python's operators that write their first argument: ``y += 1`` and ``y[i] = v`` (dynamo and
# symbolic_trace record them so).
_INPLACE_OPERATORS = frozenset(
    {operator.iadd, operator.isub, operator.imul, operator.imatmul, operator.itruediv, operator.ifloordiv,
     operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
     operator.setitem}
)  # fmt: skip

# The same as methods, as ``symbolic_trace`` records ``self.buf[0] = v`` on a module tensor
_INPLACE_DUNDERS = frozenset(
    {"__setitem__", "__iadd__", "__isub__", "__imul__", "__imatmul__", "__itruediv__", "__ifloordiv__", "__imod__",
     "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}
)  # fmt: skip

# Calls whose result shares its first argument's storage: aten's view ops (metadata only; the
# ``unsafe_`` splits are views too, although their schemas say nothing), and the calls that return
# a view whenever they can and copy otherwise (they stay work: the copy reads the source where it
# runs). A view taken for a copy costs a wait; a copy taken for a view would miss a write through
# it. Conversions (``.to``, ``.float()``, ``.cpu()``) are of the second kind: they return their
# input itself when it already is what they convert to.
_VIEW_NAMES = frozenset(
    {"view", "view_as", "unflatten", "t", "transpose", "swapaxes", "swapdims", "permute", "movedim",
     "moveaxis", "expand", "expand_as", "broadcast_to", "squeeze", "unsqueeze", "narrow", "select", "diagonal",
     "as_strided", "detach", "unfold", "split", "split_with_sizes", "chunk", "tensor_split", "hsplit", "vsplit",
     "dsplit", "unbind", "view_as_real", "view_as_complex", "real", "imag", "alias", "adjoint", "positive",
     "conj", "atleast_1d", "atleast_2d", "atleast_3d", "unsafe_split", "unsafe_split_with_sizes",
     "unsafe_chunk", "_unsafe_view"}
)  # fmt: skip
_MAYBE_VIEW_NAMES = frozenset(
    {"reshape", "reshape_as", "flatten", "ravel", "contiguous", "resolve_conj", "resolve_neg", "to", "type",
     "type_as", "float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte", "bool", "cpu",
     "cuda"}
)  # fmt: skip
# Calls that return one view per tensor they are given (``torch.meshgrid(x, y)``: an expand of
# each), or a view of the one they are given (``torch.atleast_2d(x)``).
_EACH_VIEW_NAMES = frozenset({"meshgrid", "broadcast_tensors", "atleast_1d", "atleast_2d", "atleast_3d"})
# Tensor attributes that are views, as ``symbolic_trace`` records ``w.data`` (``getattr(w, "data")``)
_VIEW_ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH", "real", "imag"})
# Modules whose result is their input (``nn.Identity``; dropout while evaluating) or a view of it
# whenever it can be (``nn.Flatten``: like ``flatten``, they stay work).
_RETURNS_INPUT = (torch.nn.Identity, torch.nn.Flatten, torch.nn.Unflatten)
_DROPOUTS = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout)


def first_argument(node: torch.fx.Node) -> Any:
    """A call's first argument, positional or by keyword: ``input=`` (``torch.relu_(input=y)``,
    ``self.relu(input=y)``), or a Python function's first parameter (``nn.init.uniform_`` is
    recorded as ``uniform_(tensor=y)``): what a call with no schema writes or returns a view of.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> first_argument(g.call_function(torch.relu_, (), {"input": x})) is x
    True
    >>> first_argument(g.call_function(torch.nn.init.uniform_, (), {"tensor": x})) is x
    True
    """
    if node.args:
        return node.args[0]
    if "input" in node.kwargs or node.op != "call_function":
        return node.kwargs.get("input")
    signature = _signature(node.target)
    first = next(iter(signature.parameters), None) if signature is not None else None
    return node.kwargs.get(first) if first is not None else None


def called_module(node: torch.fx.Node) -> torch.nn.Module | None:
    """The module a ``call_module`` calls (None for any other node, or a target its graph's
    module lacks).

    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    >>> called_module(gm.graph.find_nodes(op="call_module")[0])
    ReLU()
    """
    owner = node.graph.owning_module
    module = attribute(owner, node.target) if owner is not None and node.op == "call_module" else None
    return module if isinstance(module, torch.nn.Module) else None


def _name(node: torch.fx.Node) -> str | None:
    """The method's or torch function's name of a call with no schema."""
    if node.op == "call_method":
        return node.target if isinstance(node.target, str) else None
    if node.op == "call_function" and getattr(node.target, "_schema", None) is None:
        name = getattr(node.target, "__name__", None)
        return name if isinstance(name, str) else None
    return None


def in_place(node: torch.fx.Node) -> bool:
    """Whether a node with no schema writes its first argument (a tensor, or the list of them a
    ``_foreach_*_`` op takes): by an in-place name (``y.add_(1)``, ``torch.relu_(y)``), a Python
    operator (``y += 1``, or ``buf.__setitem__`` as a method), an ``inplace`` flag (``F.relu(y, inplace=True)``) or a module's
    (``nn.ReLU(inplace=True)``).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> F = torch.nn.functional
    >>> [in_place(n) for n in (g.call_method("add_", (x, 1)), g.call_function(F.relu, (x,), {"inplace": True}))]
    [True, True]
    >>> in_place(g.call_function(torch._foreach_add_, ([x, x], 1.0))), in_place(g.call_function(F.relu, (x,)))
    (True, False)
    """
    first = first_argument(node)
    if not (isinstance(first, torch.fx.Node) or _nodes(first)):
        return False
    if node.op == "call_module":
        return getattr(called_module(node), "inplace", False) is True
    if node.op == "call_function" and node.target in _INPLACE_OPERATORS:
        return True
    name = _name(node)
    if name is None:
        return False
    named = name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))
    return named or _flag(node, "inplace") is True


def out_argument(node: torch.fx.Node) -> Any:
    """What a call with no schema writes its result into (``torch.add(a, b, out=c)``: ``c``; a
    tuple for several results), or None.

    >>> g = torch.fx.Graph(); a, c = g.placeholder("a"), g.placeholder("c")
    >>> out_argument(g.call_function(torch.add, (a, a), {"out": c})) is c, out_argument(g.call_method("sin", (a,)))
    (True, None)
    """
    return node.kwargs.get("out") if _name(node) is not None else None


def result_source(node: torch.fx.Node) -> Any:
    """The argument whose storage a call with no schema returns: its ``out=``, the tensor a
    ``set_`` rebinds its first argument to, the first argument of an in-place call, a view (or a
    call that may return one) or a module that returns its input; None for a new tensor.

    >>> g = torch.fx.Graph(); x, y = g.placeholder("x"), g.placeholder("y")
    >>> [result_source(n).name for n in (g.call_function(torch.add, (x, x), {"out": y}), g.call_method("t", (x,)))]
    ['y', 'x']
    """
    out = out_argument(node)
    if out is not None:
        return out
    source = rebound_to(node)
    if source is not None:
        return source
    if in_place(node) or view_of_first(node) or returns_input(node):
        return first_argument(node)
    return None


def rebound_to(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor whose storage ``z.set_(x)`` makes its first argument's from then on (``x``),
    as a method, a function or aten's op; None for any other call.

    >>> g = torch.fx.Graph(); z, x = g.placeholder("z"), g.placeholder("x")
    >>> method, op = g.call_method("set_", (z, x)), g.call_function(torch.ops.aten.set_.source_Tensor, (z, x))
    >>> rebound_to(method).name, rebound_to(op).name
    ('x', 'x')
    """
    schema = getattr(node.target, "_schema", None)
    name = schema.name if schema is not None and node.op == "call_function" else _name(node)
    if name not in ("set_", "aten::set_"):
        return None
    source = node.args[1] if len(node.args) > 1 else node.kwargs.get("source")
    return source if isinstance(source, torch.fx.Node) else None


def view_of_first(node: torch.fx.Node, maybe: bool = True) -> bool:
    """Whether a call with no schema returns a view of its first argument (``maybe``: or may).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> reshape = g.call_method("reshape", (x, -1))
    >>> view_of_first(g.call_method("t", (x,))), view_of_first(reshape), view_of_first(reshape, maybe=False)
    (True, True, False)
    """
    if node.op == "call_function" and node.target is getattr and len(node.args) == 2:
        return node.args[1] in _VIEW_ATTRIBUTES and isinstance(node.args[0], torch.fx.Node)  # ``w.data``
    name = _torch_name(node)
    if name is None or not isinstance(first_argument(node), torch.fx.Node):
        return False
    if name in _EACH_VIEW_NAMES:  # of its one tensor: ``torch.atleast_2d(x)``
        return name.startswith("atleast") and len(node.args) + len(node.kwargs) == 1
    if name in _MAYBE_VIEW_NAMES:
        return maybe
    return name in _VIEW_NAMES or (isinstance(node.target, torch._ops.OpOverloadPacket) and _packet_views(node.target))


def views_of_each(node: torch.fx.Node) -> list[Any] | None:
    """The tensors a call returns one view of each of, in order (``torch.meshgrid(x, y)``,
    ``torch.broadcast_tensors([x, y])``: ``[x, y]``); None for any other call.

    >>> g = torch.fx.Graph(); x, y = g.placeholder("x"), g.placeholder("y")
    >>> [n.name for n in views_of_each(g.call_function(torch.meshgrid, (x, y), {"indexing": "ij"}))]
    ['x', 'y']
    >>> views_of_each(g.call_function(torch.stack, ([x, y],))) is None
    True
    """
    if _torch_name(node) not in _EACH_VIEW_NAMES:
        return None
    given = list(node.args) or list(node.kwargs.get("tensors", ()))
    if len(given) == 1 and isinstance(given[0], (list, tuple)):
        given = list(given[0])
    return given


def _torch_name(node: torch.fx.Node) -> str | None:
    """The name of a call of a tensor method, of one of torch's Python functions or of an aten op
    packet (``torch.ops.aten.t``: no overload picked, so no schema); None for any other."""
    if node.op == "call_method":
        return node.target if isinstance(node.target, str) else None
    if node.op != "call_function":
        return None
    if isinstance(node.target, torch._ops.OpOverloadPacket) or getattr(node.target, "__module__", None) in (
        "torch",
        "torch.functional",
    ):
        return node.target.__name__
    return None


def _packet_views(packet: torch._ops.OpOverloadPacket) -> bool:
    """Whether any overload of an aten op packet returns a view of an argument (a schema alias
    on its result) and writes nothing: which one a call picks is not known before it runs."""
    facts = (schema_facts(getattr(packet, o)) for o in packet.overloads())
    return any(f.returns_alias and not f.writes for f in facts)


def returns_input(node: torch.fx.Node) -> bool:
    """Whether a ``call_module``'s result is its input, or a view of it whenever it can be.

    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Dropout()).eval())
    >>> returns_input(gm.graph.find_nodes(op="call_module")[0])  # dropout, evaluating
    True
    """
    module = called_module(node)
    return isinstance(module, _RETURNS_INPUT) or (isinstance(module, _DROPOUTS) and not module.training)


def _nodes(value: Any) -> bool:
    """Whether ``value`` is a non-empty list or tuple of nodes (a ``_foreach_*_`` op's tensors)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, torch.fx.Node) for v in value)


_signatures: dict[int, tuple[Any, inspect.Signature | None]] = {}


def _flag(node: torch.fx.Node, name: str) -> Any:
    """The argument ``name`` of a Python function's call, given by keyword or by position."""
    if name in node.kwargs:
        return node.kwargs[name]
    if node.op != "call_function":
        return None
    signature = _signature(node.target)
    if signature is None or name not in signature.parameters:
        return None
    try:
        return signature.bind_partial(*node.args).arguments.get(name)
    except TypeError:
        return None


def _signature(target: Any) -> inspect.Signature | None:
    """A Python function's signature (None for a builtin without one), read once per target."""
    hit = _signatures.get(id(target))
    if hit is None or hit[0] is not target:
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin without one
            signature = None
        hit = _signatures[id(target)] = (target, signature)
    return hit[1]

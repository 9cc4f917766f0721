"""What a node's value is: the tensors in its metadata, the device a graph runs on, and what an
op does to its arguments (which it writes, whether its result is a view or an alias of one),
read from the op's schema once per op."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from streampass.ops import CONTROL_DEPS, passthrough_source
from streampass.python_calls import (
    called_module,
    first_argument,
    in_place,
    out_argument,
    rebound_to,
    result_source,
    view_of_first,
    views_of_each,
)
from streampass.schema_facts import EACH_VIEWS, MAYBE_VIEWS, NO_FACTS, UNANNOTATED_VIEWS, schema_facts
from streampass.unannotated_writes import body_writes, hidden_argument_name, hidden_writes


def argument(node: torch.fx.Node, i: int) -> Any:
    """A call's argument at position ``i``, given positionally or by keyword: by its schema's
    name, or, with no schema, ``input=`` for the first (:func:`first_argument`).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> argument(g.call_function(torch.ops.aten.add_.Tensor, (x,), {"other": 1}), 1)
    1
    >>> argument(g.call_method("add_", (), {"input": x}), 0) is x
    True
    """
    if i < len(node.args):
        return node.args[i]
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return node.kwargs.get(schema.arguments[i].name)
    module = called_module(node)
    if isinstance(module, torch.fx.GraphModule):  # by its placeholder's name
        inputs = module.graph.find_nodes(op="placeholder")
        return node.kwargs.get(inputs[i].target) if i < len(inputs) else None
    return first_argument(node) if i == 0 else node.kwargs.get(hidden_argument_name(node.target, i))


def mutated_arg_positions(node: torch.fx.Node) -> tuple[int, ...]:
    """Positions of the arguments an op writes (from its schema's alias annotations, or
    :mod:`streampass.unannotated_writes`; with no schema, its in-place name or module flag).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mutated_arg_positions(g.call_function(torch.ops.aten.copy_.default, (x, x)))
    (0,)
    >>> mutated_arg_positions(g.call_method("add_", (x, 1))), mutated_arg_positions(g.call_method("add", (x, 1)))
    ((0,), ())
    >>> mutated_arg_positions(g.call_function(operator.iadd, (x, 1)))  # dynamo's ``y += 1``
    (0,)
    """
    if node.op == "call_function":
        writes = schema_facts(node.target).writes or hidden_writes(node)  # batch norms' statistics
        if writes or getattr(node.target, "_schema", None) is not None:
            return writes
    module = called_module(node)
    if isinstance(module, torch.fx.GraphModule):  # the inputs its own graph writes
        return graph_module_writes(module)[1]
    return body_writes(node) or ((0,) if in_place(node) else ())


def written_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The graph values ``node`` writes in place (a list argument, a ``_foreach_*_`` op's, taken
    apart): those at :func:`mutated_arg_positions`, and a schema-less call's ``out=``
    (:mod:`streampass.python_calls`; a tuple for several results).

    >>> g = torch.fx.Graph(); x, y = g.placeholder("x"), g.placeholder("y")
    >>> [n.name for n in written_arguments(g.call_function(torch.ops.aten.add.out, (x, x), {"out": y}))]
    ['y']
    >>> [n.name for n in written_arguments(g.call_function(torch.add, (x, x), {"out": y}))]
    ['y']
    """
    args = [argument(node, i) for i in mutated_arg_positions(node)] + [out_argument(node)]
    return [
        x for arg in args for x in (arg if isinstance(arg, (list, tuple)) else [arg]) if isinstance(x, torch.fx.Node)
    ]


def is_view(node: torch.fx.Node) -> bool:
    """Whether ``node`` only makes a view (its schema returns an alias and writes nothing; with
    no schema, a call of one of aten's view ops by name, as ``symbolic_trace`` records them).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [is_view(g.call_function(t, (x,))) for t in (torch.ops.aten.t.default, torch.ops.aten.sin.default)]
    [True, False]
    >>> is_view(g.call_function(torch.ops.aten.add_.Tensor, (x, x)))  # in place: writes
    False
    >>> is_view(g.call_method("transpose", (x, 0, 1))), is_view(g.call_method("reshape", (x, -1)))  # may copy
    (True, False)
    """
    if node.target is operator.getitem:
        return indexes_a_tensor(node) and not _advanced(node.args[1])
    if node.op == "call_method" or getattr(node.target, "_schema", None) is None:
        return view_of_first(node, maybe=False)
    if node.target in UNANNOTATED_VIEWS:
        return True
    if node.target._schema.name in MAYBE_VIEWS:
        return False
    facts = schema_facts(node.target)
    return facts.returns_alias and not facts.writes


def aliases_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose storage ``node``'s output shares (a view), or None.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> aliases_input(g.call_function(torch.ops.aten.t.default, (x,))) is x
    True
    >>> aliases_input(g.call_function(torch.ops.aten.sin.default, (x,))) is None
    True
    """
    if node.op != "call_function" or getattr(node.target, "_schema", None) is None:
        if node.target is operator.getitem:
            return _getitem_source(node)
        src = result_source(node)  # an in-place call returns what it wrote (``y.add_(1)`` is ``y``)
        if src is None:
            return _graph_module_returned_input(node, None)
        return src if isinstance(src, torch.fx.Node) else None  # a tuple ``out=``: its getitems say
    if node.target in UNANNOTATED_VIEWS:
        return node.args[0] if isinstance(node.args[0], torch.fx.Node) else None
    source = rebound_to(node)  # ``z.set_(x)``: z is x's storage from here on
    if source is not None:
        return source
    for i, name in schema_facts(node.target).alias_args:
        arg = node.args[i] if i < len(node.args) else node.kwargs.get(name)
        if isinstance(arg, torch.fx.Node):
            return arg
    if node.target._schema.name in MAYBE_VIEWS:  # ``type_as``, whose schema says nothing
        return argument(node, 0) if isinstance(argument(node, 0), torch.fx.Node) else None
    return None


def storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` shares: followed through views and pass-throughs back to
    a value no input aliases (``node`` itself when it is a fresh value).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> t = g.call_function(torch.ops.aten.t.default, (x,))
    >>> storage_root(g.call_function(torch.ops.aten.view.default, (t, [-1]))) is x
    True
    """
    while (src := aliases_input(node)) is not None:
        node = src
    return node


def _getitem_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """What a getitem's result is a view of: the value a ``control_deps`` passes through, the
    list of views a chunk comes from, or the tensor a basic index (ints, slices, None, ...)
    views; None for one result of a multi-output op and for advanced indexing (a copy)."""
    src = passthrough_source(node)
    if src is not None:
        return src
    seq = node.args[0]
    if not isinstance(seq, torch.fx.Node):
        return None
    if indexes_a_tensor(node):
        return None if _advanced(node.args[1]) else seq
    made, k = _through_passthroughs(seq), node.args[1]
    facts = schema_facts(made.target) if made.op == "call_function" else NO_FACTS
    if len(facts.return_args) > 1:  # one result of several (``max.dim_max``'s values, indices)
        position = _at(facts.return_args, k)
        arg = argument(made, position) if position is not None else None
        return arg if isinstance(arg, torch.fx.Node) else None
    out = out_argument(made)
    if isinstance(out, (tuple, list)):  # ``torch.max(x, 1, out=(v, i))``
        return _at(out, k)
    each = _views_of_each(made)
    if each is not None:  # ``torch.meshgrid(x, y)[1]``: a view of ``y``
        arg = _at(each, k)
        return arg if isinstance(arg, torch.fx.Node) else None
    # A chunk of split/unbind/chunk (`Tensor(a)[]`) is a view of what the list aliases.
    if facts.returns_alias or made.target in UNANNOTATED_VIEWS or view_of_first(made):
        return seq
    if isinstance(called_module(made), torch.fx.GraphModule):
        return _graph_module_returned_input(made, k) if isinstance(k, int) else None
    if _undescribed(made):
        return seq  # ``F.layer_norm(w, (4,))[0]``: a row of a tensor, or a result nothing says is new
    return None


def _views_of_each(node: torch.fx.Node) -> list[Any] | None:
    """The tensors a call returns one view of each of (:func:`~streampass.python_calls.views_of_each`,
    or an aten op of :data:`EACH_VIEWS`); None for any other call."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None:
        return views_of_each(node)
    if schema.name not in EACH_VIEWS or not schema.returns or str(schema.returns[0].type) != "List[Tensor]":
        return None
    given = argument(node, 0)
    return list(given) if isinstance(given, (list, tuple)) else None


def _at(items, k: Any) -> Any:
    """``items[k]`` for an int ``k`` in range, else None."""
    return items[k] if isinstance(k, int) and -len(items) <= k < len(items) else None


def _undescribed(node: torch.fx.Node) -> bool:
    """Whether nothing says what ``node`` returns: a Python call with no schema, as
    ``symbolic_trace`` records ``F.layer_norm(x, s)`` or ``self.lstm(x)`` (not torch's operators,
    whose schemas or bodies do)."""
    if node.op in ("call_method", "call_module"):
        return True
    return node.op == "call_function" and not isinstance(node.target, torch._ops.OperatorBase)


def _graph_module_returned_input(node: torch.fx.Node, index: int | None) -> torch.fx.Node | None:
    """The argument of a call of a ``GraphModule`` whose storage its result (``index``: that
    element of the tuple it returns) shares, its own graph says (an input returned as it is, in
    place or as a view); None for anything else."""
    module = called_module(node)
    if not isinstance(module, torch.fx.GraphModule):
        return None
    out = module.graph.output_node().args[0]
    if index is not None:
        out = out[index] if isinstance(out, (tuple, list)) and -len(out) <= index < len(out) else None
    if not isinstance(out, torch.fx.Node):
        return None
    root = _graph_roots(module)[out]
    if root.op != "placeholder":
        return None
    arg = argument(node, module.graph.find_nodes(op="placeholder").index(root))
    return arg if isinstance(arg, torch.fx.Node) else None


def _through_passthroughs(node: torch.fx.Node) -> torch.fx.Node:
    """What ``node`` is, seen through the syncs that pass it through (the same tensor, ordered
    after a sync): the edit re-points readers at passthroughs, which must not change what a
    getitem of it is."""
    while (src := passthrough_source(node)) is not None:
        node = src
    return node


def _advanced(index: Any) -> bool:
    """Whether a tensor index gathers (a tensor, a list of indices): the result is a copy."""
    if isinstance(index, tuple):
        return any(_advanced(i) for i in index)
    return isinstance(index, (torch.fx.Node, list, torch.Tensor))


def indexes_a_tensor(node: torch.fx.Node) -> bool:
    """Whether a getitem node indexes a tensor (``x[0]``, ``x[:, 1:]``, ``x[idx]``) rather than
    picking one result of a multi-output op: from the source's metadata when it has any, else
    from the index (only a tensor takes a slice or a tuple) and the source's kind.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: (x[0], x[:, 1], x.split(2)[1]))
    >>> [indexes_a_tensor(n) for n in gm.graph.nodes if n.target is operator.getitem]
    [True, True, False]
    """
    if node.target is not operator.getitem or len(node.args) != 2:
        return False
    seq, index = node.args
    if not isinstance(seq, torch.fx.Node) or seq.target is CONTROL_DEPS:
        return False
    seq = _through_passthroughs(seq)
    val = seq.meta.get("val", seq.meta.get("example_value"))
    if isinstance(val, torch.Tensor):
        return True
    if val is not None:
        return False
    if index is None or isinstance(index, (slice, tuple, type(Ellipsis), torch.fx.Node, list)):
        return True
    if seq.op in ("placeholder", "get_attr"):
        return True
    if seq.op == "call_function" and getattr(seq.target, "_schema", None) is not None:
        returns = seq.target._schema.returns
        return len(returns) == 1 and str(returns[0].type) == "Tensor"
    return False


def attribute_storage(target: str, held: object) -> tuple:
    """What makes two ``get_attr`` nodes read one storage: the storage of the tensor ``held`` at
    ``target`` (``make_fx`` names a module's tensor anew at each use; tied weights have two
    names), by identity, so a storage resized to nothing (FSDP) or a fake or meta one counts
    too; else the name itself (a sparse tensor, a submodule, no module to look in).

    >>> import torch
    >>> w = torch.ones(4)
    >>> attribute_storage("a", w) == attribute_storage("b", w[2:]), attribute_storage("c", None)
    (True, ('name', 'c'))
    """
    if isinstance(held, torch.Tensor):
        try:
            return ("storage", held.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):  # sparse, nested: no one storage to name
            return ("name", target)
    return ("name", target)


def graph_module_writes(module: torch.fx.GraphModule) -> tuple[set[torch.fx.Node], tuple[int, ...]]:
    """The nodes of ``module``'s graph whose storage a node of it writes in place, and the
    positions of the inputs among them."""
    root = _graph_roots(module)
    written: set[torch.fx.Node] = set()
    for n in module.graph.nodes:
        written.update(root[x] for x in written_arguments(n))
    inputs = module.graph.find_nodes(op="placeholder")
    return written, tuple(i for i, p in enumerate(inputs) if p in written)


def _graph_roots(module: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each node of ``module``'s graph -> the node whose storage it shares (itself, or the
    input or get_attr it is a view or alias of)."""
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in module.graph.nodes:
        src = aliases_input(n) if n.op != "get_attr" else None
        root[n] = root.get(src, src) if src is not None else n
    return root


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
    return preferred_device(graph_devices(g))


def preferred_device(devices: list[torch.device], default: torch.device | None = None) -> torch.device:
    """The first accelerator among ``devices``, else the first device, else ``default`` (CPU).

    >>> preferred_device([torch.device("cpu"), torch.device("cuda", 1)]), preferred_device([])
    (device(type='cuda', index=1), device(type='cpu'))
    """
    accelerators = [d for d in devices if d.type not in ("cpu", "meta")]
    return (accelerators or devices or [default or torch.device("cpu")])[0]

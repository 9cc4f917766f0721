"""torch's stream ops, and how to recognise them in a graph (plain or inside ``control_deps``).

streampass reads and writes the ops ``torch._dynamo.variables.streams`` registers under
``torch.ops.streams``. Their int arguments are indices into dynamo's object table
(``torch._dynamo.graph_bytecode_inputs``); see :mod:`streampass.runtime` for how a rewritten
graph gets that table filled when it is called eagerly.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams.*)
import torch.fx
from torch._inductor.fx_passes.control_dependencies import control_deps

streams = torch.ops.streams

FORK = streams.fork.default
JOIN = streams.join.default
RECORD_EVENT = streams.record_event.default
WAIT_EVENT = streams.wait_event.default
WAIT_STREAM = streams.wait_stream.default
SYNC_EVENT = streams.synchronize_event.default
SYNC_STREAM = streams.synchronize_stream.default
SYNC_DEVICE = streams.synchronize_device.default
RECORD_STREAM = streams.record_stream.default
SYNC_DEALLOC = streams.sync_dealloc.default

CONTROL_DEPS = control_deps

SYNC_TARGETS = frozenset(
    {RECORD_EVENT, WAIT_EVENT, WAIT_STREAM, SYNC_EVENT, SYNC_STREAM, SYNC_DEVICE, RECORD_STREAM, SYNC_DEALLOC}
)
STREAM_OPS = SYNC_TARGETS | {FORK, JOIN}


@dataclass(frozen=True)
class SyncCall:
    """A stream op as the graph calls it, after looking through ``control_deps``.

    ``args`` are the op's own arguments with subgraph placeholders mapped back to the outer
    graph's nodes; ``wrapper`` is the ``control_deps`` node or None for a plain call.
    """

    target: Any
    args: tuple
    node: torch.fx.Node
    wrapper: torch.fx.Node | None

    @property
    def name(self) -> str:
        return self.target._schema.name.split("::", 1)[1]


def _subgraph_module(node: torch.fx.Node) -> torch.fx.GraphModule | None:
    sub = node.args[1]
    if isinstance(sub, torch.fx.GraphModule):
        return sub
    if isinstance(sub, torch.fx.Node) and sub.op == "get_attr":
        owner = node.graph.owning_module
        if owner is not None:
            return operator.attrgetter(sub.target)(owner)
    return None


def as_sync_call(node: torch.fx.Node) -> SyncCall | None:
    """The stream op ``node`` performs, or None if it performs none.

    >>> g = torch.fx.Graph()
    >>> n = g.call_function(RECORD_EVENT, (7, 1))
    >>> as_sync_call(n).name, as_sync_call(n).args
    ('record_event', (7, 1))
    """
    if node.op != "call_function":
        return None
    if node.target in STREAM_OPS:
        return SyncCall(node.target, tuple(node.args), node, None)
    if node.target is CONTROL_DEPS:
        sub = _subgraph_module(node)
        if sub is None:
            return None
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        outer = dict(zip(placeholders, node.args[2:]))
        for inner in sub.graph.nodes:
            if inner.op == "call_function" and inner.target in STREAM_OPS:
                args = torch.fx.map_arg(inner.args, lambda a: outer.get(a, a))
                return SyncCall(inner.target, tuple(args), node, node)
    return None


def passthrough_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """For a getitem of a ``control_deps`` result that passes an outer value through: that value.

    Such a getitem is the same tensor as the value, only ordered after the wrapped op.
    """
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    src, idx = node.args
    if not (isinstance(src, torch.fx.Node) and src.target is CONTROL_DEPS and isinstance(idx, int)):
        return None
    sub = _subgraph_module(src)
    if sub is None:
        return None
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    out = next(n for n in reversed(sub.graph.nodes) if n.op == "output").args[0]
    if not isinstance(out, (tuple, list)) or idx >= len(out) or out[idx] not in placeholders:
        return None
    return src.args[2 + placeholders.index(out[idx])]


def passthrough_values(wrapper: torch.fx.Node) -> list[torch.fx.Node]:
    """The values a ``control_deps`` node passes through: ``getitem(wrapper, i)`` is item ``i - 1``.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> _ = sp.run(gm)
    >>> [(n.name, [v.name for v in passthrough_values(n)]) for n in gm.graph.nodes if passthrough_values(n)][:1]
    [('wait_event_default', ['x_1'])]
    """
    if wrapper.op != "call_function" or wrapper.target is not CONTROL_DEPS:
        return []
    sub = _subgraph_module(wrapper)
    if sub is None:
        return []
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    out = next(n for n in reversed(sub.graph.nodes) if n.op == "output").args[0]
    if not isinstance(out, (tuple, list)):
        return []
    return [wrapper.args[2 + placeholders.index(o)] for o in out[1:] if o in placeholders]


def mutated_arg_positions(node: torch.fx.Node) -> list[int]:
    """Positions of the arguments an op writes (from its schema's alias annotations).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> mutated_arg_positions(g.call_function(torch.ops.aten.copy_.default, (x, x)))
    [0]
    """
    schema = getattr(node.target, "_schema", None)
    if schema is None or node.op != "call_function":
        return []
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]



def aliases_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose storage ``node``'s output shares (a view), or None.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> aliases_input(g.call_function(torch.ops.aten.t.default, (x,))) is x
    True
    >>> aliases_input(g.call_function(torch.ops.aten.sin.default, (x,))) is None
    True
    """
    src = passthrough_source(node)
    if src is not None:
        return src
    if node.op == "call_function" and node.target is operator.getitem:
        # A chunk of split/unbind/chunk (`Tensor(a)[]`) is a view of what the list aliases.
        seq = node.args[0]
        returns = getattr(getattr(seq, "target", None), "_schema", None)
        if isinstance(seq, torch.fx.Node) and returns is not None and returns.returns:
            if returns.returns[0].alias_info is not None:
                return seq
        return None
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return None
    ret = schema.returns[0].alias_info
    if ret is None:
        return None
    # A view (`Tensor(a)`) or an in-place op's result (`Tensor(a!)`) is the argument it aliases.
    # A list of views (`Tensor(a)[]`: split, unbind) exposes no alias set on the list itself
    # in Python: it aliases the argument that has one.
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and (a.alias_info.before_set & ret.before_set or not ret.before_set):
            arg = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            if isinstance(arg, torch.fx.Node):
                return arg
    return None

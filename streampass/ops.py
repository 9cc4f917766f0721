"""torch's stream ops, and how to recognise them in a graph (plain or inside ``control_deps``).

streampass reads and writes the ops ``torch._dynamo.variables.streams`` registers under
``torch.ops.streams``. Their int arguments are indices into dynamo's object table
(``torch._dynamo.graph_bytecode_inputs``); see :mod:`streampass.runtime` for how a rewritten
graph gets that table filled when it is called eagerly.
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.variables.streams
import torch.fx
from torch._inductor.fx_passes.control_dependencies import control_deps

from streampass import compat  # noqa: F401  (gives torch 2.11 the control_deps kernels the encoding runs)
from streampass.errors import StreamPassError

streams = torch.ops.streams

#: the stream a graph is called on (CUDA's current stream); every other index is a side stream
AMBIENT = 0
#: the ``custom`` key ``sp.stream(k)`` writes next to ``"stream"`` under dynamo: which nodes an
#: ``sp.stream`` block placed, as against a ``torch.Stream`` block (same ``"stream"`` key)
SP_STREAM_KEY = "sp.stream"
MAX_INDEX = 2**63 - 1  # the stream ops take SymInt: an int64
#: The node kinds that call something: aten ops (make_fx, AOT) and, from ``symbolic_trace``,
#: torch functions, tensor methods (``x.sin()``) and submodules (``self.lin(x)``).
CALL_OPS = ("call_function", "call_method", "call_module")


def stream_index_problem(k: object) -> str | None:
    """Why ``k`` is no stream index, or None. Safe while dynamo traces (prints no tensor).

    >>> stream_index_problem(3) is None, stream_index_problem(-1)
    (True, 'stream index must be >= 0, got -1')
    """
    if isinstance(k, bool) or not isinstance(k, int):
        shown = f"a {type(k).__name__}" if isinstance(k, torch.Tensor) else f"{k!r} ({type(k).__name__})"
        return f"stream index must be an int, got {shown}"
    if k < 0:
        return f"stream index must be >= 0, got {k}"
    if k > MAX_INDEX:
        return f"stream index {k} does not fit in the int64 the stream ops take (max {MAX_INDEX})"
    return None


def check_stream_index(k: object, node: str | None = None) -> int:
    """``k`` as a stream index (a plain int: an ``IntEnum`` member would be written into the
    generated code by name), or a :class:`StreamPassError` saying why it is not one.

    >>> import enum
    >>> type(check_stream_index(enum.IntEnum("S", "SIDE").SIDE)) is int
    True
    """
    if (problem := stream_index_problem(k)) is not None:
        raise StreamPassError(problem, node)
    return int(k)


class _Absent:
    """Stands for a stream op this torch does not have (no graph can call it)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<torch.ops.streams.{self.name}: not in this torch>"


def _op(name: str):
    """``torch.ops.streams.<name>.default``, or an :class:`_Absent` stand-in: torch 2.11 has no
    ``synchronize_*`` ops (see streampass.compat)."""
    packet = getattr(streams, name, None)
    return packet.default if packet is not None else _Absent(name)


def exists(target) -> bool:
    """Whether ``target`` is an op of this torch (False for a stand-in from a newer release).

    >>> exists(RECORD_EVENT)
    True
    """
    return not isinstance(target, _Absent)


FORK = _op("fork")
JOIN = _op("join")
RECORD_EVENT = _op("record_event")
WAIT_EVENT = _op("wait_event")
WAIT_STREAM = _op("wait_stream")
SYNC_EVENT = _op("synchronize_event")
SYNC_STREAM = _op("synchronize_stream")
SYNC_DEVICE = _op("synchronize_device")
RECORD_STREAM = _op("record_stream")
SYNC_DEALLOC = _op("sync_dealloc")

CONTROL_DEPS = control_deps

SYNC_TARGETS = frozenset(
    t
    for t in (RECORD_EVENT, WAIT_EVENT, WAIT_STREAM, SYNC_EVENT, SYNC_STREAM, SYNC_DEVICE, RECORD_STREAM, SYNC_DEALLOC)
    if not isinstance(t, _Absent)
)
STREAM_OPS = SYNC_TARGETS | {FORK, JOIN}
#: stream ops that put nothing on their stream: fork/join switch the host's current stream,
#: synchronize_* block the host, record_stream tells the allocator (so a CUDA-graph capture
#: need not join them back)
HOST_SIDE_OPS = frozenset({FORK, JOIN, RECORD_STREAM, SYNC_EVENT, SYNC_STREAM, SYNC_DEVICE})
# dynamo's own graphs (before AOT autograd) call the packets, ``torch.ops.streams.record_event``.
_PACKET_DEFAULT = {id(t.overloadpacket): t for t in STREAM_OPS}
# OpOverload.__hash__ is Python code; graph-wide scans test membership by id instead. The ops
# live as long as the process, so no other object can share their ids.
STREAM_OP_IDS = frozenset(id(t) for t in STREAM_OPS) | frozenset(_PACKET_DEFAULT)


# Which arguments of each stream op are stream or event indices (into dynamo's object table).
INDEX_ARGS = {
    RECORD_EVENT: (0, 1),
    WAIT_EVENT: (0, 1),
    SYNC_DEALLOC: (0, 1),
    WAIT_STREAM: (0, 1),
    SYNC_EVENT: (0,),
    SYNC_STREAM: (0,),
    RECORD_STREAM: (1,),
    FORK: (0, 1),
    JOIN: (0, 1),
    SYNC_DEVICE: (),
}


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


MISSING = object()


def attribute(module: torch.nn.Module, target: str) -> object:
    """``module``'s attribute at the dotted path ``target`` (a ``get_attr``'s), or ``MISSING``.

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> attribute(m, "0.weight").shape, attribute(m, "0.nothing") is MISSING
    (torch.Size([2, 2]), True)
    """
    try:
        return operator.attrgetter(target)(module)
    except AttributeError:
        return MISSING


def subgraph_module(node: torch.fx.Node) -> torch.fx.GraphModule | None:
    """The subgraph a ``control_deps`` node runs (a module or the ``get_attr`` naming one), or None."""
    if len(node.args) < 2:
        return None
    sub = node.args[1]
    if isinstance(sub, torch.fx.GraphModule):
        return sub
    if isinstance(sub, torch.fx.Node) and sub.op == "get_attr":
        owner = node.graph.owning_module
        if owner is not None:  # a get_attr of nothing is malformed: reading says so
            found = attribute(owner, sub.target)
            return found if isinstance(found, torch.fx.GraphModule) else None
    return None


#: the name prefix of the subgraphs wrapping the syncs streampass adds (a program's own get
#: ``streampass_<op>_<n>``): what tells them apart in a graph rebuilt from code (unpickled), no meta
ADDED_SYNC_PREFIX = "streampass_added_"


def added_by_streampass(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a sync streampass added (not one the program had): marked so in its
    ``meta``, or wrapped in a subgraph named for such syncs.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> body = g.get_attr(ADDED_SYNC_PREFIX + "wait_event_0")
    >>> added_by_streampass(g.call_function(CONTROL_DEPS, ((x,), body, 7, 0)))
    True
    >>> added_by_streampass(g.call_function(WAIT_EVENT, (7, 0)))
    False
    """
    if node.meta.get("streampass") is not None:
        return True
    body = node.args[1] if node.target is CONTROL_DEPS and len(node.args) > 1 else None
    return isinstance(body, torch.fx.Node) and body.op == "get_attr" and str(body.target).startswith(ADDED_SYNC_PREFIX)


def is_sync_subgraph(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` is the body of a ``control_deps`` sync: one stream op, its inputs as
    placeholders, and an output that returns the op's result (alone or first, followed by
    passthrough placeholders). torch's ``wrap_all_sync_nodes_with_control_deps`` and
    streampass both make such bodies; inductor hands them to post-grad passes on their own,
    before the graph that calls them.

    >>> g = torch.fx.Graph(); dep = g.placeholder("dep_0")
    >>> rec = g.call_function(RECORD_EVENT, (1, 2)); _ = g.output((rec, dep))
    >>> is_sync_subgraph(g)
    True
    >>> g2 = torch.fx.Graph(); x = g2.placeholder("x")
    >>> _ = g2.output((g2.call_function(torch.ops.aten.sin.default, (x,)),))
    >>> is_sync_subgraph(g2)
    False
    """
    calls = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    if len(calls) != 1 or calls[0].op != "call_function" or id(calls[0].target) not in STREAM_OP_IDS:
        return False
    out = next(n for n in reversed(graph.nodes) if n.op == "output").args[0]
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    rest = out[1:] if isinstance(out, (tuple, list)) else ()
    return first is calls[0] and all(isinstance(r, torch.fx.Node) and r.op == "placeholder" for r in rest)


@dataclass(frozen=True)
class _SubgraphShape:
    """What a ``control_deps`` subgraph does, computed once per subgraph (they are shared)."""

    placeholders: tuple[torch.fx.Node, ...]
    stream_op: torch.fx.Node | None  # the first stream op called inside
    outputs: tuple | None  # the output node's tuple, or None if it returns a single value


_shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> (node count, shape)


def _subgraph_shape(node: torch.fx.Node) -> _SubgraphShape | None:
    sub = subgraph_module(node)
    if sub is None:
        return None
    graph = sub.graph
    # Cached per graph object, outside the module (which must stay picklable); the count
    # notices a graph grown or shrunk since. An edit in place that keeps the node count would
    # go unnoticed: nothing edits sync subgraphs so (streampass and torch's wrap pass make a
    # new subgraph for every change).
    cached = _shapes.get(graph)
    if cached is not None and cached[0] == len(graph.nodes):
        return cached[1]
    placeholders = tuple(n for n in graph.nodes if n.op == "placeholder")
    stream_op = next((n for n in graph.nodes if n.op == "call_function" and id(n.target) in STREAM_OP_IDS), None)
    output = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
    if output is None:
        return None  # malformed: not read as a sync (wellformed.control_deps_problem says why)
    out = output.args[0]
    shape = _SubgraphShape(placeholders, stream_op, tuple(out) if isinstance(out, (tuple, list)) else None)
    _shapes[graph] = (len(graph.nodes), shape)
    return shape


def positional(target: Any, args: tuple, kwargs: dict) -> tuple:
    """A stream op's arguments in schema order, keyword arguments included."""
    if not kwargs:
        return tuple(args)
    out = list(args)
    for a in target._schema.arguments[len(args) :]:
        if a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            break
    return tuple(out)


def as_sync_call(node: torch.fx.Node) -> SyncCall | None:
    """The stream op ``node`` performs, or None if it performs none.

    >>> g = torch.fx.Graph()
    >>> n = g.call_function(RECORD_EVENT, (7, 1))
    >>> as_sync_call(n).name, as_sync_call(n).args
    ('record_event', (7, 1))
    >>> as_sync_call(g.call_function(WAIT_EVENT, (), {"event_index": 7, "stream_index": 0})).args
    (7, 0)
    """
    if node.op != "call_function":
        return None
    if id(node.target) in STREAM_OP_IDS:
        target = _PACKET_DEFAULT.get(id(node.target), node.target)
        return SyncCall(target, positional(target, node.args, node.kwargs), node, None)
    if node.target is CONTROL_DEPS:
        shape = _subgraph_shape(node)
        if shape is None or shape.stream_op is None:
            return None
        outer = dict(zip(shape.placeholders, node.args[2:]))
        target = _PACKET_DEFAULT.get(id(shape.stream_op.target), shape.stream_op.target)
        args = positional(target, shape.stream_op.args, shape.stream_op.kwargs)
        args = torch.fx.map_arg(args, lambda a: outer.get(a, a))
        return SyncCall(target, tuple(args), node, node)
    return None


def _inputs_dict_is_kept() -> bool:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(operator.add, (x, x))
    return isinstance(getattr(n, "_input_nodes", None), dict) and list(n._input_nodes) == n.all_input_nodes


_INPUTS_ATTR = "_input_nodes" if _inputs_dict_is_kept() else "all_input_nodes"


def input_nodes(node: torch.fx.Node):
    """``node.all_input_nodes``, in the same order, without building a list: FX keeps a node's
    inputs in a dict. Hot loops over every node's inputs use this; an FX that stores inputs
    differently gets the public property.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [n.name for n in input_nodes(g.call_function(torch.ops.aten.add.Tensor, (x, x)))]
    ['x']
    """
    return getattr(node, _INPUTS_ATTR)


def passthrough_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """For a getitem of a ``control_deps`` result that passes an outer value through: that value.

    Such a getitem is the same tensor as the value, only ordered after the wrapped op.
    """
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    src, idx = node.args
    if not (isinstance(src, torch.fx.Node) and src.target is CONTROL_DEPS and isinstance(idx, int)):
        return None
    shape = _subgraph_shape(src)
    if shape is None or shape.outputs is None or idx >= len(shape.outputs):
        return None
    out = shape.outputs[idx]
    if out not in shape.placeholders:
        return None
    return src.args[2 + shape.placeholders.index(out)]


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
    shape = _subgraph_shape(wrapper)
    if shape is None or shape.outputs is None:
        return []
    return [wrapper.args[2 + shape.placeholders.index(o)] for o in shape.outputs[1:] if o in shape.placeholders]


def target_name(node: torch.fx.Node) -> str:
    """What a node calls, as a person reads it: ``aten::mm``, ``aten::add.Tensor``, a Python
    function's name, or the node's target (a placeholder's name, an attribute path).

    >>> import torch
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> [target_name(n) for n in (x, g.call_function(torch.ops.aten.add.Tensor, (x, x)), g.call_function(abs, (x,)))]
    ['x', 'aten::add.Tensor', 'abs']
    >>> short_name(target_name(g.call_function(torch.ops.aten.mm.default, (x, x))))
    'mm'
    """
    t = node.target
    if node.op == "call_function":
        schema = getattr(t, "_schema", None)
        if schema is not None:
            overload = getattr(t, "_overloadname", "")
            return schema.name + ("." + overload if overload and overload != "default" else "")
        return getattr(t, "__name__", str(t))
    return str(t)


def short_name(name: str) -> str:
    """``target_name`` without its namespace.

    >>> short_name("aten::add.Tensor"), short_name("x")
    ('add.Tensor', 'x')
    """
    return name.split("::", 1)[-1]

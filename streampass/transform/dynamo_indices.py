"""What dynamo's object indices mean in a graph being compiled: is index 0 the ambient stream?

streampass reads stream index 0 as the ambient stream (the one current when the graph is
called). dynamo makes that true on an accelerator: it registers the current stream at index 0
before tracing. On a machine without one it registers nothing there, so the first
``torch.Stream`` (or ``torch.Event``) the function uses gets index 0, and reading index 0 as
ambient would fold a user's side stream into the ambient one.

:func:`index_offset` looks at dynamo's object table while the pass runs (it holds the objects
of the frame being compiled) and says by how much every index must move up so that 0 is free
for the ambient stream; :func:`shift_indices` moves them. The shift is only ever applied to
graphs lowered for CPU, whose stream ops all become no-ops, so the indices never reach dynamo's
table at run time.

A backward graph is compiled lazily, when the table may hold another frame's objects: the
forward's answer is kept per tracing context (the backward compile runs in the forward's) and
reused. When neither is known the answer is "unknown" and the report says so.
"""

from __future__ import annotations

import weakref

import torch
import torch.fx

from streampass import ops
from streampass.compat import registered_object
from streampass.ops import SP_STREAM_KEY
from streampass.transform.subgraphs import own_sync_body
from streampass.values import graph_devices, preferred_device

#: tracing context of a forward compile -> the offset its graphs were read with
_FORWARD_OFFSETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tracing_context():
    return torch._guards.TracingContext.try_get()


def index_offset(is_backward: bool = False) -> tuple[int, str]:
    """``(offset, how)``: add ``offset`` to every stream/event index so that 0 is the ambient stream.

    ``how`` is ``"dynamo"`` (index 0 is dynamo's current stream, or unused), ``"dynamo+1"``
    (index 0 holds a user object: every index moves up by one) or ``"unknown"`` (a backward
    graph whose forward was not seen; indices are read as they are).

    Outside a dynamo compile the table is not this graph's: the offset is 0.

    >>> from torch._dynamo import graph_bytecode_inputs as table
    >>> _ = table.register_graph_created_object(torch.Stream("cpu"), lambda index, codegen: None)
    >>> index_offset()  # left by an earlier frame, or by this doctest
    (0, 'dynamo')
    >>> table.reset_user_object_tracking()
    """
    if torch.accelerator.is_available():
        return (0, "dynamo")  # dynamo registered the current stream at index 0
    ctx = _tracing_context()
    if is_backward:
        if ctx is not None and ctx in _FORWARD_OFFSETS:
            return _FORWARD_OFFSETS[ctx]
        return (0, "unknown")
    offset = forward_offset()
    answer = (1, "dynamo+1") if offset else (0, "dynamo")
    if ctx is not None:
        _FORWARD_OFFSETS[ctx] = answer
    return answer


def forward_offset() -> int:
    """:func:`index_offset`'s offset for the frame dynamo is compiling now, read from its object
    table and remembered nowhere (the compile hook keys torch's caches with it).

    >>> from torch._dynamo import graph_bytecode_inputs as table
    >>> table.reset_user_object_tracking()
    >>> forward_offset()
    0
    """
    if torch.accelerator.is_available():
        return 0
    from streampass.compile_hook import compiling_frame  # it imports this module

    if not compiling_frame():
        # torch._inductor.compile of a traced graph, AOT inductor: the graph's indices are its
        # own; the table still holds whatever the last dynamo frame left in it.
        return 0
    return 1 if registered_object(0) is not None else 0


def compiled_graph_device(gm: torch.fx.GraphModule) -> torch.device:
    """The device a graph inductor compiles runs on: its tensors' (:func:`streampass.values.
    graph_device`); a graph of syncs alone (a frame between graph breaks that only synchronizes)
    has none to tell, so it is the device of the streams and events its syncs name in dynamo's
    table, or, for a sync that names none (``synchronize_device``), the current accelerator.

    Read as the CPU's, such a graph would be lowered for CPU and its syncs would become no-ops:
    on CUDA the user's ``s.synchronize()`` or ``wait_stream`` would be lost.

    >>> g = torch.fx.Graph(); _ = g.call_function(ops.WAIT_EVENT, (7, 1)); _ = g.output(())
    >>> compiled_graph_device(torch.fx.GraphModule(torch.nn.Module(), g))  # no accelerator here
    device(type='cpu')
    """
    devices = graph_devices(gm)
    if devices or not torch.accelerator.is_available():
        return preferred_device(devices)
    named = []
    for node in gm.graph.nodes:
        call = ops.as_sync_call(node)
        for i in ops.INDEX_ARGS.get(call.target, ()) if call is not None else ():
            obj = registered_object(call.args[i]) if i < len(call.args) and type(call.args[i]) is int else None
            if isinstance(getattr(obj, "device", None), torch.device):
                named.append(obj.device)
    return preferred_device(named, torch.accelerator.current_accelerator())


def shift_indices(gm: torch.fx.GraphModule, by: int) -> None:
    """Add ``by`` to every ``custom.stream`` annotation and every index argument of a stream op
    (plain, or inside a ``control_deps`` body, which gets a copy of its own).

    >>> import torch, streampass as sp
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.ops.aten.sin.default, (x,)); y.meta["custom"] = {"stream": 0}
    >>> rec = g.call_function(ops.RECORD_EVENT, (1, 0)); _ = g.output((y,))
    >>> gm = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> shift_indices(gm, 1)
    >>> y.meta["custom"], rec.args
    ({'stream': 1}, (2, 1))
    """
    if by == 0:
        return
    for node in gm.graph.nodes:
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and type(custom.get("stream")) is int:
            node.meta["custom"] = {**custom, "stream": custom["stream"] + by}
    rewrite_index_args(gm, lambda target, position, k: k + by, "streampass_shifted")


def rewrite_index_args(gm: torch.fx.GraphModule, new, base: str) -> None:
    """Replace each int index argument ``k`` at ``position`` of every stream op ``target`` with
    ``new(target, position, k)``: plain or keyword arguments, constants in a ``control_deps``
    body (which then gets a copy of its own, named after ``base``), or operands of the
    ``control_deps`` that the body takes as placeholders.

    >>> g = torch.fx.Graph()
    >>> rec = g.call_function(ops.RECORD_EVENT, (5,), {"stream_index": 1}); _ = g.output(())
    >>> gm = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> rewrite_index_args(gm, lambda target, position, k: 0 if position == 1 else k, "doc")
    >>> rec.args, rec.kwargs
    ((5, 0), {})
    """

    def rewritten(target, args: tuple) -> tuple:
        positions = ops.INDEX_ARGS[target]
        return tuple(new(target, i, a) if i in positions and type(a) is int else a for i, a in enumerate(args))

    for node in list(gm.graph.nodes):
        call = ops.as_sync_call(node)
        if call is None:
            continue
        if call.wrapper is None:
            args = ops.positional(call.target, node.args, node.kwargs)
            if rewritten(call.target, args) != args:
                node.args, node.kwargs = rewritten(call.target, args), {}
            continue
        body = ops.subgraph_module(node).graph
        inner = [n for n in body.nodes if n.op == "call_function" and id(n.target) in ops.STREAM_OP_IDS]
        placeholders = {p: j for j, p in enumerate(body.find_nodes(op="placeholder"))}
        operands = list(node.args[2:])
        taken: set[int] = set()
        for n in inner:
            args = ops.positional(call.target, n.args, n.kwargs)
            for i in ops.INDEX_ARGS[call.target]:
                j = placeholders.get(args[i]) if i < len(args) else None
                if j is not None and j not in taken and type(operands[j]) is int:
                    operands[j] = new(call.target, i, operands[j])
                    taken.add(j)
        getter = node.args[1]
        if any(
            rewritten(call.target, ops.positional(call.target, n.args, n.kwargs)) != n.args or n.kwargs for n in inner
        ):

            def edit(body: torch.fx.Graph, target=call.target) -> None:
                for n in body.nodes:
                    if n.op == "call_function" and id(n.target) in ops.STREAM_OP_IDS:
                        n.args, n.kwargs = rewritten(target, ops.positional(target, n.args, n.kwargs)), {}

            getter = own_sync_body(gm, node, base, edit)
        node.args = (node.args[0], getter, *operands)


def shared_indices(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, int, object]]:
    """``(node, k, obj)`` for each node an ``sp.stream(k)`` block placed on an index that
    dynamo's object table gives one of the function's own ``torch.Stream``/``torch.Event``
    objects, ``obj``: both are index ``k``, so they are one stream (a torch.Stream block nested
    inside the ``sp.stream`` block overrides it and is not counted). Index 0 on an accelerator
    is dynamo's current stream, the ambient one ``sp.stream(0)`` means. Ask only while dynamo's
    table holds the frame being compiled (a forward compile).

    >>> import torch, streampass as sp
    >>> from torch._dynamo import graph_bytecode_inputs as table
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> y = g.call_function(torch.ops.aten.sin.default, (x,)); y.meta["custom"] = {"stream": 1, "sp.stream": 1}
    >>> _ = g.output((y,)); gm = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> table.reset_user_object_tracking()
    >>> shared_indices(gm)
    []
    >>> mine = [torch.Stream("cpu"), torch.Event("cpu")]  # a function's own objects: indices 0, 1
    >>> for o in mine:
    ...     _ = table.register_graph_created_object(o, lambda index, codegen: None)
    >>> [(n.name, k, type(o).__name__) for n, k, o in shared_indices(gm)]
    [('sin_default', 1, 'Event')]
    >>> table.reset_user_object_tracking()
    """
    out = []
    for node in gm.graph.nodes:
        custom = node.meta.get("custom")
        if not isinstance(custom, dict) or SP_STREAM_KEY not in custom:
            continue
        k = custom[SP_STREAM_KEY]
        if custom.get("stream") != k or (k == 0 and torch.accelerator.is_available()):
            continue
        obj = registered_object(k)
        if obj is not None:
            out.append((node, k, obj))
    return out

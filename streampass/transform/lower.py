"""The device lowerings inductor needs, after :func:`streampass.run` (the verified plan is fixed;
only its encoding changes). Each is all or nothing: on any failure the graph is put back.

* :func:`lower_for_gpu`: the graph keeps its ``custom.stream`` annotations and its
  ``control_deps`` syncs, each with its own subgraph and a non-empty dependency tuple. Under
  inductor's C++ wrapper (``cpp_wrapper``, AOT Inductor), which cannot switch streams, and on
  torch 2.12 the annotations go: every kernel on the current stream, the syncs kept.
* :func:`lower_for_cpu`: streams move to ``node.meta["streampass_stream"]`` and every sync
  becomes ``torch.ops.streampass.sync([anchor], op, int_args)``, a no-op counted in
  :data:`RUNTIME_SYNCS`; ``anchor`` is an empty tensor made for the syncs after the inputs.
"""

from __future__ import annotations

import collections
import contextlib
import operator
from typing import Any

import torch
import torch.fx

from streampass import compat, ops, runtime
from streampass.analysis.reading import StreamAssignment, read_streams
from streampass.errors import StreamPassError
from streampass.ops import AMBIENT
from streampass.runtime import install_object_fallback
from streampass.transform import snapshot
from streampass.transform.annotations import drop_stream
from streampass.transform.inductor_order import order_readers_after_waits
from streampass.transform.one_stream import one_stream, ordered_after_syncs, why_one_stream
from streampass.transform.subgraphs import own_sync_body, set_wrapper_val

__all__ = ["RUNTIME_SYNCS", "STREAM_KEY", "SYNC", "lower_for_cpu", "lower_for_gpu", "lower_inlined", "sync"]

#: ``op name -> calls`` of :func:`sync` made by CPU graphs at run time (tests, debugging).
RUNTIME_SYNCS: collections.Counter[str] = collections.Counter()

STREAM_KEY = "streampass_stream"  # where CPU graphs keep a node's stream for inductor


@torch.library.custom_op("streampass::sync", mutates_args=())
def sync(deps: list[torch.Tensor], op: str, args: list[int]) -> None:
    """A sync point of a CPU graph: ``op(*args)`` of ``torch.ops.streams``, a no-op on CPU.

    ``deps`` only give inductor the call's device (:func:`lower_for_cpu` passes an empty
    tensor made for the syncs); the call is counted in :data:`RUNTIME_SYNCS`.
    """
    RUNTIME_SYNCS[op] += 1


@sync.register_fake
def _(deps, op, args) -> None:
    return None


torch.fx.node.has_side_effect(torch.ops.streampass.sync.default)
SYNC = torch.ops.streampass.sync.default


def _is_tensor_node(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)


def lower_for_cpu(gm: torch.fx.GraphModule, assignment: StreamAssignment | None = None) -> bool:
    """Make a graph :func:`streampass.run` left compilable by inductor's CPU backend.

    Streams move from ``custom["stream"]`` to ``meta["streampass_stream"]``; every stream op
    (plain or in ``control_deps``) becomes ``streampass.sync([anchor], op, int_args)``,
    ``anchor`` an empty tensor made after the inputs that no kernel reads (CPU streams run in
    program order: a sync orders nothing, and a tensor a kernel uses would change inductor's
    schedule), and readers of
    a ``control_deps`` passthrough read the value itself. ``assignment``: the graph's reading
    if the caller has it (:attr:`RunResult.assignment`). Returns whether anything changed (a
    graph without streams is left alone).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> x = torch.ones(4)
    >>> gm = make_fx(f)(x)
    >>> _ = sp.run(gm)
    >>> lower_for_cpu(gm), lower_for_cpu(gm)  # the second call finds nothing to change
    (True, False)
    >>> syncs = [n for n in gm.graph.nodes if n.target is SYNC]
    >>> {d.target for n in syncs for d in n.args[0]}  # one empty tensor, read by no kernel
    {<OpOverload(op='aten.empty', overload='memory_format')>}
    >>> [n.args[1] for n in syncs]
    ['record_event', 'wait_event', 'record_event', 'wait_event', 'record_event', 'wait_event', 'record_event', 'wait_event']
    >>> [n.name for n in gm.graph.nodes if n.meta.get(STREAM_KEY) == 1 and n.target is not SYNC]
    ['sin']
    >>> any("stream" in n.meta.get("custom", {}) for n in gm.graph.nodes)
    False
    >>> counted = RUNTIME_SYNCS.copy()
    >>> torch.equal(gm(x), f(x)), dict(RUNTIME_SYNCS - counted)  # the syncs ran, as no-ops
    (True, {'record_event': 4, 'wait_event': 4})
    """
    with snapshot.all_or_nothing(gm):
        return _lower_for_cpu(gm, assignment)


def _lower_for_cpu(gm: torch.fx.GraphModule, a: StreamAssignment | None) -> bool:
    graph = gm.graph
    changed = False
    a = a if a is not None else read_streams(gm, runtime.state(gm)["external_events"])
    tensor_inputs = [n for n in graph.nodes if n.op == "placeholder" and _is_tensor_node(n)]
    anchor = None
    for node in list(graph.nodes):
        call = a.syncs.get(node)
        if call is None:
            continue
        if call.wrapper is not None:
            deps = [d for d in node.args[0] if _is_tensor_node(d)]
            passthrough = ops.passthrough_values(node)
            deps += [p for p in passthrough if _is_tensor_node(p) and p not in deps]
            for user in list(node.users):
                if user.target is operator.getitem and 1 <= user.args[1] <= len(passthrough):
                    user.replace_all_uses_with(passthrough[user.args[1] - 1])
                    graph.erase_node(user)
            ints = [x for x in call.args if not isinstance(x, torch.fx.Node)]
        else:
            deps = [x for x in call.args if _is_tensor_node(x)]
            ints = [x for x in call.args if isinstance(x, int)]
        # CPU streams run in program order, so a CPU sync needs no data dependencies, only a
        # tensor for inductor's device. Any tensor a kernel uses changes inductor's schedule:
        # an intermediate value is materialized for it (fusions lost), and on torch 2.13 an
        # intermediate or a graph input both exposed an inductor misordering that loses an
        # index_put_ (docs/inductor.md, "What inductor gets, CPU vs CUDA"). So every sync takes
        # one empty tensor made for them.
        if anchor is None:
            anchor = _anchor(graph, (tensor_inputs or deps or [None])[0])
        with graph.inserting_before(node):
            new = graph.call_function(SYNC, ([anchor], call.name, ints))
        new.meta["val"] = None
        new.meta[STREAM_KEY] = a.stream.get(node, AMBIENT)
        new.meta["streampass"] = "sync"
        # Remaining users are other syncs' dependency tuples: order among no-ops is moot.
        for user in list(node.users):
            if user.target is ops.CONTROL_DEPS:
                user.args = (tuple(d for d in user.args[0] if d is not node), *user.args[1:])
        if node.users:
            raise StreamPassError(
                f"{node.name}: cannot lower this sync for CPU: {', '.join(u.name for u in node.users)} still "
                f"use its result, which the CPU sync op does not return"
            )
        graph.erase_node(node)
        changed = True
    for node in graph.nodes:
        s = drop_stream(node)
        if s is not None:
            node.meta[STREAM_KEY] = s
            changed = True
    if changed:
        _drop_unused_subgraphs(gm)
        graph.lint()
        gm.recompile()
    return changed


def _anchor(graph: torch.fx.Graph, like: torch.fx.Node | None) -> torch.fx.Node:
    """An empty tensor on ``like``'s device (the CPU where the graph has no tensor: syncs alone),
    made right after the inputs: what every CPU sync takes for its device. No kernel reads it, so
    no schedule depends on it."""
    if like is None:
        with torch._guards.detect_fake_mode() or contextlib.nullcontext():
            val = torch.empty(0)
    else:
        val = like.meta["val"]
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    where = graph.inserting_after(inputs[-1]) if inputs else graph.inserting_before(next(iter(graph.nodes)))
    with where:
        node = graph.call_function(
            torch.ops.aten.empty.memory_format, ([0],), {"dtype": val.dtype, "device": val.device}
        )
    node.meta["val"] = val.new_empty((0,))
    node.meta["streampass"] = "sync anchor"
    return node


def lower_for_gpu(gm: torch.fx.GraphModule, assignment: StreamAssignment | None = None) -> None:
    """Shape the ``control_deps`` syncs as inductor's lowering needs them (GPU graphs).

    torch 2.13's ``control_deps`` lowering asserts a non-empty dependency tuple and runs the
    subgraph's nodes in the outer graph's environment, so a subgraph shared by several syncs
    fails on its second use: each sync gets its own copy. Event indices streampass allocated
    are ``>= EVENT_BASE``, which is how the run-time fallback (:func:`install_object_fallback`)
    knows they are events. ``assignment`` as for :func:`lower_for_cpu`.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> from streampass import ops
    >>> gm = make_fx(f)(torch.ones(4))
    >>> _ = sp.run(gm)
    >>> shared = {n.args[1].target for n in gm.graph.nodes if n.target is ops.CONTROL_DEPS}
    >>> len(shared)  # 4 records and 4 waits share two subgraphs
    2
    >>> lower_for_gpu(gm)
    >>> syncs = [n for n in gm.graph.nodes if n.target is ops.CONTROL_DEPS and ops.as_sync_call(n)]
    >>> len({n.args[1].target for n in syncs}), all(n.args[0] for n in syncs)  # own copy each, deps non-empty
    (8, True)
    >>> from streampass.transform.plan import EVENT_BASE
    >>> sorted(n.args[2] - EVENT_BASE for n in syncs)  # event indices, two uses each
    [0, 0, 1, 1, 2, 2, 3, 3]
    """
    install_object_fallback()
    with snapshot.all_or_nothing(gm):
        _lower_for_gpu(gm, assignment)


def _lower_for_gpu(gm: torch.fx.GraphModule, a: StreamAssignment | None) -> None:
    graph = gm.graph
    a = a if a is not None else read_streams(gm, runtime.state(gm)["external_events"])
    tensor_inputs = [n for n in graph.nodes if n.op == "placeholder" and _is_tensor_node(n)]
    wrapped = [(node, call) for node, call in a.syncs.items() if call.wrapper is not None]
    if not any(_is_tensor_node(n) for n in graph.nodes) and all(
        u.target is ops.CONTROL_DEPS for n, _ in wrapped for u in n.users
    ):
        # Syncs alone, no kernel to order (a sync body dynamo compiled on its own): the lowering
        # wants a dependency for each wrapped sync, so they go plain, in program order, as torch
        # leaves a sync with nothing before it.
        for node, call in wrapped:
            node.target, node.args = call.target, tuple(call.args)
        wrapped = []
    for node, _ in wrapped:
        # A constant needs no order (nothing in the graph writes it), and inductor lowers a small
        # one to a value that can be neither a dependency ("NotImplementedError: Constant") nor,
        # on torch 2.11, a passthrough ("not a supported top level IR node").
        trim = _pass_no_constants(node)
        getter = own_sync_body(gm, node, "streampass_sync", _typed_placeholders(node.args[2:], trim))
        deps = tuple(d for d in node.args[0] if not _is_constant(d)) or tuple(tensor_inputs[:1]) or node.args[0]
        node.args = (deps, getter, *node.args[2:])
        if trim:
            set_wrapper_val(node)
    if (why := why_one_stream()) is not None:
        one_stream(gm, why)  # StreamPass has done it before planning where the lowering orders syncs
    if ordered_after_syncs() and not compat.LOWERING_ORDERS_PASSTHROUGH_READERS:
        order_readers_after_waits(gm)  # torch 2.13
    _drop_unused_subgraphs(gm)
    graph.lint()
    gm.recompile()


def lower_inlined(gm: torch.fx.GraphModule, gpu: bool) -> None:
    """A body inductor lowers node by node into its caller (``invoke_quant``), whose plan orders
    it: its streams go where the backend cannot take them (CPU, a C++ wrapper); it has no syncs.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         return x.sin()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> lower_inlined(gm, gpu=False)  # CPU: the stream is kept where inductor's CPU codegen ignores it
    >>> [(n.meta[STREAM_KEY], "custom" in n.meta) for n in gm.graph.nodes if n.op == "call_function"]
    [(1, False)]
    """
    if not gpu:
        lower_for_cpu(gm)
    elif (why := why_one_stream()) is not None:
        one_stream(gm, why)


def _is_constant(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and n.op == "get_attr" and isinstance(n.meta.get("val"), torch.Tensor)


def _pass_no_constants(node: torch.fx.Node) -> set[str]:
    """Make the readers of each constant a ``control_deps`` sync passes through read the constant
    itself, and drop it from the sync's arguments; returns the names of the sync subgraph's
    placeholders that took them, for :func:`_typed_placeholders` to drop."""
    body = ops.subgraph_module(node).graph
    outputs = body.output_node().args[0]
    if not isinstance(outputs, (tuple, list)):  # torch's sync bodies with nothing to pass through
        return set()
    placeholders, outputs = list(body.find_nodes(op="placeholder")), list(outputs)
    values = dict(zip(placeholders, node.args[2:], strict=True))
    dropped = {p for p in outputs[1:] if p in values and _is_constant(values[p]) and len(p.users) == 1}
    if not dropped:
        return set()
    kept = [o for o in outputs if o not in dropped]
    for user in list(node.users):
        if user.target is operator.getitem and isinstance(user.args[1], int) and user.args[1] >= 1:
            out = outputs[user.args[1]]
            if out in dropped:
                user.replace_all_uses_with(values[out])
                node.graph.erase_node(user)
            else:
                user.args = (node, kept.index(out))
    node.args = (*node.args[:2], *(v for p, v in values.items() if p not in dropped))
    return {p.name for p in dropped}


def _typed_placeholders(args: tuple, dropped: set[str] = frozenset()) -> Any:
    """An ``edit`` for :func:`own_sync_body`: the placeholders named in ``dropped`` go (from the
    output too), and each other placeholder's ``meta["val"]`` is what the sync passes it (an int
    as itself, a node's fake value). When inductor's ``FakeTensorUpdater`` re-derives a body of a
    higher-order op (a node calling it changed, as a plan of the calling graph changes them), it
    checks every subgraph's arguments against its placeholders' values and asserts on a mismatch
    ("A subgraph argument other than striding has been modified")."""

    def edit(body: torch.fx.Graph) -> None:
        gone = [p for p in body.find_nodes(op="placeholder") if p.name in dropped]
        if gone:
            out = body.output_node()
            out.args = (tuple(o for o in out.args[0] if o not in gone),)
            for placeholder in gone:
                body.erase_node(placeholder)
        for placeholder, arg in zip(body.find_nodes(op="placeholder"), args, strict=True):
            placeholder.meta["val"] = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg

    return edit


def _drop_unused_subgraphs(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.find_nodes(op="get_attr")):
        if not node.users and isinstance(getattr(gm, node.target, None), torch.fx.GraphModule):
            gm.graph.erase_node(node)
            delattr(gm, node.target)

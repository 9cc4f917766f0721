"""A GPU graph whose kernels must all go on the current stream (inductor's C++ wrapper, AOT
Inductor): StreamPass plans it as the one-stream program it runs, joined with each side stream
at entry and exit (``streampass/transform/one_stream.py``)."""

from __future__ import annotations

import pytest
import torch

import streampass as sp
from streampass import ops
from streampass.transform.one_stream import onto_current_stream

from graphs import GraphBuilder, ancestors, aten, reserve_stream_indices, wrap_syncs_in_control_deps

EVENT = 3  # after the three streams reserve_stream_indices registers


def user_program(wrapped: bool) -> torch.fx.GraphModule:
    """Work on streams 1 and 2 and every sync a user writes: an event recorded on stream 1 and
    waited on the ambient stream, ``wait_stream``, ``synchronize_stream``, ``record_stream``."""
    reserve_stream_indices(3)
    b = GraphBuilder()
    x, w = b.input("x"), b.input("w")
    a = b.op(aten.mm.default, x, w, stream=1, name="a")
    b.sync(ops.RECORD_EVENT, EVENT, 1, name="record")
    b.sync(ops.WAIT_EVENT, EVENT, 0, name="wait")
    c = b.op(aten.sin.default, x, stream=2, name="c")
    b.sync(ops.WAIT_STREAM, 0, 2, name="wait_stream")
    b.sync(ops.RECORD_STREAM, c, 2, name="record_stream")
    b.sync(ops.SYNC_STREAM, 1, name="synchronize")
    gm = b.output(b.op(aten.add.Tensor, a, c, name="total"))
    if wrapped:
        wrap_syncs_in_control_deps(gm)
    return gm


def stream_args(gm: torch.fx.GraphModule) -> dict[str, tuple]:
    """sync op name -> its index arguments, in graph order (each op once in ``user_program``)."""
    calls = (ops.as_sync_call(n) for n in gm.graph.nodes)
    return {c.name: tuple(a for a in c.args if type(a) is int) for c in calls if c is not None}


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "control_deps"])
def test_every_kernel_goes_on_the_current_stream_and_every_sync_that_orders_kernels_with_it(wrapped):
    gm = user_program(wrapped)
    with pytest.warns(sp.StreamPassWarning, match="why"):
        assert onto_current_stream(gm, sp.read_streams(gm), "why")
    a = sp.read_streams(gm)
    assert {
        a.stream[n]
        for n in gm.graph.nodes
        if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "aten"
    } == {0}
    joins = [c.args for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_STREAM]
    assert joins[:2] == [(0, 1), (0, 2)] and joins[-2:] == [(1, 0), (2, 0)]
    args = stream_args(gm)
    # an event recorded where the kernels now run covers them; the host waits for that stream;
    # record_stream tells the allocator about a stream, and keeps naming it
    assert args["record_event"] == (EVENT, 0) and args["wait_event"] == (EVENT, 0)
    assert args["synchronize_stream"] == (0,) and args["record_stream"] == (2,)


def test_a_graph_without_side_streams_is_left_alone():
    b = GraphBuilder()
    x = b.input("x")
    gm = b.output(b.op(aten.sin.default, x))
    before = str(gm.graph)
    assert not onto_current_stream(gm, sp.read_streams(gm), "why")
    assert str(gm.graph) == before


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "control_deps"])
def test_the_planned_one_stream_program_holds_every_kernel_between_its_joins(wrapped):
    """After StreamPass plans it, each kernel that reads an input (here: all of them) depends on
    every entry join, and every exit join on each kernel, through the graph's own edges: no later
    pass can move one past a join. (A kernel that reads no input touches no memory the caller's
    work on a side stream could.)"""
    gm = user_program(wrapped)
    with pytest.warns(sp.StreamPassWarning):
        onto_current_stream(gm, sp.read_streams(gm), "why")
    result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok
    joins = {
        n: c.args for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.WAIT_STREAM
    }
    entry = [j for j, (waiting, waited) in joins.items() if waiting == 0 and waited != 0]
    exits = [j for j, (waiting, waited) in joins.items() if waiting != 0 and waited == 0]
    kernels = [n for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "namespace", None) == "aten"]
    assert len(entry) == len(exits) == 2 and len(kernels) == 3
    for k in kernels:
        assert set(entry) <= ancestors(k), k
    for j in exits:
        assert set(kernels) <= ancestors(j), j


def test_a_sync_body_annotated_as_dynamo_does_gets_a_copy_without_its_stream():
    """dynamo annotates a sync written in a ``with s:`` block and torch copies the annotation
    onto the op in its ``control_deps`` body, which inductor then issued in ``with stream1:``
    (Python, in the C++ wrapper's code). The body so annotated is copied, and the copy has no
    stream; the original, which another graph may share, keeps its own."""
    gm = user_program(wrapped=True)
    bodies = {}
    for node in gm.graph.find_nodes(op="call_function", target=ops.CONTROL_DEPS):
        body = ops.subgraph_module(node)
        for inner in body.graph.nodes:
            if inner.op == "call_function":
                inner.meta["custom"] = {"stream": 1}
        bodies[node] = body
    with pytest.warns(sp.StreamPassWarning):
        onto_current_stream(gm, sp.read_streams(gm), "why")
    for node, original in bodies.items():
        body = ops.subgraph_module(node)
        assert body is not original and all("custom" not in n.meta for n in body.graph.nodes)
        assert {n.meta["custom"]["stream"] for n in original.graph.nodes if n.op == "call_function"} == {1}


def test_indices_given_as_keywords_or_as_operands_of_a_sync_body_are_rewritten_too():
    """A user's graph may pass a sync's indices as keywords; StreamPass's own lowered syncs pass
    them to their body as ``control_deps`` operands. Left naming a side stream, such a sync would
    order nothing the kernels do, silently."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from streampass.transform.dynamo_indices import rewrite_index_args
    from streampass.transform.lower import lower_for_gpu

    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + x

    gm = make_fx(f)(torch.ones(4))
    sp.run(gm)
    lower_for_gpu(gm)  # every sync a control_deps whose body takes the indices as placeholders
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        keywords = gm.graph.call_function(ops.WAIT_STREAM, (), {"waiting_stream_index": 1, "waited_on_stream_index": 0})
    before = [(c.name, c.args) for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None]
    assert {k for _, args in before for k in args[1:2]} >= {0, 1}
    rewrite_index_args(gm, lambda target, position, k: 0 if position == 1 or target is ops.WAIT_STREAM else k, "t")
    after = [(c.name, c.args) for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None]
    assert [name for name, _ in after] == [name for name, _ in before]
    assert all(args[1] == 0 for _, args in after) and keywords.args == (0, 0) and keywords.kwargs == {}
    assert [args[0] for name, args in after if name != "wait_stream"] == [
        args[0] for name, args in before if name != "wait_stream"
    ]

"""Reading every dialect a graph uses to say where its nodes run, and refusing malformed ones."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import ops
from streampass.aot_guard import cpu_safe_aot

from graphs import GraphBuilder, aten, wrap_syncs_in_control_deps


def streams_by_name(gm):
    a = sp.read_streams(gm)
    return {n.name: s for n, s in a.stream.items()}


def test_annotations_from_stream_context_under_make_fx_nested():
    def f(x):
        a = x.sin()
        with sp.stream(1):
            b = x.cos()
            with sp.stream(2):
                c = b * 2
            d = c + 1
            with sp.stream(0):
                e = d.exp()
        return a + e

    gm = make_fx(f)(torch.ones(3))
    s = streams_by_name(gm)
    assert (s["sin"], s["cos"], s["mul"], s["add"], s["exp"], s["add_1"]) == (0, 1, 2, 1, 0, 0)


def test_stream_context_under_aot_function_forward_and_backward():
    from functorch.compile import aot_function

    seen = {}

    def compiler(name):
        def inner(gm, _):
            seen[name] = {n.name: (n.meta.get("custom") or {}).get("stream") for n in gm.graph.nodes}
            return gm

        return inner

    def f(x):
        with sp.stream(1):
            y = x.sin()
        return (y * x).sum()

    x = torch.randn(4, requires_grad=True)
    # torch 2.13's own AOT stream pass needs triton on CPU training graphs: see streampass.compat
    with cpu_safe_aot():
        out = aot_function(f, fw_compiler=compiler("fw"), bw_compiler=compiler("bw"))(x)
        out.backward()
    assert seen["fw"]["sin"] == 1
    assert 1 in seen["bw"].values(), "backward nodes inherit the forward's stream"
    assert torch.allclose(x.grad, (x.sin() + x * x.cos()).detach())


def test_stream_index_must_be_an_int():
    with pytest.raises(sp.StreamPassError, match="must be an int"):
        sp.stream("1")
    with pytest.raises(sp.StreamPassError, match=">= 0"):
        sp.stream(-1)
    b = GraphBuilder()
    x = b.input("x")
    y = b.op(aten.sin.default, x, name="bad")
    y.meta["custom"] = {"stream": 1.5}
    gm = b.output(y)
    with pytest.raises(sp.StreamPassError, match=r"'bad'.*must be an int"):
        sp.read_streams(gm)


def test_fork_join_regions_nested_with_unannotated_nodes():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.FORK, 0, 1, name="fork1")
    y = b.op(aten.sin.default, x, name="y")
    b.sync(ops.FORK, 1, 2, name="fork2")
    z = b.op(aten.cos.default, y, name="z")
    b.sync(ops.JOIN, 2, 1, name="join2")
    w = b.op(aten.mul.Tensor, y, z, name="w")
    annotated = b.op(aten.neg.default, w, stream=3, name="annotated")  # annotation beats the region
    b.sync(ops.JOIN, 1, 0, name="join1")
    v = b.op(aten.add.Tensor, w, annotated, name="v")
    gm = b.output(v)
    s = streams_by_name(gm)
    assert (s["y"], s["z"], s["w"], s["annotated"], s["v"]) == (1, 2, 1, 3, 0)
    assert (s["fork1"], s["fork2"], s["join2"], s["join1"]) == (0, 1, 1, 0)


@pytest.mark.parametrize(
    "build, message, node",
    [
        (lambda b, x: b.sync(ops.JOIN, 1, 0, name="j"), "without a matching fork", "j"),
        (lambda b, x: b.sync(ops.FORK, 0, 1, name="f"), "never joined", "f"),
        (
            lambda b, x: (b.sync(ops.FORK, 0, 1), b.sync(ops.JOIN, 2, 0, name="j")),
            "does not close the innermost fork",
            "j",
        ),
        (lambda b, x: b.sync(ops.FORK, 3, 1, name="f"), "current stream here is 0", "f"),
        (lambda b, x: b.sync(ops.WAIT_EVENT, 7, 1, name="w"), "event 7, which no earlier node records", "w"),
        (lambda b, x: b.sync(ops.RECORD_EVENT, 7, "s", name="r"), "must be an int", "r"),
        (lambda b, x: b.sync(ops.RECORD_EVENT, 1, 0, name="r"), "both as a stream and as an event", "s1"),
    ],
)
def test_malformed_graphs_raise_naming_the_node(build, message, node):
    b = GraphBuilder()
    x = b.input("x")
    build(b, x)
    gm = b.output(b.op(aten.sin.default, b.op(aten.cos.default, x, stream=1, name="s1")))
    with pytest.raises(sp.StreamPassError, match=message) as info:
        sp.read_streams(gm)
    assert info.value.node == node


def test_external_event_may_be_waited_on():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.WAIT_EVENT, 7, 1, name="w")
    gm = b.output(b.op(aten.sin.default, x, stream=1))
    a = sp.read_streams(gm, external_events=[7])
    assert a.stream[a.nodes[1]] == 1


def test_existing_syncs_plain_and_wrapped_in_control_deps():
    b = GraphBuilder()
    x = b.input("x")
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.RECORD_EVENT, 5, 1, name="rec")
    b.sync(ops.WAIT_EVENT, 5, 0, name="wait")
    b.sync(ops.WAIT_STREAM, 2, 1, name="ws")
    expected = {"rec": ("record_event", 1), "wait": ("wait_event", 0), "ws": ("wait_stream", 2)}
    if ops.exists(ops.SYNC_STREAM):  # torch 2.11 has no synchronize_* ops
        b.sync(ops.SYNC_STREAM, 1, name="ss")
        expected["ss"] = ("synchronize_stream", 0)
    b.sync(ops.RECORD_STREAM, y, 0, name="rs")
    expected["rs"] = ("record_stream", 0)
    gm = b.output(b.op(aten.cos.default, y))
    a = sp.read_streams(gm)
    assert {n.name: (c.name, a.stream[n]) for n, c in a.syncs.items()} == expected

    # The same syncs wrapped in control_deps (as AOT autograd wraps user syncs) read identically.
    b = GraphBuilder(device="meta")
    x = b.input("x")
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.RECORD_EVENT, 5, 1, name="rec")
    b.sync(ops.WAIT_EVENT, 5, 0, name="wait")
    gm = b.output(b.op(aten.cos.default, y, stream=0))
    wrap_syncs_in_control_deps(gm)
    a = sp.read_streams(gm)
    wrapped = {c.name: (c.args, a.stream[n]) for n, c in a.syncs.items()}
    assert wrapped == {"record_event": ((5, 1), 1), "wait_event": ((5, 0), 0)}
    assert all(c.wrapper is not None for c in a.syncs.values())


def test_control_deps_passthrough_getitem_is_an_alias_of_its_source():
    gm = make_fx(lambda x: x.sin().cos())(torch.ones(2))
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.sin.default:
            n.meta["custom"] = {"stream": 1}
    sp.run(gm)
    a = sp.read_streams(gm)
    passthrough = [n for n in a.nodes if ops.passthrough_source(n) is not None]
    assert passthrough, "run() reads values through control_deps passthroughs"
    for n in passthrough:
        assert a.root[n] is a.root[ops.passthrough_source(n)]
        assert not a.is_compute(n)

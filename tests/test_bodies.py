"""Streams inside the bodies of higher-order ops (``torch.cond``'s branches, ``no_grad`` blocks
that strict export wraps): read, verified and planned in the body (issue 12). Before, the
standalone ``verify`` said a graph with a branch on stream 1 was race-free and ``run`` added
nothing: a missed race."""

from __future__ import annotations

import operator

import pytest
import torch

import streampass as sp
from streampass import ops
from streampass.transform.plan import EVENT_BASE


class Branches(torch.nn.Module):
    """A side-stream producer before a cond and its reader after it (the outer graph's syncs span
    the cond), and both branches on stream 2."""

    def forward(self, x):
        with sp.stream(1):
            early = x.exp()
        y = x.sin() * 2

        def on_2(y):
            with sp.stream(2):
                return y.cos() + 1

        def on_2_too(y):
            with sp.stream(2):
                return y.tan()

        return torch.cond(y.sum() > 0, on_2, on_2_too, (y,)) + early


class NoGrad(torch.nn.Module):
    def forward(self, x):
        y = x.sin()
        with torch.no_grad():
            with sp.stream(1):
                z = y.cos()
        return z + 1


def exported(module: torch.nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    # strict export keeps the annotations inside the bodies (make_fx and non-strict drop them)
    return torch.export.export(module, args, strict=True).graph_module


def events(gm: torch.fx.GraphModule) -> list[int]:
    return [
        c.args[0] for n in gm.graph.nodes if (c := ops.as_sync_call(n)) is not None and c.target is ops.RECORD_EVENT
    ]


def written(gm: torch.fx.GraphModule):
    return gm.code, [(n.name, n.target, n.args) for n in gm.graph.nodes]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_streams_in_cond_branches_are_verified_and_planned(sign):
    x = torch.randn(4).abs() * sign
    gm = exported(Branches(), x)
    report = sp.verify(gm)
    assert report.streams == [0, 1, 2]
    inside = sorted((h.kind, h.nodes) for h in report.hazards if h.nodes[0].startswith(("true", "false")))
    assert inside == [
        ("entry", ("false_graph_0.mul", "false_graph_0.tan")),
        ("entry", ("true_graph_0.mul", "true_graph_0.cos")),
        ("exit", ("false_graph_0.tan", "false_graph_0.output")),
        ("exit", ("true_graph_0.add", "true_graph_0.output")),
    ]
    assert "in true_graph_0 (called by cond): cos on stream 2" in str(report)

    result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok
    assert result.waits_added >= 4 + 4  # the branches' entry and exit, the outer graph's
    assert events(gm.true_graph_0) and events(gm.false_graph_0)
    # The cond runs between an outer record and its wait: a branch re-recording one of the
    # outer graph's events would make that wait wait for the branch instead.
    everything = events(gm) + events(gm.true_graph_0) + events(gm.false_graph_0)
    assert len(set(everything)) == len(everything) and min(everything) >= EVENT_BASE
    assert not sp.run(gm).changed
    torch.testing.assert_close(gm(x)[0], Branches()(x))


def test_a_graph_planned_after_its_bodies_takes_events_they_do_not_use():
    """inductor hands the bodies to the pass first, then the graph that calls them
    (``with_bodies=False``): its new events must still differ from the bodies'."""
    x = torch.randn(4).abs()
    gm = exported(Branches(), x)
    for body in (gm.true_graph_0, gm.false_graph_0):
        assert sp.run(body).ok
    assert sp.run(gm, with_bodies=False).ok
    # (the two branches may share events: one runs at a time, each after the other's waits)
    assert events(gm) and not set(events(gm)) & set(events(gm.true_graph_0) + events(gm.false_graph_0))
    torch.testing.assert_close(gm(x)[0], Branches()(x))


def test_a_getitem_of_an_exported_no_grad_block_is_on_its_op_stream():
    """Strict export wraps the block in wrap_with_set_grad_enabled, annotates its getitem and
    not the op: the getitem made nothing on stream 1 (a spurious dealloc hazard, and syncs
    around it), and the cos on stream 1 that reads sin went unseen."""
    x = torch.randn(4)
    gm = exported(NoGrad(), x)
    a = sp.read_streams(gm)
    assert {n.name: s for n, s in a.stream.items() if n.op != "get_attr"} == dict.fromkeys(
        ("x", "sin", "cos", "getitem", "add", "output"), 0
    )
    report = sp.verify(gm)
    assert sorted(h.kind for h in report.hazards) == ["entry", "exit"]
    assert all(h.nodes[0].startswith("submod_") for h in report.hazards)
    result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok and not sp.run(gm).changed
    torch.testing.assert_close(gm(x)[0], NoGrad()(x))


def test_streams_in_a_map_body_are_planned():
    from torch._higher_order_ops.map import map as hop_map

    class Mapped(torch.nn.Module):
        def forward(self, xs, y):
            def body(x, z):
                with sp.stream(1):
                    return x.cos() + z

            return hop_map(body, xs, y.sin())

    args = (torch.randn(3, 4), torch.randn(4))
    gm = exported(Mapped(), *args)
    assert sorted(h.kind for h in sp.verify(gm).hazards) == ["entry", "entry", "exit"]
    assert sp.run(gm).ok and sp.verify(gm).ok and not sp.run(gm).changed
    torch.testing.assert_close(gm(*args)[0], Mapped()(*args))


class OnSide(torch.nn.Module):
    """A cond inside a stream-1 block whose true branch puts work on stream 2."""

    def forward(self, x):
        def on_2(y):
            with sp.stream(2):
                return y.cos()

        with sp.stream(1):
            x = x.sin()  # the outer graph has its own syncs to plan
            return torch.cond(x.sum() > 0, on_2, lambda y: y.tan(), (x,))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_cond_on_a_side_stream_with_streams_in_its_branch_moves_to_the_ambient_stream(sign):
    """verify cannot read such a branch (its streams are read from the ambient stream, the op
    runs on stream 1) and says so; run moves the cond to the ambient stream, with a warning,
    and plans the rest. Before, run refused the graph (and under torch.compile the body was
    planned from stream 0 while it ran on stream 1: its syncs named the wrong stream)."""
    x = torch.randn(4).abs() * sign
    gm = exported(OnSide(), x)
    before = [written(m) for m in (gm, gm.true_graph_0, gm.false_graph_0)]
    with pytest.raises(sp.StreamPassError, match="runs on stream 1, and its body true_graph_0") as info:
        sp.verify(gm)
    assert info.value.node == "cond"
    assert [written(m) for m in (gm, gm.true_graph_0, gm.false_graph_0)] == before

    with pytest.warns(sp.StreamPassWarning, match="node 'cond': runs on stream 1.*moved to the ambient stream"):
        result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok and not sp.run(gm).changed
    cond = next(n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond)
    assert sp.read_streams(gm).stream[cond] == 0
    assert events(gm.true_graph_0)  # the branch's own stream 2 is planned
    torch.testing.assert_close(gm(x)[0], OnSide()(x))


def test_a_cond_inside_a_stream_block_with_plain_branches_is_planned():
    """Strict export copies the block's stream onto the branches' nodes: such a branch runs
    on the op's own stream and is planned, not refused (a refusal here was a regression)."""

    class Inside(torch.nn.Module):
        def forward(self, x):
            with sp.stream(1):
                y = x.sin()
                b = torch.cond(y.sum() > 1, lambda y: y.cos(), lambda y: y.tan(), (y,))
            return b + x

    x = torch.randn(4)
    gm = exported(Inside(), x)
    assert sp.run(gm).ok and sp.verify(gm).ok and not sp.run(gm).changed
    torch.testing.assert_close(gm(x)[0], Inside()(x))


def test_a_refused_branch_leaves_the_graph_and_every_branch_as_they_were():
    x = torch.randn(4)
    gm = exported(Branches(), x)
    body = gm.false_graph_0.graph
    tan = next(n for n in body.nodes if n.name == "tan")
    with body.inserting_before(tan):
        body.call_function(ops.JOIN, (2, 0), name="bad_join")  # a join with no fork
    gm.false_graph_0.recompile()
    before = [written(m) for m in (gm, gm.true_graph_0, gm.false_graph_0)]
    with pytest.raises(sp.StreamPassError, match="join") as info:
        sp.run(gm)
    assert info.value.node == "bad_join"
    assert [written(m) for m in (gm, gm.true_graph_0, gm.false_graph_0)] == before


def test_inductor_plans_each_body_on_its_own(fresh_caches):
    """Inside torch.compile inductor hands every body to the post-grad pass itself: StreamPass
    plans each graph once, bodies included, and the result equals eager."""
    import streampass.inductor as spi

    def f(x):
        y = x.sin() * 2

        def on_1(y):
            with sp.stream(1):
                return y.cos() + 1

        return torch.cond(y.sum() > 0, on_1, lambda y: y.tan(), (y,))

    p = sp.StreamPass(keep_graphs=True)
    x = torch.randn(4).abs()
    with spi.enabled(p):
        out = torch.compile(f, fullgraph=True)(x)
    torch.testing.assert_close(out, f(x))
    planned = [r for r in p.reports if r.waits_added]
    assert len(planned) == 1 and planned[0].streams == [0, 1]
    kept = [(r.verified_graph, r.external_events) for r in p.reports if r.verified_graph is not None]
    assert kept and all(sp.verify(g, external_events=e).ok for g, e in kept)


def test_a_kept_graph_verifies_with_its_bodies_as_the_pass_left_them(fresh_caches):
    """inductor edits a body after the pass has seen it (the CPU lowering; under fallback_random
    torch wraps its random ops in control_deps): a kept graph holds the bodies' kept copies, so
    verify checks what the pass left (it read the live body and refused torch's wrapper)."""
    import streampass.inductor as spi

    def branch(x):
        return torch.rand_like(x) + torch.randn_like(x)  # two random ops: chained by torch

    def f(x):
        with sp.stream(1):
            y = x.sin()
        return torch.cond(x.sum() > 0, branch, lambda x: x * 2, (y,))

    torch._dynamo.reset()
    p = sp.StreamPass(keep_graphs=True)
    with torch._inductor.config.patch(fallback_random=True), spi.enabled(p):
        torch.compile(f)(torch.ones(4, 4))
    outer = [r for r in p.reports if r.verified_graph is not None and r.streams == [0, 1]]
    assert len(outer) == 1
    assert sp.verify(outer[0].verified_graph, external_events=outer[0].external_events).ok


def test_a_body_shared_by_two_ops_is_checked_against_each():
    """One body called by a cond on the ambient stream and by another on stream 1 (dynamo reuses
    an ``invoke_subgraph`` body, a graph traced again names a module once per use): verify
    refuses the second caller and run moves it. Before, only the first caller was looked at:
    the body was planned from stream 0 while it also ran on stream 1."""

    def on_2(y):
        with sp.stream(2):
            return y.cos()

    class Twice(torch.nn.Module):
        def forward(self, x):
            a = torch.cond(x.sum() > 0, on_2, lambda y: y.tan(), (x,))
            with sp.stream(1):
                b = torch.cond(x.sum() > 1, on_2, lambda y: y.tan(), (x,))
            return a + b

    x = torch.randn(4)
    gm = exported(Twice(), x)
    for node in gm.graph.find_nodes(op="get_attr"):  # the second cond calls the first's branches
        node.target = node.target.replace("_graph_1", "_graph_0")
    gm.recompile()
    with pytest.raises(sp.StreamPassError, match="runs on stream 1, and its body true_graph_0") as info:
        sp.verify(gm)
    assert info.value.node == "cond_1"
    with pytest.warns(sp.StreamPassWarning, match="node 'cond_1': runs on stream 1"):
        assert sp.run(gm).ok
    assert sp.verify(gm).ok
    torch.testing.assert_close(gm(x)[0], Twice()(x))


def test_a_refused_body_leaves_no_runtime_hooks_or_record_on_its_caller():
    """The caller is planned before its bodies; when a body is refused, the caller's code comes
    back, and so must its record and the hooks that bind its table (they were left behind)."""
    x = torch.randn(4)
    gm = exported(Branches(), x)
    body = gm.false_graph_0.graph
    with body.inserting_before(next(n for n in body.nodes if n.name == "tan")):
        body.call_function(ops.JOIN, (2, 0), name="bad_join")
    gm.false_graph_0.recompile()
    meta = [dict(m.meta) for m in (gm, gm.true_graph_0)]
    with pytest.raises(sp.StreamPassError, match="join"):
        sp.run(gm)
    assert [dict(m.meta) for m in (gm, gm.true_graph_0)] == meta
    assert not gm._forward_pre_hooks and not gm.true_graph_0._forward_pre_hooks


def test_a_graph_planned_without_its_bodies_moves_an_op_whose_body_has_streams():
    """run(with_bodies=False), as StreamPass plans each graph under torch.compile (the bodies
    first), reads the streams the body was planned with and moves the op as run does. Before,
    it planned the caller as it was: the two disagreed and verify refused the result."""
    x = torch.randn(4)
    gm = exported(OnSide(), x)
    assert sp.run(gm.true_graph_0).ok  # planned first, as inductor does: the body's record says [0, 2]
    assert sp.run(gm.false_graph_0).ok
    with pytest.warns(sp.StreamPassWarning, match="node 'cond': runs on stream 1.*streams \\[0, 2\\]"):
        assert sp.run(gm, with_bodies=False).ok
    assert sp.verify(gm).ok
    torch.testing.assert_close(gm(x)[0], OnSide()(x))


def test_a_body_on_a_side_stream_is_planned_under_torch_compile(fresh_caches):
    """The same program compiled: inductor hands the branches to the pass before the graph that
    calls them; the cond moves to the ambient stream, the result equals eager and every kept
    graph verifies."""
    import streampass.inductor as spi

    torch._dynamo.reset()
    p = sp.StreamPass(keep_graphs=True)
    x = torch.randn(4).abs()
    with spi.enabled(p), pytest.warns(sp.StreamPassWarning, match="moved to the ambient stream"):
        out = torch.compile(OnSide(), fullgraph=True)(x)
    torch.testing.assert_close(out, OnSide()(x))
    kept = [(r.verified_graph, r.external_events) for r in p.reports if r.verified_graph is not None]
    assert len(kept) >= 2 and all(sp.verify(g, external_events=e).ok for g, e in kept)


def test_a_nested_compile_region_called_on_two_streams_compiles(fresh_caches):
    """``torch.compiler.nested_compile_region``: dynamo calls one ``invoke_subgraph`` body twice,
    here once from a stream block; that call moves to the ambient stream, the other stays, the
    result equals eager and every kept graph verifies. (Gradients are not compared: torch's
    inductor gets this program's gradients wrong on CPU without streampass, 2.11 and 2.13.)"""
    import streampass.inductor as spi

    s1, s2 = torch.Stream("cpu"), torch.Stream("cpu")

    @torch.compiler.nested_compile_region
    def block(y):
        with s2:
            z = y.cos() + 1
        return z * y.sin()

    def f(x):
        a = block(x)
        with s1:
            b = block(x * 2)
        return a + b

    torch._dynamo.reset()
    p = sp.StreamPass(keep_graphs=True)
    x = torch.randn(8)
    with spi.enabled(p), pytest.warns(sp.StreamPassWarning, match="invoke_subgraph.*moved to the ambient stream"):
        out = torch.compile(f)(x)
    torch.testing.assert_close(out, f(x))
    kept = [(r.verified_graph, r.external_events) for r in p.reports if r.verified_graph is not None]
    assert len(kept) >= 2 and all(sp.verify(g, external_events=e).ok for g, e in kept)


def inner_on_2(y):
    with sp.stream(2):
        return y.cos()


def outer_branch(y):
    return torch.cond(y.sum() > 1, inner_on_2, lambda z: z.tan(), (y,))


class Nested(torch.nn.Module):
    """A cond on stream 1 whose branch calls a cond whose branch uses stream 2."""

    def forward(self, x):
        with sp.stream(1):
            x = x.sin()
            return torch.cond(x.sum() > 0, outer_branch, lambda y: y.exp(), (x,)) * 3


def conds(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]


@pytest.mark.parametrize("bodies_first", [False, True])
def test_an_op_whose_nested_body_uses_another_stream_moves(bodies_first):
    """The streams of a body's own bodies count (review: the outer cond stayed on stream 1,
    standalone run refused the graph, and planned bodies first as under torch.compile, verify
    refused the result). Both conds move, with their getitems; the result equals eager."""
    x = torch.randn(4).abs() + 1
    gm = exported(Nested(), x)
    branch = gm.true_graph_0
    with pytest.warns(sp.StreamPassWarning, match="node 'cond'.*streams \\[0, 1, 2\\]"):
        if bodies_first:  # inductor's order: the innermost graph first, each without its bodies
            for g in (branch.true_graph_0, branch.false_graph_0, branch, gm.false_graph_0, gm):
                assert sp.run(g, with_bodies=False).ok
        else:
            assert sp.run(gm).ok
    assert sp.verify(gm).ok
    for cond in conds(gm) + conds(branch):
        assert sp.read_streams(cond.graph.owning_module).stream[cond] == 0
        getitems = [u for u in cond.users if u.target is operator.getitem]
        assert getitems and all((u.meta.get("custom") or {}).get("stream") == 0 for u in getitems)
    torch.testing.assert_close(gm(x)[0], Nested()(x))


def test_a_refused_run_warns_of_no_move():
    """The move is reported once the whole tree is planned: a run refused later leaves the op
    where it was, and no warning says otherwise."""
    gm = exported(OnSide(), torch.randn(4))
    body = gm.false_graph_0.graph
    with body.inserting_before(next(n for n in body.nodes if n.name == "tan")):
        body.call_function(ops.JOIN, (3, 0), name="bad_join")
    gm.false_graph_0.recompile()
    import warnings

    with warnings.catch_warnings(record=True) as caught, pytest.raises(sp.StreamPassError, match="join"):
        warnings.simplefilter("always")
        sp.run(gm)
    assert not [w for w in caught if issubclass(w.category, sp.StreamPassWarning)]
    assert (conds(gm)[0].meta["custom"] or {}).get("stream") == 1


def test_a_nested_body_on_another_stream_compiles(fresh_caches):
    import streampass.inductor as spi

    s1, s2 = torch.Stream("cpu"), torch.Stream("cpu")

    def inner(y):
        with s2:
            return y.cos()

    def outer(y):
        return torch.cond(y.sum() > 1, inner, lambda z: z.tan(), (y,))

    def f(x):
        with s1:
            x = x.sin()
            return torch.cond(x.sum() > 0, outer, lambda y: y.exp(), (x,)) * 3

    p = sp.StreamPass(keep_graphs=True)
    x = torch.randn(4).abs() + 1
    with spi.enabled(p), pytest.warns(sp.StreamPassWarning, match="moved to the ambient stream"):
        out = torch.compile(f, fullgraph=True)(x)
    torch.testing.assert_close(out, f(x))
    kept = [(r.verified_graph, r.external_events) for r in p.reports if r.verified_graph is not None]
    assert len(kept) >= 3 and all(sp.verify(g, external_events=e).ok for g, e in kept)


def test_a_body_with_nothing_of_its_own_to_plan_passes_on_its_bodies_streams():
    """StreamPass leaves a graph with no stream of its own as it is, but its record must still
    name the streams of its bodies, or its caller on a side stream stays there while a body
    under it uses stream 2 (planned from stream 0)."""
    x = torch.randn(4).abs() + 1
    gm = exported(Nested(), x)
    branch = gm.true_graph_0
    for n in branch.graph.nodes:  # the branch itself on the ambient stream
        (n.meta.get("custom") or {}).pop("stream", None)
    branch.recompile()
    p = sp.StreamPass()
    for g in (branch.true_graph_0, branch.false_graph_0, branch, gm.false_graph_0):  # inductor's order
        p(g.graph)
    assert p.reports[2].streams == [0]  # nothing of its own to plan
    with pytest.warns(sp.StreamPassWarning, match="node 'cond': runs on stream 1.*streams \\[0, 1, 2\\]"):
        p(gm.graph)


def test_bodies_planned_after_their_graph_take_events_it_does_not_use():
    """The other order: the graph first with ``with_bodies=False``, then its bodies on their
    own. A branch re-recording one of the outer graph's events (the cond runs between an outer
    record and its wait) would make that wait wait for the branch instead. Before, each body
    started its events above its own indices only, and took the outer graph's."""
    x = torch.randn(4).abs()
    gm = exported(Branches(), x)
    assert sp.run(gm, with_bodies=False).ok
    outer = set(events(gm))
    for body in (gm.true_graph_0, gm.false_graph_0):
        assert sp.run(body).ok
        assert events(body) and not outer & set(events(body))
    torch.testing.assert_close(gm(x)[0], Branches()(x))


class CondOnSide(torch.nn.Module):
    def forward(self, x):
        with sp.stream(2):
            r = torch.cond(x.sum() > 0, lambda x: x.cos(), lambda x: x.sin(), (x,))
        return r + 1


def test_a_branch_get_attr_is_no_input_read_on_a_side_stream():
    """A cond on stream 2 names its branches with get_attrs of submodules. They were taken for
    tensors read on stream 2: a legal order placing one after the entry record made verify
    report an 'entry' hazard on the branch, and a second run add a record and a wait for it."""
    from reorder import random_topological_copy

    x = torch.randn(4, 4)
    gm = exported(CondOnSide(), x)
    assert sp.run(gm).ok
    for seed in range(20):
        moved = random_topological_copy(gm, seed)
        assert sp.verify(moved).ok, seed
        again = sp.run(moved)
        assert again.records_added == again.waits_added == 0, seed
    torch.testing.assert_close(gm(x)[0], CondOnSide()(x))


class NoGradUpdate(torch.nn.Module):
    """The running-average pattern: stream 1 reads a buffer, then ``torch.no_grad()`` (or autocast)
    updates it in place on the ambient stream; export makes the block a higher-order op."""

    def __init__(self, block):
        super().__init__()
        self.block = block
        self.register_buffer("avg", torch.ones(4))

    def forward(self, x):
        with sp.stream(1):
            out = x * self.avg
        with self.block():
            self.avg.mul_(0.9).add_(x, alpha=0.1)
        return out


BLOCKS = {"no_grad": torch.no_grad, "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}


@pytest.mark.parametrize("block", BLOCKS)
def test_a_body_writing_its_operand_in_place_writes_it_for_the_caller(block):
    """The op was read as a kernel that only reads its operands: the update came with no wait for
    stream 1's read, and verify agreed (found by review). Its body's graph says what it writes."""
    gm = torch.export.export(NoGradUpdate(BLOCKS[block]), (torch.randn(4),), strict=True).module()
    op = next(n for n in gm.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator))
    assert ("war", "mul", op.name) in {(h.kind, *h.nodes) for h in sp.verify(gm).hazards}
    assert sp.run(gm).ok
    assert sp.StreamDAG.from_graph(gm).happens_before("mul", op.name)


# --------------------------------------------------------------------------------------------
# Subgraphs inductor inlines into the op (flex attention's score and mask functions,
# foreach_map's and invoke_quant's functions): no bodies, never planned
# --------------------------------------------------------------------------------------------
SIDE = torch.Stream("cpu")


def flex_on_sp_stream(q, k, v, w):
    from torch.nn.attention.flex_attention import flex_attention

    with sp.stream(1):
        a = flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 0.5)
    return a, torch.tanh(q * w)


def flex_on_a_user_stream(q, k, v, w):
    from torch.nn.attention.flex_attention import flex_attention

    with SIDE:
        a = flex_attention(q, k, v)
    return a, torch.tanh(q * w)


def foreach_map_on_sp_stream(x, y, w):
    from torch._higher_order_ops.foreach_map import foreach_map

    with sp.stream(1):
        a, b = foreach_map(lambda u, v: u * v + 1, [x, y], [y, x])
    return a + b + w.cos()


def foreach_map_on_a_user_stream(x, y, w):
    from torch._higher_order_ops.foreach_map import foreach_map

    with SIDE:
        a, b = foreach_map(lambda u, v: u * v + 1, [x, y], [y, x])
    return a + b + w.cos()


def _quantized(x, y):
    return (torch.sin(x) * y,)


def invoke_quant_on_sp_stream(x, w):
    from torch._higher_order_ops import InvokeQuant

    with sp.stream(1):
        a = InvokeQuant()(_quantized, x, x)[0] * 2.0
    return a + w.cos()


def invoke_quant_on_a_user_stream(x, w):
    from torch._higher_order_ops import InvokeQuant

    with SIDE:
        a = InvokeQuant()(_quantized, x, x)[0] * 2.0
    return a + w.cos()


INLINING = {
    "flex_on_sp_stream": (flex_on_sp_stream, lambda: [torch.randn(1, 2, 16, 8) for _ in range(4)]),
    "flex_on_a_user_stream": (flex_on_a_user_stream, lambda: [torch.randn(1, 2, 16, 8) for _ in range(4)]),
    "foreach_map_on_sp_stream": (foreach_map_on_sp_stream, lambda: [torch.randn(8) for _ in range(3)]),
    "foreach_map_on_a_user_stream": (foreach_map_on_a_user_stream, lambda: [torch.randn(8) for _ in range(3)]),
    "invoke_quant_on_sp_stream": (invoke_quant_on_sp_stream, lambda: [torch.randn(8) for _ in range(2)]),
    "invoke_quant_on_a_user_stream": (invoke_quant_on_a_user_stream, lambda: [torch.randn(8) for _ in range(2)]),
}


@pytest.mark.parametrize("name", sorted(INLINING))
def test_an_op_whose_subgraphs_inductor_inlines_compiles_on_a_side_stream(fresh_caches, name):
    """Before, StreamPass planned the inlined subgraph as a body run from the ambient stream (a
    record and a wait around its output), and inductor refused to lower it: "Buffers cannot be
    created while lowering a pointwise subgraph". Now the op is one kernel on its stream: one
    graph planned, its syncs ran, and the result equals eager."""
    from reference import compile_and_compare

    fn, make = INLINING[name]
    p, ran = compile_and_compare(fn, *make())
    assert [(r.graph, r.streams) for r in p.reports] == [("inference", [0, 1])]
    assert p.reports[0].waits_added >= 1 and ran >= p.reports[0].records_added + p.reports[0].waits_added


@pytest.mark.parametrize("fn", [invoke_quant_on_sp_stream, invoke_quant_on_a_user_stream], ids=["sp", "user"])
def test_invoke_quant_trains_on_a_side_stream_with_its_function_planned_in_its_caller(fresh_caches, fn):
    """Inductor lowers ``invoke_quant``'s function node by node into the calling graph. Before,
    StreamPass planned it as a body too (syncs the caller already had, lowered on GPU under
    the caller's attribute names, where the lowering asserted), and on CPU the function's
    stream annotations had to be lowered. Now the forward and the backward are planned once each,
    and the outputs and gradients equal eager."""
    from reference import compile_and_compare

    p, ran = compile_and_compare(fn, torch.randn(8), torch.randn(8), training=True)
    assert [(r.graph, r.streams) for r in p.reports] == [("forward", [0, 1]), ("backward", [0, 1])]
    assert ran >= sum(r.records_added + r.waits_added for r in p.reports)


def test_subgraphs_inductor_inlines_are_no_bodies_to_run():
    """Standalone: ``run`` plans the flex attention op on stream 1 as one kernel and leaves its
    score and mask functions as they were; a second run adds nothing; the result equals eager."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from streampass.analysis import bodies

    args = [torch.randn(1, 2, 16, 8) for _ in range(4)]
    gm = make_fx(flex_on_sp_stream)(*args)
    subgraphs = [m for m, _ in bodies.inlined(gm)]
    assert len(subgraphs) == 2 and bodies.bodies(gm) == []
    before = [written(m) for m in subgraphs]
    first = sp.run(gm)
    assert first.ok and first.waits_added >= 1
    assert [written(m) for m in subgraphs] == before
    assert sp.run(gm).changed is False
    for got, want in zip(gm(*args), flex_on_sp_stream(*args)):
        torch.testing.assert_close(got, want)

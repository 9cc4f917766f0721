"""Storage that a node writes or shares although no schema says so, or says it for the first
result only (issue 12, found by a review with a dynamic oracle that watched each kernel's storage):
``set_``, several ``out=`` results, the ``unsafe_`` splits, the Python spellings ``symbolic_trace``
records (``out=``, ``inplace=True``, ``_foreach_*_`` lists, an embedding's ``max_norm``), and a
value whose last use on another stream is a write.

Each program writes a storage on stream 1 that the ambient stream reads after, under a name
streampass must see through. The check does not trust streampass's reading: the writer must
happen before the reader by the syncs, every legal reorder of the result must verify clean and
compute what the program computes, and a second run must add nothing.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import ops

from reorder import random_topological_copy
from storage_oracle import state_after


def _set(x, y):
    z = y.clone()
    z.set_(x)  # z is x's storage from here on
    with sp.stream(1):
        z.add_(1)
    return x * 1


def _max_out(x, base):
    i = base[0]
    v = torch.empty(4)
    torch.max(x, 1, out=(v, i))  # the indices land in base
    with sp.stream(1):
        i.add_(1)
    return base * 1


def _unsafe_split(x):
    _, b = x.unsafe_split(2)  # views, though the schema says nothing
    with sp.stream(1):
        b.mul_(3)
    return x * 1


def _unsafe_chunk(x):
    _, b = x.unsafe_chunk(2)
    with sp.stream(1):
        b.mul_(3)
    return x * 1


def _out_keyword(x, y):
    with sp.stream(1):
        torch.add(x, x, out=y)
    return y * 1


def _foreach(x, y):
    with sp.stream(1):
        torch._foreach_add_([x, y], 1.0)
    return x + y


def _inplace_flag(x):
    with sp.stream(1):
        F.relu(x, inplace=True)
        F.leaky_relu(x, 0.1, True)  # the flag given by position
    return x * 1


class _Embedding(torch.nn.Module):
    def __init__(self, functional: bool):
        super().__init__()
        self.functional = functional
        self.emb = torch.nn.Embedding(10, 4, max_norm=1.0)
        torch.nn.init.normal_(self.emb.weight, std=3.0)

    def forward(self, idx):
        with sp.stream(1):  # renormalizes the rows it looks up, in the weight
            e = F.embedding(idx, self.emb.weight, max_norm=1.0) if self.functional else self.emb(idx)
        return self.emb.weight.sum() + e.sum()


class _SetItem(torch.nn.Module):
    """``symbolic_trace`` records ``self.buf[0] = v`` as the method ``__setitem__``, not ``operator.setitem``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(4, 4))

    def forward(self, x):
        with sp.stream(1):
            self.buf[0] = x[1]
        return x + self.buf  # (``self.buf * 1`` would be computed while tracing: no proxy in it)


def _through(make):
    """A program that writes ``x`` on stream 1 through ``make(x)``, a call that returns ``x`` or a view of it."""

    def program(x):
        v = make(x)
        with sp.stream(1):
            v.mul_(2)
        return x + 1

    return program


# Calls that return their input or a view of it, as ``symbolic_trace`` records them: views by
# names nothing listed, conversions to what the tensor already is, a view's input by keyword, and
# aten op packets (no overload picked, so no schema).
_VIEWS_BY_NAME = {
    "hsplit": lambda x: x.hsplit(2)[1],
    "vsplit": lambda x: torch.vsplit(x, 2)[1],
    "broadcast_to": lambda x: torch.broadcast_to(x, (4, 4)),
    "broadcast_tensors": lambda x: torch.broadcast_tensors(x, x)[1],
    "atleast_2d": lambda x: torch.atleast_2d(x),
    "ravel": lambda x: x.ravel(),
    "positive": lambda x: torch.positive(x),
    "conj": lambda x: x.conj(),
    "resolve_conj": lambda x: x.resolve_conj(),
    "to same dtype": lambda x: x.to(torch.float32),
    "float": lambda x: x.float(),
    "type_as": lambda x: x.type_as(x),
    "cpu": lambda x: x.cpu(),
    "transpose(input=)": lambda x: torch.transpose(input=x, dim0=0, dim1=1),
    "aten.t packet": lambda x: torch.ops.aten.t(x),
    "aten.alias packet": lambda x: torch.ops.aten.alias(x),
    "aten.view packet": lambda x: torch.ops.aten.view(x, [16]),
}


def _init_constant(x):
    z = x.clone()
    with sp.stream(1):
        torch.nn.init.constant_(z, 0.3)  # recorded as ``constant_(tensor=clone, val=0.3)``
    return z + 1


# (name, tracer, program, its inputs, the node that writes on stream 1, the ambient node reading after)
CASES = [
    ("set_ make_fx", make_fx, _set, lambda: (torch.randn(4), torch.randn(4)), "add_", "mul"),
    ("set_ symbolic_trace", torch.fx.symbolic_trace, _set, lambda: (torch.randn(4), torch.randn(4)), "add_", "mul"),
    ("max out= make_fx", make_fx, _max_out, lambda: (torch.randn(4, 4), torch.zeros(2, 4, dtype=torch.long)), "add_", "mul"),
    ("max out= symbolic_trace", torch.fx.symbolic_trace, _max_out, lambda: (torch.randn(4, 4), torch.zeros(2, 4, dtype=torch.long)), "add_", "mul"),
    ("unsafe_split make_fx", make_fx, _unsafe_split, lambda: (torch.randn(4, 4),), "mul_", "mul"),
    ("unsafe_chunk make_fx", make_fx, _unsafe_chunk, lambda: (torch.randn(4, 4),), "mul_", "mul"),
    ("unsafe_split symbolic_trace", torch.fx.symbolic_trace, _unsafe_split, lambda: (torch.randn(4, 4),), "mul_", "mul"),
    ("out= symbolic_trace", torch.fx.symbolic_trace, _out_keyword, lambda: (torch.randn(4), torch.randn(4)), "add", "mul"),
    ("foreach symbolic_trace", torch.fx.symbolic_trace, _foreach, lambda: (torch.randn(4), torch.randn(4)), "_foreach_add_", "add"),
    ("inplace= symbolic_trace", torch.fx.symbolic_trace, _inplace_flag, lambda: (torch.randn(4),), "leaky_relu", "mul"),
    ("Embedding(max_norm) module", torch.fx.symbolic_trace, _Embedding(False).eval(), lambda: (torch.tensor([1, 2]),), "emb", "sum_1"),
    ("__setitem__ method", torch.fx.symbolic_trace, _SetItem(), lambda: (torch.randn(4, 4),), "setitem", "add"),
    ("F.embedding(max_norm)", torch.fx.symbolic_trace, _Embedding(True).eval(), lambda: (torch.tensor([1, 2]),), "embedding", "sum_1"),
    ("nn.init.constant_(tensor=)", torch.fx.symbolic_trace, _init_constant, lambda: (torch.randn(4, 4),), "constant_", "add"),
] + [
    (f"{name} symbolic_trace", torch.fx.symbolic_trace, _through(make), lambda: (torch.randn(4, 4),), "mul_", "add")
    for name, make in _VIEWS_BY_NAME.items()
]  # fmt: skip


@pytest.mark.parametrize("name, trace, program, inputs, writer, reader", CASES, ids=[c[0] for c in CASES])
def test_a_write_under_another_name_is_ordered_before_the_ambient_read(name, trace, program, inputs, writer, reader):
    torch.manual_seed(0)
    args = inputs()
    gm = trace(program)(*args) if trace is make_fx else trace(program)
    want = state_after(copy.deepcopy(gm), args)
    result = sp.run(gm)
    assert result.ok, result.after
    dag = sp.StreamDAG.from_graph(gm)
    assert dag.stream_of(writer) == 1 and dag.stream_of(reader) == 0
    assert dag.happens_before(writer, reader), f"{writer} (stream 1) is not ordered before {reader}"
    torch.testing.assert_close(state_after(copy.deepcopy(gm), args), want)
    for seed in range(4):
        moved = random_topological_copy(copy.deepcopy(gm), seed)
        assert sp.verify(moved).ok
        with sp.runtime.bind(moved):
            torch.testing.assert_close(state_after(moved, args), want)
    assert not sp.run(gm).changed


def test_a_value_last_written_on_another_stream_outlives_the_write():
    """``z`` is made on the ambient stream and last used by an in-place write on stream 1: its
    memory must not return to the ambient stream's allocator before the write is done, exactly as
    if the last use were a read."""

    def program(x):
        z = x * 2
        with sp.stream(1):
            z.add_(1)
        return x.sum()

    gm = make_fx(program)(torch.randn(4))
    assert "dealloc" in {h.kind for h in sp.verify(gm).hazards}
    assert sp.run(gm).ok
    kept = {v.name for n in gm.graph.nodes if n.target is ops.CONTROL_DEPS for v in ops.passthrough_values(n)}
    assert "mul" in kept  # rides through a wait of the ambient stream, after the write


def test_an_index_of_a_call_nothing_describes_is_a_view_of_its_result():
    """``symbolic_trace`` records ``v[0]`` of ``v = F.layer_norm(w, (4,))`` as a getitem of a call
    with no schema and no metadata: it was read as one result of a multi-output op, a new tensor,
    so ``v[0].copy_(v[1])`` on stream 1 did not count as a write of ``v`` and the ambient read of
    ``v`` before it got no wait (found by the storage-oracle property test)."""

    def program(w, x):
        v = F.layer_norm(w, (4,))
        out = v + x
        with sp.stream(1):
            v[0].copy_(v[1])
        return out, v

    gm = torch.fx.symbolic_trace(program)
    args = (torch.randn(4, 4), torch.randn(4, 4))
    want = program(*[a.clone() for a in args])
    assert sp.run(gm).ok
    dag = sp.StreamDAG.from_graph(gm)
    assert dag.happens_before("add", "copy_")  # the read, then the write
    torch.testing.assert_close(gm(*[a.clone() for a in args]), want)


def test_a_graph_returning_only_a_module_tensor_still_returns_after_its_syncs():
    """The output reads nothing made after the last sync but a module tensor: it reads that through
    the sync, or a sort that places the output first (``legalize_graph``) leaves the syncs after
    FX's ``return`` (found by the storage-oracle property test)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
            self.register_buffer("buf", torch.randn(4, 4))

        def forward(self, x):
            with sp.stream(1):
                self.w.mul_(x)
            return (self.buf,)

    gm = torch.fx.symbolic_trace(M())
    assert sp.run(gm).ok
    for seed in range(6):
        assert sp.verify(random_topological_copy(copy.deepcopy(gm), seed)).ok


@pytest.mark.parametrize("name", ["contiguous", "ravel"])
def test_an_exported_call_that_copies_is_work_that_reads_its_input(name):
    """``torch.export`` keeps ``aten.contiguous`` (and ``reshape``, ``flatten``, ``ravel``, ``to``),
    whose schemas say they return their input: on ``x.t()`` they launch a copy kernel that reads
    ``x``. Read as a view, the copy on stream 1 got no wait for the input, no order before the
    ambient ``x.mul_(2)``, and no join (found by storage-oracle fuzzes)."""

    class M(torch.nn.Module):
        def forward(self, x):
            with sp.stream(1):
                t = getattr(x.t(), name)()
            x.mul_(2)
            return (t,)

    gm = torch.export.export(M(), (torch.randn(4, 4),), strict=False).module()
    assert sp.run(gm).ok
    dag = sp.StreamDAG.from_graph(gm)
    copy_kernel = next(n.name for n in gm.graph.nodes if name in n.name)
    assert dag.stream_of(copy_kernel) == 1
    assert dag.happens_before(copy_kernel, "mul_") and dag.happens_before(copy_kernel, "output")


class _Meshgrid(torch.nn.Module):
    def forward(self, x, y):
        a, b = torch.meshgrid(x[0], y[0], indexing="ij")  # expands of x[0] and y[0]
        with sp.stream(1):
            r = a + b
        x[0].mul_(2)
        return (r,)


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_each_result_of_meshgrid_is_a_view_of_its_own_input(tracer):
    """``meshgrid`` and ``broadcast_tensors`` return one view per input, and aten's schemas say
    nothing (``torch.export`` keeps ``aten.meshgrid``): the read of ``a`` on stream 1 must come
    before the ambient write of ``x`` (found by a storage-oracle fuzz)."""
    args = (torch.randn(4, 4), torch.randn(4, 4))
    module = _Meshgrid()
    if tracer == "export":
        gm = torch.export.export(module, tuple(a.clone() for a in args), strict=False).module()
    else:
        gm = torch.fx.symbolic_trace(module)
    want = state_after(copy.deepcopy(gm), args)
    assert sp.run(gm).ok
    dag = sp.StreamDAG.from_graph(gm)
    reader = next(n.name for n in gm.graph.nodes if n.name.startswith("add"))
    writer = next(n.name for n in gm.graph.nodes if n.name.startswith("mul_"))
    assert dag.stream_of(reader) == 1 and dag.happens_before(reader, writer)
    torch.testing.assert_close(state_after(copy.deepcopy(gm), args), want)
    assert not sp.run(gm).changed


def test_a_result_of_broadcast_tensors_issued_after_a_wait_is_ordered_through_the_call():
    """The ambient wait for ``y.mul_`` protects the output's read of ``y`` through ``b``, one
    result of a call issued after the wait: the call's read of ``y`` is the use to reroute, not the
    getitem's (whose input is the call's tuple). Before, the reroute was a no-op that a second
    ``run`` made again and called a change (found by the storage-oracle property test)."""

    def program(x, y):
        with sp.stream(1):
            y.mul_(2)
        m = x @ y
        with sp.stream(1):
            b = torch.broadcast_tensors(x, y)[1]
        return m, b

    gm = torch.fx.symbolic_trace(program)
    args = (torch.randn(4, 4), torch.randn(4, 4))
    want = state_after(copy.deepcopy(gm), args)
    assert sp.run(gm).ok
    assert not sp.run(gm).changed
    call = gm.graph.find_nodes(op="call_function", target=torch.functional.broadcast_tensors)[0]
    assert any(i.target is ops.CONTROL_DEPS for i in call.args[1].all_input_nodes)  # reads y through a wait
    for seed in range(4):
        moved = random_topological_copy(copy.deepcopy(gm), seed)
        assert sp.verify(moved).ok
        with sp.runtime.bind(moved):
            torch.testing.assert_close(state_after(moved, args), want)

"""The race detector: each hazard kind found when present, not reported when synchronized."""

from __future__ import annotations

import pytest
import torch

import streampass as sp
from streampass import ops

from graphs import GraphBuilder, aten


def kinds(gm, **kw):
    return sorted(h.kind for h in sp.verify(gm, **kw).hazards)


def two_stream_read(sync: bool):
    """y = sin(x) on stream 1, read by cos on the ambient stream."""
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.RECORD_EVENT, 10, 0)
    b.sync(ops.WAIT_EVENT, 10, 1)  # entry: stream 1 waits for the ambient stream
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.RECORD_EVENT, 11, 1)
    if sync:
        b.sync(ops.WAIT_EVENT, 11, 0)
    z = b.op(aten.cos.default, y, name="z")
    return b.output(z)


def test_raw_and_exit_found_without_wait_and_gone_with_it():
    assert kinds(two_stream_read(sync=False)) == ["dealloc", "exit", "raw"]
    report = sp.verify(two_stream_read(sync=False))
    raw = next(h for h in report.hazards if h.kind == "raw")
    assert raw.nodes == ("y", "z")
    assert "z on stream 0 reads y" in raw.message and "before y has finished" in raw.message
    # with the wait, only the deferred free of y is missing
    assert kinds(two_stream_read(sync=True)) == ["dealloc"]


def test_an_output_made_last_on_its_stream_is_one_exit_hazard():
    """The output's value and its stream's join are both unmet by the same missing wait: one
    hazard about the value (it was listed twice, once per requirement)."""
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.RECORD_EVENT, 10, 0)
    b.sync(ops.WAIT_EVENT, 10, 1)
    y = b.op(aten.sin.default, x, stream=1, name="y")
    exits = [h for h in sp.verify(b.output(y)).hazards if h.kind == "exit"]
    assert [h.nodes for h in exits] == [("y", "output")]
    assert "output y is written by y on stream 1" in exits[0].message


def test_entry_hazard_when_side_stream_reads_an_input_without_waiting():
    b = GraphBuilder()
    x = b.input("x")
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.RECORD_EVENT, 11, 1)
    b.sync(ops.WAIT_EVENT, 11, 0)
    gm = b.output(b.op(aten.cos.default, y))
    assert "entry" in kinds(gm)
    h = next(h for h in sp.verify(gm).hazards if h.kind == "entry")
    assert h.nodes == ("x", "y") and "graph input x" in h.message


def test_war_waw_and_read_after_mutation_across_streams():
    b = GraphBuilder()
    x = b.input("x")
    t = b.op(aten.sin.default, x, name="t")  # ambient
    b.sync(ops.RECORD_EVENT, 10, 0)
    b.sync(ops.WAIT_EVENT, 10, 1)
    r = b.op(aten.cos.default, t, stream=1, name="reader")  # stream 1 reads t
    m = b.op(aten.mul_.Tensor, t, t, name="mutate")  # ambient overwrites t: war with reader
    b.sync(ops.RECORD_EVENT, 12, 1)
    b.sync(ops.WAIT_EVENT, 12, 0)
    gm = b.output(m, r)
    ks = kinds(gm)
    assert "war" in ks
    war = next(h for h in sp.verify(gm).hazards if h.kind == "war")
    assert war.nodes == ("reader", "mutate")

    b = GraphBuilder()
    x = b.input("x")
    t = b.op(aten.sin.default, x, name="t")
    b.sync(ops.RECORD_EVENT, 10, 0)
    b.sync(ops.WAIT_EVENT, 10, 1)
    w1 = b.op(aten.add_.Tensor, t, 1, stream=1, name="w1")  # synced write on stream 1
    w2 = b.op(aten.mul_.Tensor, t, 2, stream=2, name="w2")  # stream 2 writes without waiting
    b.sync(ops.RECORD_EVENT, 13, 1)
    b.sync(ops.WAIT_EVENT, 13, 0)
    b.sync(ops.RECORD_EVENT, 14, 2)
    b.sync(ops.WAIT_EVENT, 14, 0)
    gm = b.output(w1, w2)
    found = {(h.kind, h.nodes) for h in sp.verify(gm).hazards}
    assert ("waw", ("w1", "w2")) in found
    assert ("entry", ("t", "w2")) not in found  # t is not an input
    assert all(k != "raw" for k, _ in found)


def test_dealloc_cleared_by_a_keepalive_wait_or_record_stream():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.RECORD_EVENT, 10, 0)
    b.sync(ops.WAIT_EVENT, 10, 1)
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.RECORD_EVENT, 11, 1)
    b.sync(ops.WAIT_EVENT, 11, 0)
    z = b.op(aten.cos.default, y, name="z")
    b.sync(ops.RECORD_STREAM, y, 0)
    gm = b.output(z)
    assert kinds(gm) == []


def test_torch_fanout_miss_is_found(fanout_graph):
    """torch 2.13's insert_backward_syncs gives a producer read on two other streams one wait."""
    from torch._functorch._aot_autograd.streams import insert_backward_syncs

    gm = fanout_graph()
    insert_backward_syncs(gm)
    records_after_producer = [n for n in gm.graph.nodes if n.target is ops.RECORD_EVENT and n.prev.name == "producer"]
    event = records_after_producer[0].args[0]
    waits_on_it = [n for n in gm.graph.nodes if n.target is ops.WAIT_EVENT and n.args[0] == event]
    assert len(waits_on_it) == 1, "torch 2.13 gives each producer one wait"
    report = sp.verify(gm)
    raws = [h for h in report.hazards if h.kind == "raw"]
    assert [h.nodes for h in raws] == [("producer", "reader_b")]


def test_correctly_synchronized_graph_is_clean():
    """Entry waits, one wait per consumer stream, exit joins, a deferred free: nothing to report."""
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.RECORD_EVENT, 10, 0)
    b.sync(ops.WAIT_EVENT, 10, 1)
    b.sync(ops.WAIT_EVENT, 10, 2)
    p = b.op(aten.sin.default, x, stream=1, name="p")
    b.sync(ops.RECORD_EVENT, 11, 1)
    b.sync(ops.WAIT_EVENT, 11, 2)
    q = b.op(aten.cos.default, p, stream=2, name="q")
    b.sync(ops.WAIT_EVENT, 11, 0)
    r = b.op(aten.neg.default, p, name="r")
    b.sync(ops.RECORD_EVENT, 12, 2)
    b.sync(ops.WAIT_EVENT, 12, 0)
    b.sync(ops.RECORD_STREAM, p, 0)
    b.sync(ops.RECORD_STREAM, p, 2)
    gm = b.output(q, r)
    assert sp.verify(gm).ok, sp.verify(gm)


def test_wait_stream_and_synchronize_give_happens_before():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.WAIT_STREAM, 1, 0)
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.SYNC_STREAM, 1)  # host waits for stream 1: everything later is ordered after y
    z = b.op(aten.cos.default, y, name="z")
    b.sync(ops.RECORD_STREAM, y, 0)
    gm = b.output(z)
    assert sp.verify(gm).ok, sp.verify(gm)
    dag = sp.StreamDAG.from_graph(gm)
    assert dag.happens_before("x", "y") and dag.happens_before("y", "z")
    assert not dag.happens_before("z", "y")


def test_waiting_on_a_stream_that_runs_nothing_is_a_no_op():
    """wait_stream / synchronize_stream naming a stream no node of the graph runs on: nothing to
    wait for, so no error and no ordering (it used to be a bare KeyError)."""
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.WAIT_STREAM, 0, 3)
    y = b.op(aten.sin.default, x, stream=1, name="y")
    b.sync(ops.SYNC_STREAM, 5)
    z = b.op(aten.cos.default, y, name="z")
    gm = b.output(z)
    assert kinds(gm) == ["dealloc", "entry", "exit", "raw"]  # the waits order nothing
    assert sp.verify(gm).streams == [0, 1, 3, 5]  # named streams get a place in the table
    result = sp.run(gm)
    assert result.ok and not sp.run(gm).changed
    x = torch.randn(4)
    assert torch.equal(gm(x)[0], x.sin().cos())  # the runtime table has streams 3 and 5 too


def test_an_index_named_as_a_stream_and_recorded_as_an_event_is_refused():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(ops.RECORD_EVENT, 3, 0)
    b.sync(ops.WAIT_STREAM, 0, 3)  # stream 3 runs nothing, but its index is event 3's
    gm = b.output(x)
    code = gm.code
    with pytest.raises(sp.StreamPassError, match=r"wait_stream_default.*index 3 is used both"):
        sp.run(gm)
    assert gm.code == code


def test_report_text_and_counts():
    report = sp.verify(two_stream_read(sync=False))
    assert not report.ok
    assert report.by_kind()["raw"] == 1 and report.by_kind()["war"] == 0
    text = str(report)
    assert text.startswith("3 hazard(s) on streams [0, 1]") and "[raw]" in text
    assert str(sp.verify(_clean_graph())) == "no hazards on streams [0]"


def _clean_graph():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(aten.sin.default, (x,)))
    return g

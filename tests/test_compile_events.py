"""Events that cross a graph's boundary under torch.compile: recorded by one graph (or eager
code) and waited on by another. A graph break between ``e.record()`` and ``e.wait()`` does
this to any program; so does recording in one compiled function and waiting in the next.
StreamPass treats a wait on an event no earlier node of the graph records as a wait on a record
made before the graph ran (``events_recorded_outside``), and keeps the other graph's record,
which has no waiter of its own."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch._dynamo

import streampass as sp
import streampass.inductor as spi
from streampass import compat, ops
from streampass.analysis.reading import events_recorded_outside
from streampass.transform.plan import EVENT_BASE

from reference import planned_syncs, reference
from user_stream_programs import CpuStream

pytestmark = pytest.mark.usefixtures("fresh_caches")

S1, S2 = torch.Stream("cpu"), torch.Stream("cpu")
E = torch.Event("cpu")


def record_on_s1(x):
    with S1:
        y = x * 2
        E.record()
    return y


def wait_on_s2(y):
    # On CPU dynamo cannot trace ``E.wait()`` outside a stream block (it has no current stream
    # there), so the wait is issued on S2.
    with S2:
        E.wait()
        return y.sin() + 1


def record_then_wait(x):
    return wait_on_s2(record_on_s1(x))


def record_break_wait(x):
    y = record_on_s1(x)
    torch._dynamo.graph_break()
    return wait_on_s2(y)


def _event_records(gm: torch.fx.GraphModule) -> list[int]:
    a = sp.read_streams(gm, events_recorded_outside(gm))
    return [c.args[0] for c in a.syncs.values() if c.target is ops.RECORD_EVENT]


def _check_reports(reports: list, ran: int) -> None:
    """``reports``: the recorder's graph, then the waiter's."""
    kept = [r for r in reports if r.verified_graph is not None]
    assert len(kept) == 2, [r.line() for r in reports]
    recorder, waiter = kept
    for r in kept:
        assert sp.verify(r.verified_graph, r.external_events).ok, r.line()
    # The waiter's event is the recorder's: recorded there, declared outside here, and said so.
    assert recorder.external_events == []
    (event,) = waiter.external_events
    assert event in _event_records(recorder.verified_graph)
    assert event not in _event_records(waiter.verified_graph)
    assert f"waits on event(s) [{event}] recorded outside the graph" in waiter.line()
    assert ran >= sum(planned_syncs(r.verified_graph) for r in kept)


def test_an_event_recorded_by_one_compiled_function_is_waited_on_by_the_next():
    x = torch.randn(8)
    want, _ = reference(record_then_wait, lambda: [x.clone()])
    p = spi.StreamPass(keep_graphs=True)
    before = sum(spi.RUNTIME_SYNCS.values())
    with spi.enabled(p):
        got = torch.compile(wait_on_s2)(torch.compile(record_on_s1)(x.clone()))
    torch.testing.assert_close(got, want)
    _check_reports(p.reports, sum(spi.RUNTIME_SYNCS.values()) - before)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_a_graph_break_between_record_and_wait(training):
    x = torch.randn(8)
    want, args_e = reference(record_break_wait, lambda: [x.clone().requires_grad_(training)])
    p = spi.StreamPass(keep_graphs=True)
    before = sum(spi.RUNTIME_SYNCS.values())
    x_c = x.clone().requires_grad_(training)
    with spi.enabled(p):
        got = torch.compile(record_break_wait)(x_c)
    ran = sum(spi.RUNTIME_SYNCS.values()) - before
    torch.testing.assert_close(got, want)
    if training:
        got.sum().backward()  # after the block, as a training loop does
        want.sum().backward()
        torch.testing.assert_close(x_c.grad, args_e[0].grad)
        backward = [r for r in p.reports if r.graph == "backward"]
        assert len(backward) == 2 and all(sp.verify(r.verified_graph, r.external_events).ok for r in backward)
    _check_reports([r for r in p.reports if r.graph != "backward"], ran)


def synchronize_on_s2(y):
    with S2:
        v = y.sin()
        E.synchronize()  # E: recorded before the graph, by the graph before the break
        return v * 2


def record_break_synchronize(x):
    y = record_on_s1(x)
    torch._dynamo.graph_break()
    return synchronize_on_s2(y)


def test_a_training_forward_synchronizes_on_an_event_recorded_before_it():
    """torch 2.12 and 2.13 thread every graph input through the ``control_deps`` of an
    ``e.synchronize()`` whose event the graph does not record, the loss's incoming gradient
    included, so the second forward's output depended on a backward input and AOT's partitioner
    failed ("Node mul was invalid, but is output"), with or without streampass (found by a
    compile fuzz). Under ``enabled()`` a forward sync keeps to the forward's dependencies
    (aot_guard.py). Backward after the block, as a training loop does."""
    x = torch.randn(8)
    want, args_e = reference(record_break_synchronize, lambda: [x.clone().requires_grad_()])
    p = spi.StreamPass(keep_graphs=True)
    x_c = x.clone().requires_grad_()
    with spi.enabled(p):
        got = torch.compile(record_break_synchronize)(x_c)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x_c.grad, args_e[0].grad)
    assert [r.graph for r in p.reports] == ["forward", "forward", "backward", "backward"]
    assert all(sp.verify(r.verified_graph, r.external_events).ok for r in p.reports)
    recorder, synchronizer = p.reports[:2]
    if compat.STREAM_METHODS_ARE_OPS:  # torch 2.11 runs Event.synchronize() while tracing
        (event,) = synchronizer.external_events
        assert event in _event_records(recorder.verified_graph)
        sync_targets = [c.target for c in sp.read_streams(synchronizer.verified_graph, (event,)).syncs.values()]
        assert ops.SYNC_EVENT in sync_targets


def steady_state_step(x):
    """Each call starts by waiting on the record the previous call made at its end: the wait
    comes before the graph's own record of the same event."""
    with S2:
        E.wait()
        y = x.cos()
    with S1:
        z = y * 3
        E.record()
    return z + 1


def test_a_wait_before_the_graphs_own_record_waits_on_the_previous_call():
    xs = [torch.randn(8) for _ in range(3)]
    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        step = torch.compile(steady_state_step, fullgraph=True)
        got = [step(x) for x in xs]
    for g, x in zip(got, xs):
        torch.testing.assert_close(g, (x.cos() * 3) + 1)
    (r,) = p.reports
    (event,) = r.external_events
    assert event in _event_records(r.verified_graph)  # the graph's own record is kept
    assert sp.verify(r.verified_graph, r.external_events).ok
    assert sp.verify(r.verified_graph).ok  # the kept graph carries the events recorded outside it
    with pytest.raises(sp.StreamPassError, match=rf"pass external_events=\[{event}\]"):
        sp.verify(r.verified_graph, ())  # told there are none, it refuses as run does


def test_standalone_run_still_asks_for_the_events_recorded_outside():
    """Outside torch.compile an event index may mean anything: ``run`` refuses to guess."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.call_function(ops.WAIT_EVENT, (5, 1))
    g.output(g.call_function(torch.ops.aten.sin.default, (x,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    code = gm.code
    with pytest.raises(sp.StreamPassError, match=r"pass external_events=\[5\]"):
        sp.run(gm)
    assert gm.code == code
    assert events_recorded_outside(gm) == (5,)
    assert sp.run(gm, external_events=[5]).ok
    for g in (gm, copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        assert sp.verify(g).ok  # run recorded the events it was given on the module


S0, S3 = torch.Stream("cpu"), torch.Stream("cpu")


def host_sync_in_a_block(x, w, hist, sync=True):
    with S0:
        v = x.sin() * x
        with torch.Stream("cpu"):
            hist[1:3] = v.detach()[0:2]
            u = x * hist.sum(0)
            if sync:
                S3.synchronize()  # torch wraps it in control_deps, passing v, hist and u through
            m = v @ w
            r = u * v
        return (v**2).mean() + (m**2).mean() + r.mean()


def test_the_values_a_host_sync_passes_through_keep_its_stream():
    """torch copies each value's stream annotation onto the getitems that pass it through the
    ``control_deps`` of ``S3.synchronize()``; the pass reads them on the sync's (ambient) stream
    and must annotate them so. Before, the edit left ``v``'s pass-through annotated with ``v``'s
    stream and the compile stopped on an internal error (found by a compile fuzz)."""
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    w_e, w_c = w.clone().requires_grad_(), w.clone().requires_grad_()
    hist_e, hist_c = torch.zeros(4, 8), torch.zeros(4, 8)
    want = host_sync_in_a_block(x, w_e, hist_e, sync=False)
    p = spi.StreamPass(keep_graphs=True)
    with spi.enabled(p):
        got = torch.compile(host_sync_in_a_block)(x, w_c, hist_c)
    got.backward()  # after the block, as a training loop does
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(hist_c, hist_e)
    torch.testing.assert_close(w_c.grad, w_e.grad)
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    assert all(sp.verify(r.verified_graph, r.external_events).ok for r in p.reports)


CUR, SIDE = CpuStream("cpu"), CpuStream("cpu")


def events_from_record_event(x):
    """The events come from ``Stream.record_event()`` (pytorch's test_ctx_manager.py,
    ``test_cuda_event_method_create_stream_outside_of_compile``; vLLM and SGLang write it so).
    Streams made outside the function; on CPU the stand-ins' eager record is a no-op."""
    with CUR:
        y = x + 3
        e = CUR.record_event()
        SIDE.wait_event(e)
        with SIDE:
            z = (y * 4).sin()
        CUR.wait_event(SIDE.record_event())
        return (z + y).cos()


RECORDS = 2 if compat.STREAM_METHODS_ARE_OPS else 0  # the records events_from_record_event traces to


class _Traced(Exception):
    pass


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_an_event_that_stream_record_event_returned(training):
    """dynamo names the event ``s.record_event()`` returns by calling its lookup function and
    knows the result by that function's identity. StreamPass used to replace the function for
    good, so dynamo stopped on "torch.* op returned non-Tensor ... CpuEvent" at the first
    ``record_event()``, inside an ``enabled()`` block and in any plain compile after one."""
    x = torch.randn(4, 4)
    x_e, x_c = x.clone().requires_grad_(training), x.clone().requires_grad_(training)
    want = events_from_record_event(x_e)
    p = spi.StreamPass(keep_graphs=True)
    before = sum(spi.RUNTIME_SYNCS.values())
    with spi.enabled(p):
        got = torch.compile(events_from_record_event, fullgraph=True)(x_c)
    ran = sum(spi.RUNTIME_SYNCS.values()) - before
    torch.testing.assert_close(got, want)
    if training:
        got.sum().backward()  # after the block, as a training loop does
        want.sum().backward()
        torch.testing.assert_close(x_c.grad, x_e.grad)
    assert [r.graph for r in p.reports] == (["forward", "backward"] if training else ["inference"])
    assert all(sp.verify(r.verified_graph, r.external_events).ok for r in p.reports)
    forward = p.reports[0].verified_graph
    # the program's own records, kept (torch 2.11 runs Stream methods while tracing: no ops)
    assert len([e for e in _event_records(forward) if e < EVENT_BASE]) == RECORDS
    assert ran >= planned_syncs(forward)

    traced = []

    def capture(gm, example_inputs):
        traced.append([n.target for n in gm.graph.nodes])
        raise _Traced  # a CPU graph cannot record dynamo's real event: tracing is the point

    torch._dynamo.reset()
    with pytest.raises(Exception, match="_Traced"):
        torch.compile(events_from_record_event, backend=capture, fullgraph=True)(x.clone())
    assert [t.count(torch.ops.streams.record_event) for t in traced] == [RECORDS]

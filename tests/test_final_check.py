"""run's final check: the region check (the edit's own reading, the touched nodes re-read) must
agree with the full re-read, on every graph, and fail where the full one fails."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_properties import SETTINGS, graphs

import streampass as sp
from streampass import ops
from streampass.errors import StreamPassError
from streampass.synthetic import random_stream_graph
from streampass.transform import pipeline
from streampass.transform.reading_after import check_region

from graphs import wrap_syncs_in_control_deps


def same_reading(kept: sp.StreamAssignment, fresh: sp.StreamAssignment) -> None:
    """Every field of the two readings, compared by node identity."""
    assert kept.nodes == fresh.nodes
    assert kept.stream == fresh.stream
    assert kept.root == fresh.root
    assert kept.position == fresh.position
    assert kept.compute == fresh.compute
    assert kept.producer == fresh.producer
    assert kept.named == fresh.named
    assert kept.external_events == fresh.external_events
    assert kept.syncs.keys() == fresh.syncs.keys()
    for n, call in fresh.syncs.items():
        mine = kept.syncs[n]
        assert (mine.target, mine.args, mine.node, mine.wrapper) == (call.target, call.args, call.node, call.wrapper)


@SETTINGS
@given(gm=graphs, wrapped=st.booleans())
def test_the_kept_reading_is_a_fresh_reading_and_both_checks_agree(gm, wrapped):
    switches = any(n.target in (ops.FORK, ops.JOIN) for n in gm.graph.nodes)
    if wrapped and not switches:
        # existing syncs in control_deps, as aot_autograd leaves them (it never has fork/join:
        # on torch 2.11 the stand-in wrapper would make one fork/join depend on another)
        wrap_syncs_in_control_deps(gm)
    full_gm = copy.deepcopy(gm)
    region = sp.run(gm)  # the default: check="region"
    full = sp.run(full_gm, check="full")
    assert region.after.hazards == full.after.hazards == []
    assert region.after.streams == full.after.streams
    assert (region.records_added, region.waits_added) == (full.records_added, full.waits_added)
    if region.changed:
        same_reading(region.assignment, sp.read_streams(gm))


@pytest.mark.parametrize("seed", range(6))
def test_a_plan_missing_a_wait_fails_both_checks_alike(monkeypatch, seed):
    """The region check finds what the full re-read finds when the edit is wrong."""
    real = pipeline.plan_syncs

    def drop_one_wait(a, reqs=None, min_event=0):
        plan = real(a, reqs=reqs, min_event=min_event)
        victim = plan.waits[seed % len(plan.waits)]
        plan.waits.remove(victim)
        for r in plan.records:
            if r.existing is None and all(w.record is not r for w in plan.waits):
                plan.records.remove(r)
        plan.protect.pop(victim, None)
        plan.keepalive.pop(victim, None)
        return plan

    monkeypatch.setattr(pipeline, "plan_syncs", drop_one_wait)
    gm = random_stream_graph(120, 3, seed=seed)
    full_gm = copy.deepcopy(gm)
    region, full = sp.run(gm), sp.run(full_gm, check="full")
    assert not full.ok
    # the same races, named by the same nodes (the two graphs are copies: compare names)
    assert [(h.kind, h.nodes) for h in region.after.hazards] == [(h.kind, h.nodes) for h in full.after.hazards]


def test_an_edit_the_bookkeeping_does_not_know_is_an_internal_error():
    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + x.cos()

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.ones(4))
    result = sp.run(gm)
    kept = result.assignment
    cos = next(n for n in gm.graph.nodes if n.name == "cos")
    cos.meta["custom"] = {"stream": 1}  # what a wrong edit would leave: cos annotated off its stream
    with pytest.raises(StreamPassError, match="cos is annotated 1, planned 0"):
        check_region(kept, [cos])
    check_region(kept, [n for n in gm.graph.nodes if n is not cos])


def test_check_takes_only_its_modes():
    gm = random_stream_graph(20, 2, seed=1)
    before = copy.deepcopy(gm.graph)
    with pytest.raises(StreamPassError, match="region"):
        sp.run(gm, check="fast")
    assert str(gm.graph) == str(before)

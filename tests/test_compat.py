"""One test per difference streampass.compat papers over, on whichever torch runs the suite.

Each test states what this torch does and that streampass gets the same result either way, so
a torch that changes behaviour fails here first (docs/versions.md has the table)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._inductor.fx_passes.control_dependencies import control_deps

import streampass as sp
import streampass.inductor as spi
from streampass import compat, ops, runtime
from streampass.compat import post_grad_config

from reference import TORCH

pytestmark = pytest.mark.usefixtures("fresh_caches")


class _Keep(compat.PassBase):
    """A post-grad pass that keeps each outer graph it is given, and what inductor passed."""

    def __init__(self):
        self.graphs, self.calls = [], []

    def __call__(self, graph, *args, **kwargs):
        self.calls.append((args, kwargs))
        if not ops.is_sync_subgraph(graph):
            self.graphs.append(torch.fx.GraphModule(graph.owning_module, copy.deepcopy(graph)))

    def uuid(self):
        return b"keep"


def _sin_on_side_stream(x):
    with sp.stream(1):
        y = x.sin()
    return y + 1


def test_post_grad_passes_list_or_chain_and_graph_kind():
    """torch >= 2.13 takes a list of post-grad passes and tells them ``is_inference``; 2.11 and
    2.12 take one pass and call it with the graph alone. Either way each pass runs once per graph,
    and StreamPass names forward and backward right."""
    assert (TORCH >= (2, 13)) == compat.POST_GRAD_TAKES_LISTS
    keep, p = _Keep(), spi.StreamPass()
    config = post_grad_config([keep, p])
    assert isinstance(config, list) == compat.POST_GRAD_TAKES_LISTS
    x = torch.randn(4, requires_grad=True)
    with inductor_config.patch(post_grad_custom_post_pass=config), spi.cpu_safe_aot_stream_passes():
        torch.compile(_sin_on_side_stream)(x).sum().backward()
    assert [r.graph for r in p.reports] == ["forward", "backward"]
    told = ["is_inference" in kw or len(a) == 1 for a, kw in keep.calls]
    assert len(told) == 2 and (all(told) if compat.POST_GRAD_TAKES_LISTS else not any(told))


def test_object_table_is_read_as_dict_or_list():
    """dynamo's object table is a dict up to torch 2.14 and a list from 2.15."""
    from torch._dynamo import graph_bytecode_inputs as table

    entries = table.index_to_external_object_weakref
    assert isinstance(entries, dict) == (TORCH < (2, 15))
    s = torch.Stream("cpu")
    table.store_user_object_weakrefs(s)
    try:
        assert compat.registered_object(0) is s and compat.registered_object(1) is None
    finally:
        table.reset_user_object_tracking()


def test_aot_backward_reads_the_live_object_table():
    """torch 2.15 rebinds the table to a new list on every compiled call, while AOT autograd's
    backward snapshots the list it imported by name: compat keeps them one list (without it,
    tests/test_compile_use.py run alone on 2.15 failed three training cases with "Index past
    the end of index_to_user_object_weakref")."""
    from torch._dynamo import graph_bytecode_inputs as table
    from torch._functorch._aot_autograd import runtime_wrappers

    s, e = torch.Stream("cpu"), torch.Event("cpu")
    table.store_user_object_weakrefs(s, e)  # what dynamo's prologue does on each call
    try:
        live = table.index_to_external_object_weakref
        assert [r() for r in (live.values() if isinstance(live, dict) else live)] == [s, e]
        if hasattr(runtime_wrappers, "index_to_external_object_weakref"):  # 2.15 on
            assert runtime_wrappers.index_to_external_object_weakref is live
    finally:
        table.reset_user_object_tracking()


def test_synchronize_ops_exist_from_2_12():
    """torch 2.11 has no ``synchronize_*`` stream ops; streampass's stand-ins are never a target."""
    for target in (ops.SYNC_STREAM, ops.SYNC_EVENT, ops.SYNC_DEVICE):
        assert ops.exists(target) == (TORCH >= (2, 12))
        assert (target in ops.SYNC_TARGETS) == ops.exists(target)
    assert (TORCH >= (2, 12)) == compat.STREAM_METHODS_ARE_OPS


def _synchronize_program(x):
    s = torch.Stream("cpu")
    y = x + 1
    s.synchronize()
    return y * 2


def test_stream_methods_reach_post_grad_passes_from_2_12():
    """``Stream.synchronize()`` reaches a post-grad pass as a stream op on torch >= 2.12; on
    2.11 dynamo records a method call that AOT autograd runs while tracing, so no pass sees it.
    The program's result is the same either way."""
    keep = _Keep()
    # (StreamPass after it: torch 2.13's CPU code for a synchronize alone does not run)
    with inductor_config.patch(post_grad_custom_post_pass=post_grad_config([keep, spi.StreamPass()])):
        out = torch.compile(_synchronize_program)(torch.ones(3))
    torch.testing.assert_close(out, _synchronize_program(torch.ones(3)))
    (gm,) = keep.graphs
    syncs = [c.name for c in sp.read_streams(gm).syncs.values()]
    assert syncs == (["synchronize_stream"] if compat.STREAM_METHODS_ARE_OPS else [])


def _graph_with_a_dead_wait():
    """A run graph whose last wait nothing reads: the output reads its value directly again (as
    a graph another tool wrote, or one run before the output read through its last sync)."""
    gm = torch.fx.experimental.proxy_tensor.make_fx(_sin_on_side_stream)(torch.ones(3))
    sp.run(gm)
    out = next(iter(gm.graph.find_nodes(op="output")))
    for x in out.all_input_nodes:
        source = ops.passthrough_source(x)
        if source is not None and len(x.args[0].users) == 1:
            out.replace_input_with(x, source)
            gm.graph.erase_node(x)
    gm.recompile()
    return gm


def test_control_deps_is_kept_by_dead_code_elimination():
    """torch 2.13 keeps a ``control_deps`` nothing reads through FX's dead-code elimination; 2.11
    would drop it (compat gives it the 2.13 rule)."""
    gm = _graph_with_a_dead_wait()
    dead = [n for n in gm.graph.nodes if n.target is control_deps and not n.users]
    assert dead, "the free-point wait at the end of the graph has no users"
    assert all(n.is_impure() for n in dead)
    count = len(list(gm.graph.nodes))
    gm.graph.eliminate_dead_code()
    assert len(list(gm.graph.nodes)) == count and sp.verify(gm).ok


def test_control_deps_runs_eagerly():
    """torch 2.11's ``control_deps`` has only a fake kernel; compat adds the eager ones 2.13 has."""
    gm = _graph_with_a_dead_wait()
    torch.testing.assert_close(gm(torch.ones(3)), _sin_on_side_stream(torch.ones(3)))
    x = torch.ones(3, requires_grad=True)
    gm(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3).cos())


def test_noop_stream_records_a_noop_event():
    """torch's ``Stream.record_event`` refuses an Event subclass (all versions) and a CPU
    stream cannot record; a NoOpStream records its own NoOpEvent."""
    stream, event = runtime.NoOpStream("cpu"), runtime.NoOpEvent("cpu")
    with pytest.raises(RuntimeError):
        torch.Stream("cpu").record_event(event)
    assert stream.record_event(event) is event
    assert isinstance(stream.record_event(), runtime.NoOpEvent)

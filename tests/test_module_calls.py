"""Property tests over random ``symbolic_trace``-style graphs: submodule calls that read their
parameters and update their buffers without taking them as arguments, tensor methods, in-place
writes of a module's weight through ``get_attr``, batch norm ops given a module's running
statistics, on random streams (issue 12)."""

from __future__ import annotations

import copy
import operator
import random

import torch
import torch.fx
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streampass as sp
from streampass.analysis.capture import unjoined

from reorder import random_topological_copy


class Pool(torch.nn.Module):
    """The modules a program calls: two linears, a batch norm that trains, an in-place relu."""

    def __init__(self):
        super().__init__()
        self.lin0 = torch.nn.Linear(4, 4)
        self.lin1 = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.relu = torch.nn.ReLU(inplace=True)


def module_program(seed: int, n_steps: int, n_streams: int) -> tuple[torch.fx.GraphModule, list[tuple]]:
    """A random program over :class:`Pool` and what each step touches of the modules' state:
    ``(node, module, writes its state)`` for every call of a module or write of its weight."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    pool = Pool()
    pool.bn.train(rng.random() < 0.7)  # evaluating, it only reads its running statistics
    g = torch.fx.Graph()
    vals = [g.placeholder("x")]
    touches = []
    for _ in range(n_steps):
        kind = rng.choice(["lin", "lin", "bn", "bn_op", "method", "relu", "scale", "add"])
        x = rng.choice(vals)
        if kind == "lin":
            name = rng.choice(["lin0", "lin1"])
            node = g.call_module(name, (x,))
            touches.append((node, name, False))
        elif kind == "bn":
            node = g.call_module("bn", (x,))
            touches.append((node, "bn", pool.bn.training))
        elif kind == "bn_op":  # the batch norm's statistics given to an op with no (a!) to say it writes them
            stats = (g.get_attr("bn.running_mean"), g.get_attr("bn.running_var"))
            if rng.random() < 0.5:  # as symbolic_trace records F.batch_norm
                node = g.call_function(F.batch_norm, (x, *stats), {"training": pool.bn.training})
            else:  # as make_fx or torch.export record it
                bn = g.call_function(
                    torch.ops.aten.native_batch_norm.default, (x, None, None, *stats, pool.bn.training, 0.1, 1e-5)
                )
                node = g.call_function(operator.getitem, (bn, 0))
                touches.append((bn, "bn", pool.bn.training))
            touches.append((node, "bn", pool.bn.training))
        elif kind == "method":
            node = g.call_method(rng.choice(["sin", "cos"]), (x,))
        elif kind == "relu":
            node = g.call_module("relu", (g.call_method("clone", (x,)),))
        elif kind == "scale":  # self.linK.weight.mul_(0.5), as symbolic_trace records it
            name = rng.choice(["lin0", "lin1"])
            node = g.call_method("mul_", (g.get_attr(f"{name}.weight"), 0.5))
            touches.append((node, name, True))
        else:
            node = g.call_function(torch.add, (x, rng.choice(vals)))
        if kind != "scale":
            vals.append(node)
    g.output(tuple(vals[1:]) or (vals[0],))
    for n in g.nodes:
        if n.op in ("call_module", "call_method", "call_function") and rng.random() < 0.7:
            n.meta["custom"] = {"stream": rng.randrange(n_streams)}
    return torch.fx.GraphModule(pool, g), touches


def _results(gm, x) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    with torch.no_grad():
        out = gm(x.clone())
    state = {k: t.detach().clone() for k, t in (*gm.named_parameters(), *gm.named_buffers())}
    return [t.clone() for t in out], state


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n_steps=st.integers(2, 14), n_streams=st.integers(2, 4))
def test_module_state_is_ordered_across_streams_under_any_order(seed, n_steps, n_streams):
    check_program(seed, n_steps, n_streams)


def test_a_module_call_whose_argument_was_issued_after_the_wait_is_ordered_by_its_input():
    """bn_2 (stream 1) writes the batch norm's statistics after bn_1 (stream 0). Its one argument,
    lin1, came after stream 1's wait for bn_1 in graph order but was not ordered after it by any
    data edge, so a reorder moved bn_2 before the wait (found by the property above). lin1's own
    input now carries the wait."""
    check_program(35, 12, 2)


def check_program(seed: int, n_steps: int, n_streams: int) -> None:
    gm, touches = module_program(seed, n_steps, n_streams)
    x = torch.randn(3, 4)
    want = _results(copy.deepcopy(gm), x)
    result = sp.run(gm)
    assert result.ok, result.after
    assert unjoined(gm) == []
    # Independent of streampass's reading: every two accesses to one module's state on
    # different streams, one of them a write, are ordered by the syncs (happens-before).
    dag = sp.StreamDAG.from_graph(gm)
    for i, (a, mod_a, write_a) in enumerate(touches):
        for b, mod_b, write_b in touches[i + 1 :]:
            if mod_a == mod_b and (write_a or write_b) and dag.stream_of(a.name) != dag.stream_of(b.name):
                assert dag.happens_before(a.name, b.name), (a.name, b.name)
    torch.testing.assert_close(_results(copy.deepcopy(gm), x), want)
    for k in range(6):
        moved = random_topological_copy(copy.deepcopy(gm), seed * 7 + k)
        report = sp.verify(moved)
        assert report.ok, report
        with sp.runtime.bind(moved):  # a copy built from the graph: no hooks of its own to bind its table
            torch.testing.assert_close(_results(moved, x), want)
    assert not sp.run(gm).changed

"""Tests for streampass.sim.cost: roofline node times on FX graphs."""

from __future__ import annotations

import dataclasses
import doctest
import operator

import pytest
import torch
import torch._dynamo.variables.streams
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import streampass.sim.cost as cost_mod
from streampass import ops
from streampass.sim.cost import PROFILES, CostModel, DeviceProfile

aten = torch.ops.aten
streams = torch.ops.streams
H100 = PROFILES["h100"]
LAUNCH = H100.launch_overhead


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def op_node(target, *arg_vals, out=None, graph=None, kwargs=None):
    """A graph with one placeholder per tensor arg and one call of ``target``.

    Returns the call node. ``out`` becomes its meta["val"] (omitted if None).
    """
    g = graph if graph is not None else torch.fx.Graph()
    args = []
    for i, v in enumerate(arg_vals):
        if isinstance(v, torch.Tensor):
            p = g.placeholder(f"in{i}")
            p.meta["val"] = v
            args.append(p)
        else:
            args.append(v)
    node = g.call_function(target, tuple(args), kwargs or {})
    if out is not None:
        node.meta["val"] = out
    return node


def mm_node(m, k, n, dtype=torch.bfloat16):
    return op_node(aten.mm.default, meta(m, k, dtype=dtype), meta(k, n, dtype=dtype), out=meta(m, n, dtype=dtype))


def close(a, b, rel=0.01):
    return a == pytest.approx(b, rel=rel)


# -- roofline ---------------------------------------------------------------


def test_mm_compute_bound_bf16_matches_hand_computation():
    m, k, n = 8192, 8192, 8192
    t = CostModel("h100").node_time(mm_node(m, k, n))
    expected = 2 * m * k * n / 989e12 + 5e-6
    assert close(t, expected)
    # and it really is compute-bound: the memory term is far smaller
    assert 3 * m * n * 2 / 3.35e12 < 0.2 * expected


def test_mm_fp32_uses_fp32_peak():
    m, k, n = 4096, 8192, 2048
    t = CostModel("h100").node_time(mm_node(m, k, n, dtype=torch.float32))
    assert close(t, 2 * m * k * n / 67e12 + 5e-6)


def test_addmm_and_bmm_use_flop_formulas():
    b, m, k, n = 8, 2048, 2048, 2048
    dt = torch.bfloat16
    node = op_node(aten.bmm.default, meta(b, m, k, dtype=dt), meta(b, k, n, dtype=dt), out=meta(b, m, n, dtype=dt))
    assert close(CostModel("h100").node_time(node), 2 * b * m * k * n / 989e12 + LAUNCH)
    node = op_node(
        aten.addmm.default, meta(n, dtype=dt), meta(m, k, dtype=dt), meta(k, n, dtype=dt), out=meta(m, n, dtype=dt)
    )
    assert close(CostModel("h100").node_time(node), 2 * m * k * n / 989e12 + LAUNCH)


def test_elementwise_add_is_bandwidth_bound():
    numel = 1 << 26
    node = op_node(aten.add.Tensor, meta(numel), meta(numel), out=meta(numel))
    t = CostModel("h100").node_time(node)
    assert close(t, 3 * numel * 4 / 3.35e12 + 5e-6)
    # h200 has the same compute but more bandwidth: strictly faster here
    assert CostModel("h200").node_time(node) < t
    assert close(CostModel("h200").node_time(node), 3 * numel * 4 / 4.8e12 + 5e-6)


def test_same_input_twice_is_read_once():
    numel = 1 << 24
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = meta(numel)
    node = g.call_function(aten.add.Tensor, (x, x))
    node.meta["val"] = meta(numel)
    assert close(CostModel("h100").node_time(node), 2 * numel * 4 / 3.35e12 + LAUNCH)


def test_node_times_tells_apart_what_node_time_does():
    """node_times shares what each value covers among its readers: every node must still get
    exactly node_time's estimate (x + x against x + y of the same shapes, a broadcast input,
    a transposed view, a symbolic size)."""

    def f(x, y, w, b):
        h = x + x
        k = x + y
        z = (h @ w).relu() + (k @ w).relu()  # the same shapes twice
        v = z + b  # broadcast
        return v.sum(0) + (x.t() @ y).sum(1), (x.sin() @ w.t()).sum()

    args = [meta(64, 32), meta(64, 32), meta(32, 32), meta(32)]
    graphs = [make_fx(f)(*args)]
    graphs.append(make_fx(f, tracing_mode="symbolic")(*[torch.randn(t.shape) for t in args]))
    for gm in graphs:
        model = CostModel("h100")
        nodes = list(gm.graph.nodes)
        assert model.node_times(nodes) == {n: model.node_time(n) for n in nodes}
    adds = [n for n in graphs[0].graph.nodes if n.target is aten.add.Tensor][:2]
    once, twice = (CostModel("h100").node_times([n])[n] for n in adds)
    assert once < twice  # x + x reads x once; x + y reads both


def test_broadcast_input_counts_its_memory_not_its_numel():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = meta(4096, 4096)
    bias = g.placeholder("bias")
    bias.meta["val"] = meta(4096).expand(4096, 4096)  # stride 0 on dim 0
    node = g.call_function(aten.add.Tensor, (x, bias))
    node.meta["val"] = meta(4096, 4096)
    expected = (2 * 4096 * 4096 + 4096) * 4 / 3.35e12 + LAUNCH
    assert close(CostModel("h100").node_time(node), expected)


@pytest.mark.parametrize("m", [1024, 2048, 4096])
def test_doubling_m_doubles_mm_time(m):
    model = CostModel("h100")
    t1 = model.node_time(mm_node(m, 8192, 8192)) - LAUNCH
    t2 = model.node_time(mm_node(2 * m, 8192, 8192)) - LAUNCH
    assert close(t2, 2 * t1)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 1 << 14),
    k=st.integers(1, 1 << 12),
    n=st.integers(1, 1 << 12),
    profile=st.sampled_from(sorted(PROFILES)),
)
def test_mm_time_is_monotonic_in_every_dimension(m, k, n, profile):
    model = CostModel(profile)
    t = model.node_time(mm_node(m, k, n))
    assert t >= model.profile.launch_overhead
    assert model.node_time(mm_node(m + 1, k, n)) >= t
    assert model.node_time(mm_node(m, k + 1, n)) >= t
    assert model.node_time(mm_node(m, k, n + 1)) >= t


def test_conv_uses_flop_formula():
    # N=32, C=256 -> 256, 3x3, 56x56, bf16: 2 * N*Cout*H*W * Cin*kh*kw flops
    dt = torch.bfloat16
    x, w = meta(32, 256, 56, 56, dtype=dt), meta(256, 256, 3, 3, dtype=dt)
    node = op_node(
        aten.convolution.default,
        x,
        w,
        None,
        [1, 1],
        [1, 1],
        [1, 1],
        False,
        [0, 0],
        1,
        out=meta(32, 256, 56, 56, dtype=dt),
    )
    flops = 2 * 32 * 256 * 56 * 56 * 256 * 9
    assert close(CostModel("a100").node_time(node), flops / 312e12 + 5e-6)


# -- zero-cost and sync nodes -----------------------------------------------


def test_view_ops_cost_zero_in_traced_graph():
    def f(x):
        a = x.view(16, 64).t().transpose(0, 1).permute(1, 0)
        s = a.unsqueeze(0).squeeze(0)[2:10][0].expand(3, 16)
        return torch.ops.aten.alias(s.reshape(48)).detach().relu()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(32, 32))
    times = CostModel("h100").graph_times(gm)
    # by op, not node name: make_fx traces .detach() as aten.detach up to torch 2.13 and as
    # aten.alias from 2.14 on
    ops_of = {n.name: n.target._opname for n in gm.graph.nodes if n.op == "call_function"}
    views = {
        "view",
        "t",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "slice",
        "select",
        "expand",
        "_unsafe_view",
        "alias",
    }
    assert views <= set(ops_of.values()), sorted(ops_of.values())
    assert sum(op in ("alias", "detach") for op in ops_of.values()) == 2  # alias(...) and .detach()
    for name, op in ops_of.items():
        if op in views or op == "detach":
            assert times[name] == 0.0, name
    # placeholders and output are free; real kernels are not
    assert times["x_1"] == 0.0 and times["output"] == 0.0
    assert times["relu"] > LAUNCH
    assert times["clone"] > LAUNCH  # reshape of a non-contiguous view copies


def test_getitem_costs_zero():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = meta(8, 8)
    sp = g.call_function(aten.split.Tensor, (x, 4))
    sp.meta["val"] = (meta(4, 8), meta(4, 8))
    item = g.call_function(operator.getitem, (sp, 0))
    item.meta["val"] = meta(4, 8)
    model = CostModel("h100")
    assert model.node_time(item) == 0.0
    assert model.node_time(sp) == 0.0


SYNC_CALLS = [
    (target, args)
    for target, args in [
        (ops.RECORD_EVENT, (0, 1)),
        (ops.WAIT_EVENT, (0, 1)),
        (ops.WAIT_STREAM, (1, 0)),
        (ops.FORK, (0, 1)),
        (ops.JOIN, (1, 0)),
        (ops.SYNC_DEVICE, ()),
    ]
    if ops.exists(target)  # torch 2.11 has no synchronize_* ops
]


@pytest.mark.parametrize("profile", ["h100", "a100"])
@pytest.mark.parametrize("target,args", SYNC_CALLS, ids=lambda v: str(v))
def test_stream_ops_cost_sync_cost(profile, target, args):
    g = torch.fx.Graph()
    node = g.call_function(target, args)
    assert CostModel(profile).node_time(node) == PROFILES[profile].sync_cost


def test_stream_ops_with_tensor_args_cost_sync_cost():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = meta(1 << 26)  # a large tensor must not add memory time
    rs = g.call_function(streams.record_stream.default, (x, 1))
    sd = g.call_function(streams.sync_dealloc.default, (0, 1, x))
    packet = g.call_function(streams.wait_event, (0, 1))  # an overload packet target
    model = CostModel("h100")
    for node in (rs, sd, packet):
        assert model.node_time(node) == 2e-6


def _control_deps_graph(wrapped):
    """A GraphModule with an mm and a record_event; ``wrapped`` picks which one
    inductor's preserve_node_ordering wraps in control_deps."""
    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    g = gm.graph
    a, b = g.placeholder("a"), g.placeholder("b")
    a.meta["val"] = meta(4096, 4096, dtype=torch.bfloat16)
    b.meta["val"] = meta(4096, 4096, dtype=torch.bfloat16)
    mm = g.call_function(aten.mm.default, (a, b))
    mm.meta["val"] = meta(4096, 4096, dtype=torch.bfloat16)
    rec = g.call_function(streams.record_event.default, (0, 0))
    rec.meta["val"] = None
    g.output(mm)
    dep, node = (mm, rec) if wrapped == "record" else (rec, mm)
    name = node.name
    preserve_node_ordering(g, {node: OrderedSet([dep])})
    gm.recompile()
    return gm, name


def test_control_deps_wrapping_sync_op_costs_sync_cost():
    from torch._inductor.fx_passes.control_dependencies import control_deps

    gm, name = _control_deps_graph("record")
    (node,) = [n for n in gm.graph.nodes if n.target is control_deps]
    assert node.name == name
    assert CostModel("h100").node_time(node) == 2e-6


def test_control_deps_wrapping_compute_costs_the_compute():
    from torch._inductor.fx_passes.control_dependencies import control_deps

    gm, name = _control_deps_graph("mm")
    (node,) = [n for n in gm.graph.nodes if n.target is control_deps]
    assert node.name == name
    assert close(CostModel("h100").node_time(node), 2 * 4096**3 / 989e12 + LAUNCH)


def test_control_deps_with_unresolvable_subgraph_costs_sync_cost():
    from torch._inductor.fx_passes.control_dependencies import control_deps

    g = torch.fx.Graph()  # no owning module: the get_attr can't be resolved
    sub = g.get_attr("subgraph_missing")
    node = g.call_function(control_deps, ((), sub))
    assert CostModel("a100").node_time(node) == 2e-6


# -- overrides --------------------------------------------------------------


def test_override_by_dict():
    node = mm_node(1024, 1024, 1024)
    model = CostModel("h100", overrides={node.name: 0.5, "unrelated": 9.0})
    assert model.node_time(node) == 0.5
    other = op_node(aten.relu.default, meta(10), out=meta(10))
    assert model.node_time(other) == CostModel("h100").node_time(other)


def test_override_by_callable_with_none_meaning_no_override():
    def override(node):
        return 1e-3 if node.target is aten.mm.default else None

    model = CostModel("h100", overrides=override)
    gm = make_fx(lambda a, b: (a @ b).relu(), tracing_mode="fake")(torch.randn(64, 64), torch.randn(64, 64))
    times = model.graph_times(gm)
    assert times["mm"] == 1e-3
    assert times["relu"] == CostModel("h100").graph_times(gm)["relu"]
    assert times["a_1"] == 0.0


def test_override_beats_zero_cost_and_sync_rules():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    rec = g.call_function(streams.record_event.default, (0, 1))
    model = CostModel("h100", overrides={x.name: 1.0, rec.name: 2.0})
    assert model.node_time(x) == 1.0
    assert model.node_time(rec) == 2.0


# -- tracing front ends and metadata forms ----------------------------------


def test_make_fx_fake_graph():
    def f(a, b):
        return torch.relu(a @ b) + 1

    m, k, n = 2048, 4096, 1024
    gm = make_fx(f, tracing_mode="fake")(torch.randn(m, k), torch.randn(k, n))
    times = CostModel("h100").graph_times(gm)
    assert list(times) == [node.name for node in gm.graph.nodes]
    assert close(times["mm"], 2 * m * k * n / 67e12 + LAUNCH)
    assert close(times["relu"], 2 * m * n * 4 / 3.35e12 + LAUNCH)
    assert close(times["add"], 2 * m * n * 4 / 3.35e12 + LAUNCH)  # scalar other: no bytes


def test_make_fx_on_meta_device_inputs():
    gm = make_fx(lambda a, b: a @ b)(meta(512, 512), meta(512, 512))
    t = CostModel("h100").graph_times(gm)["mm"]
    assert close(t, max(2 * 512**3 / 67e12, 3 * 512 * 512 * 4 / 3.35e12) + LAUNCH)


def test_make_fx_symbolic_shapes_use_hints():
    gm = make_fx(lambda a, b: a @ b, tracing_mode="symbolic")(torch.randn(1024, 2048), torch.randn(2048, 4096))
    val = next(n for n in gm.graph.nodes if n.name == "mm").meta["val"]
    assert isinstance(val.shape[0], torch.SymInt)
    shape_env = val.shape[0].node.shape_env
    n_guards = len(shape_env.guards)
    t = CostModel("h100").graph_times(gm)["mm"]
    assert close(t, 2 * 1024 * 2048 * 4096 / 67e12 + LAUNCH)
    assert len(shape_env.guards) == n_guards  # costing adds no guards


def test_plain_meta_tensors_and_real_tensors_agree():
    m = 1024
    a = op_node(aten.mm.default, meta(m, m), meta(m, m), out=meta(m, m))
    b = op_node(aten.mm.default, torch.empty(m, m), torch.empty(m, m), out=torch.empty(m, m))
    model = CostModel("a100")
    assert model.node_time(a) == model.node_time(b)


def test_tensor_meta_only():
    m, k, n = 256, 512, 128
    gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(m, k), torch.randn(k, n))
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    node = next(x for x in gm.graph.nodes if x.name == "mm")
    assert "tensor_meta" in node.meta
    flops, bytes_ = 2 * m * k * n, (m * k + k * n + m * n) * 4
    assert close(CostModel("cpu").node_time(node), max(flops / 1e12, bytes_ / 50e9) + 1e-6)


def test_shape_prop_tensor_meta_on_torch_function_targets():
    from torch.fx.passes.shape_prop import ShapeProp

    gm = torch.fx.symbolic_trace(lambda a, b: torch.mm(a, b))
    ShapeProp(gm).propagate(torch.randn(256, 512), torch.randn(512, 128))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert "val" not in node.meta and "tensor_meta" in node.meta
    # torch.mm (not aten.mm) has no registered flop formula: memory term only
    bytes_ = (256 * 512 + 512 * 128 + 256 * 128) * 4
    assert close(CostModel("cpu").node_time(node), bytes_ / 50e9 + 1e-6)


# -- robustness -------------------------------------------------------------


def test_missing_meta_falls_back_to_launch_overhead():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    times = CostModel("h100").graph_times(gm)
    assert times == {"x": 0.0, "relu": LAUNCH, "add": LAUNCH, "output": 0.0}


def test_call_module_and_call_method_without_meta():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    g = gm.graph
    with g.inserting_before(next(iter(reversed(g.nodes)))):
        method = g.call_method("sum", (next(iter(g.nodes)),))
    model = CostModel("h100")
    times = model.graph_times(gm)
    assert times["_0"] == LAUNCH
    assert model.node_time(method) == LAUNCH


@pytest.mark.parametrize(
    "dtype", [torch.complex64, torch.bool, torch.uint16, torch.float8_e5m2, torch.int64, torch.bits8]
)
def test_unusual_dtypes_do_not_raise(dtype):
    node = op_node(aten.add.Tensor, meta(1024, dtype=dtype), meta(1024, dtype=dtype), out=meta(1024, dtype=dtype))
    for name in PROFILES:
        t = CostModel(name).node_time(node)
        assert t >= PROFILES[name].launch_overhead


def test_mm_in_unlisted_dtype_uses_default_rate():
    node = mm_node(4096, 4096, 4096, dtype=torch.int32)
    assert close(CostModel("h100").node_time(node), 2 * 4096**3 / 67e12 + LAUNCH)


def test_odd_meta_values_do_not_raise():
    model = CostModel("h100")
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = "not a tensor"
    weird = g.call_function(aten.relu.default, (x,))
    weird.meta["val"] = object()
    assert model.node_time(weird) == 0.0  # no tensors anywhere: host-side
    # a formula that can't run on these args falls back to the memory term
    bad = op_node(aten.mm.default, meta(4, 4), out=meta(4, 4))
    assert close(model.node_time(bad), 2 * 16 * 4 / 3.35e12 + LAUNCH)
    half = g.call_function(aten.relu.default, (x,))
    half.meta["val"] = meta(2, 2)  # input unknown, output known
    assert close(model.node_time(half), 16 / 3.35e12 + LAUNCH)


def test_symint_arithmetic_costs_zero():
    gm = make_fx(lambda a: a.view(-1) * (a.shape[0] * a.shape[1]), tracing_mode="symbolic")(torch.randn(8, 4))
    times = CostModel("h100").graph_times(gm)
    sym = [n for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.SymInt)]
    assert {n.target for n in sym} == {aten.sym_size.int, operator.mul}, gm.graph
    for n in sym:
        assert times[n.name] == 0.0


# -- profiles ---------------------------------------------------------------


def test_builtin_profile_numbers():
    h100, h200, a100 = PROFILES["h100"], PROFILES["h200"], PROFILES["a100"]
    assert h100.flops_for(torch.bfloat16) == 989e12 == h200.flops_for(torch.bfloat16)
    assert h100.flops_for(torch.float32) == 67e12 == h200.flops_for(torch.float32)
    assert a100.flops_for(torch.bfloat16) == 312e12
    assert a100.flops_for(torch.float32) == 19.5e12
    assert (h100.mem_bandwidth, h200.mem_bandwidth) == (3.35e12, 4.8e12)
    assert a100.mem_bandwidth == pytest.approx(2.0e12, rel=0.05)
    for p in (h100, h200, a100):
        assert p.launch_overhead == 5e-6 and p.sync_cost == 2e-6
    assert set(PROFILES) == {"h100", "h200", "a100", "cpu"}


def test_device_profile_is_frozen_and_hashable():
    p = PROFILES["h100"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.mem_bandwidth = 1.0
    with pytest.raises(TypeError):
        p.peak_flops[torch.float32] = 1.0
    assert hash(p) == hash(PROFILES["h100"])
    assert {p: 1}[p] == 1


def test_custom_profile_and_fallbacks():
    p = DeviceProfile(
        "toy", {torch.float16: 8e12, torch.float32: 2e12}, mem_bandwidth=1e9, launch_overhead=0.0, sync_cost=1.0
    )
    assert p.flops_for(torch.int8) == 2e12  # no "default": float32 rate
    assert DeviceProfile("x", {torch.float16: 8e12}, 1.0).flops_for(None) == 8e12
    node = mm_node(100, 100, 100, dtype=torch.float16)
    assert close(CostModel(p).node_time(node), max(2e6 / 8e12, 3e4 * 2 / 1e9))
    with pytest.raises(ValueError):
        DeviceProfile("empty", {}, 1.0)


def test_unknown_profile_name_raises():
    with pytest.raises(ValueError, match="h900"):
        CostModel("h900")


def test_docstring_examples_run():
    result = doctest.testmod(cost_mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 6
    assert result.failed == 0

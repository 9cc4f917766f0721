"""Per-node time estimates for aten-level FX graphs.

A node's time is a roofline estimate plus a fixed kernel launch overhead::

    time = max(flops / peak_flops[dtype], bytes / mem_bandwidth) + launch_overhead

FLOPs come from the formulas registered in ``torch.utils.flop_counter.flop_registry``
(matmuls, convolutions, attention), called on the shapes found in ``node.meta["val"]``;
the op itself is never run. Bytes are the sizes of the distinct input tensors plus
the output tensors. Only shapes, strides and dtypes are read, so fake, meta and real
tensors all work. See ``docs/cost_model.md`` for the numbers and the limits.

>>> import torch
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> gm = make_fx(lambda a, b: a @ b, tracing_mode="fake")(
...     torch.empty(4096, 4096, dtype=torch.bfloat16),
...     torch.empty(4096, 4096, dtype=torch.bfloat16))
>>> times = CostModel("h100").graph_times(gm)
>>> round(times["mm"] * 1e6)  # 2*4096**3 / 989e12 s + 5 us launch
144
>>> times["a_1"], times["output"]
(0.0, 0.0)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_aggregate
from torch.utils.flop_counter import flop_registry

from streampass import ops
from streampass.errors import StreamPassError
from streampass.sim.profiles import PROFILES, DeviceProfile
from streampass.sim.tensors import concrete_shape, hint, node_value, tensor_bytes, tensors

__all__ = ["PROFILES", "CostModel", "DeviceProfile", "Overrides"]


def _seconds(value: object, node: torch.fx.Node) -> float:
    """An override's time for ``node``, refused unless a finite number of seconds >= 0 (a failed
    profiler run's NaN would empty the search's ties; a negative time would price nonsense)."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise StreamPassError(f"its time override {value!r} is no number of seconds", node.name) from None
    if not math.isfinite(t) or t < 0:
        raise StreamPassError(f"its time override must be a finite number of seconds >= 0, got {value!r}", node.name)
    return t


Overrides = Mapping[str, float] | Callable[[torch.fx.Node], float | None] | None

# Ops that only produce a new view of existing memory: no kernel, no time.
_VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "expand",
        "expand_as",
        "view_as",
        "t",
        "transpose",
        "permute",
        "squeeze",
        "unsqueeze",
        "slice",
        "select",
        "narrow",
        "alias",
        "detach",
        "as_strided",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "diagonal",
        "unfold",
        "lift_fresh",
    }
)
_FREE_FUNCTIONS = frozenset({operator.getitem})


def _is_streams_op(target: Any) -> bool:
    # an overload (torch.ops.streams.wait_event.default) or its packet (torch.ops.streams.wait_event)
    return target in ops.STREAM_OPS or str(getattr(target, "_qualified_op_name", "")).startswith("streams::")


def _is_control_deps(target: Any) -> bool:
    return target is ops.CONTROL_DEPS


def _view_name(node: torch.fx.Node) -> str | None:
    target = node.target
    if node.op == "call_method" and isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload) and target.namespace == "aten":
        return target._opname
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.removeprefix("aten::")
    return None


def _is_shape_query(target: Any) -> bool:
    """aten.sym_size / sym_stride / sym_numel / sym_storage_offset, or a Python callable."""
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace == "aten" and target._opname.startswith("sym_")
    return not isinstance(target, (torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator))


def _covers(value: Any) -> tuple[int, torch.dtype | None, bool]:
    """``(bytes, dtype of the first, any)`` of the tensors in a node's value."""
    ts = tensors(value)
    return sum(tensor_bytes(t) for t in ts), (ts[0].dtype if ts else None), bool(ts)


class CostModel:
    """Estimates the run time of FX graph nodes on one device profile.

    ``profile`` is a name in ``PROFILES`` or a ``DeviceProfile``. ``overrides`` is a
    dict from node name to seconds, or a callable taking a node and returning seconds
    or None (None means "no override"); overrides win over the estimate.

    >>> g = torch.fx.Graph()
    >>> x = g.placeholder("x"); x.meta["val"] = torch.empty(1024, 1024, device="meta")
    >>> y = g.call_function(torch.ops.aten.relu.default, (x,))
    >>> y.meta["val"] = torch.empty(1024, 1024, device="meta")
    >>> model = CostModel("h100")
    >>> model.node_time(y) == 2 * 1024 * 1024 * 4 / 3.35e12 + 5e-6
    True
    >>> y.name
    'relu_default'
    >>> CostModel("h100", overrides={"relu_default": 1e-3}).node_time(y)
    0.001
    """

    def __init__(self, profile: str | DeviceProfile = "h100", overrides: Overrides = None):
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise ValueError(f"unknown device profile {profile!r}; known: {sorted(PROFILES)}")
            profile = PROFILES[profile]
        self.profile: DeviceProfile = profile
        self.overrides = overrides

    def node_time(self, node: torch.fx.Node) -> float:
        """Estimated seconds for ``node``; never raises on odd or missing metadata.

        >>> g = torch.fx.Graph()
        >>> CostModel("a100").node_time(g.placeholder("x"))
        0.0
        """
        return self._time(node, None)

    def node_times(self, nodes) -> dict[torch.fx.Node, float]:
        """``node_time`` of each of ``nodes`` (of one graph), faster than one at a time: what each
        node's value covers is measured once, not again for every node that reads it.

        >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
        >>> model = CostModel("cpu")
        >>> model.node_times(gm.graph.nodes) == {n: model.node_time(n) for n in gm.graph.nodes}
        True
        """
        seen: dict[torch.fx.Node, tuple[int, torch.dtype | None, bool]] = {}
        return {node: self._time(node, seen) for node in nodes}

    def _time(self, node: torch.fx.Node, seen: dict | None) -> float:
        value = None
        if callable(self.overrides):
            value = self.overrides(node)
        elif self.overrides is not None:
            value = self.overrides.get(node.name)
        return self._estimate(node, seen) if value is None else _seconds(value, node)

    def graph_times(self, graph: torch.fx.Graph | torch.fx.GraphModule) -> dict[str, float]:
        """``node_time`` for every node, keyed by node name, in graph order.

        >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
        >>> CostModel("cpu").graph_times(gm)  # no meta: launch overhead only
        {'x': 0.0, 'add': 1e-06, 'output': 0.0}
        """
        if isinstance(graph, torch.fx.GraphModule):
            graph = graph.graph
        return {node.name: self.node_time(node) for node in graph.nodes}

    # -- the estimate itself -------------------------------------------------

    def _estimate(self, node: torch.fx.Node, seen: dict | None = None) -> float:
        """``seen``: node -> :func:`_covers` of its value, shared by the nodes of one graph."""
        p = self.profile
        if node.op in ("placeholder", "get_attr", "output"):
            return 0.0
        target = node.target
        if _is_streams_op(target):
            return p.sync_cost
        if _is_control_deps(target):
            return self._control_deps_time(node)
        if target in _FREE_FUNCTIONS or _view_name(node) in _VIEW_OPS:
            return 0.0
        out = node_value(node)
        if out is None:
            return p.launch_overhead
        if seen is None:
            seen = {}
        # Each input node counted once: a tensor passed twice (x + x) is read once.
        n_bytes, dtype, inputs = 0, None, False
        for n in node.all_input_nodes:
            covers = seen.get(n)
            if covers is None:
                covers = seen[n] = _covers(node_value(n))
            n_bytes += covers[0]
            dtype = dtype or covers[1]
            inputs = inputs or covers[2]
        written, out_dtype, outputs = seen[node] = _covers(out)
        if not outputs and (not inputs or _is_shape_query(target)):
            # Shape queries and scalar arithmetic (sym_size, operator.mul on SymInts)
            # run on the host and launch nothing.
            return 0.0
        flops = self._flops(node, out)
        return self.kernel_time(flops, n_bytes + written, dtype if inputs else out_dtype)

    def kernel_time(self, flops: float, n_bytes: int, dtype: torch.dtype | None) -> float:
        """Seconds for one kernel doing ``flops`` and moving ``n_bytes``: the roofline, plus
        one launch (how every node is priced; also a fused kernel's price, ``assign.fusion``).

        >>> CostModel("h100").kernel_time(0, 3.35e6, torch.float32) == 1e-6 + 5e-6
        True
        """
        p = self.profile
        compute = flops / p.flops_for(dtype) if flops else 0.0
        return max(compute, n_bytes / p.mem_bandwidth) + p.launch_overhead

    def node_flops(self, node: torch.fx.Node) -> float:
        """The floating-point operations of ``node`` by torch's flop registry (0 where it has no
        formula or the metadata is missing)."""
        out = node_value(node) if node.op == "call_function" else None
        return 0.0 if out is None else self._flops(node, out)

    @staticmethod
    def _arg_value(a: Any) -> Any:
        return node_value(a) if isinstance(a, torch.fx.Node) else a

    @staticmethod
    def _arg_shape(a: Any) -> Any:
        return concrete_shape(node_value(a) if isinstance(a, torch.fx.Node) else a)

    @classmethod
    def _flops(cls, node: torch.fx.Node, out: Any) -> float:
        target = node.target
        packet = getattr(target, "overloadpacket", target)
        try:
            formula = flop_registry.get(packet) or flop_registry.get(target)
        except TypeError:  # unhashable target
            return 0.0
        if formula is None:
            return 0.0
        # FX's own map over its argument containers: pytree's general one took half of node_time
        raw = getattr(formula, "__wrapped__", None)
        if raw is None:
            args, kwargs = map_aggregate((node.args, node.kwargs), cls._arg_value)
        try:
            if raw is not None:
                # A shape_wrapper'd formula: hand it concrete shapes ourselves, so
                # that its checks (e.g. k == k2) never put guards on symbolic shapes.
                # (One map: each argument's value, then its shape.)
                args, kwargs = map_aggregate((node.args, node.kwargs), cls._arg_shape)
                flops = raw(*args, out_shape=map_aggregate(out, concrete_shape), **kwargs)
            else:
                flops = formula(*args, **kwargs, out_val=out)
            flops = hint(flops)
        except Exception:
            return 0.0
        return float(flops) if flops else 0.0

    def _control_deps_time(self, node: torch.fx.Node) -> float:
        """control_deps(deps, subgraph, *args): the cost of what the subgraph runs.

        Inductor wraps one op in the subgraph; for a wrapped stream op that is
        ``sync_cost``. Falls back to ``sync_cost`` when the subgraph can't be found.
        """
        sub = node.args[1] if len(node.args) > 1 else None
        if isinstance(sub, torch.fx.Node) and sub.op == "get_attr":
            root = node.graph.owning_module
            try:
                sub = operator.attrgetter(sub.target)(root)
            except Exception:
                sub = None
        if isinstance(sub, torch.fx.GraphModule):
            return sum(self._estimate(n) for n in sub.graph.nodes)
        return self.profile.sync_cost

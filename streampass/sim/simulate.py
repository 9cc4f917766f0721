"""Simulate how a multi-stream graph runs: a schedule from the cost model, played in issue order.

``simulate(gm)`` plays the graph the way the device would run it: one CPU thread issues the
nodes in graph order; each stream runs what was issued to it in order, one node at a time;
``record_event`` / ``wait_event`` / ``wait_stream`` / ``sync_dealloc`` hold a stream back until
the work they name has completed; ``synchronize_*`` hold the CPU back. Node durations come from
:class:`streampass.sim.cost.CostModel`. Data dependencies across streams are **not** honoured unless
the syncs say so, exactly as on a GPU: the schedule of a graph with races can finish before its
critical path, and :attr:`Schedule.races` lists every dependency the schedule violated.

See docs/simulator.md for the semantics and what is and is not modelled.

>>> import torch, streampass as sp
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> def f(x):
...     with sp.stream(1):
...         y = x.sin()
...     return y + x.cos()
>>> gm = make_fx(f)(torch.empty(1 << 20, device="meta"))
>>> r = sp.run(gm)
>>> s = simulate(gm, "h100")
>>> syncs = r.records_added + r.waits_added
>>> s.ok, s.critical_path_time <= s.makespan < s.serial_time + syncs * s.profile.sync_cost
(True, True)
"""

from __future__ import annotations

import itertools

import networkx as nx
import torch.fx

from streampass import ops
from streampass.analysis.reading import StreamAssignment, read_streams
from streampass.analysis.requirements import requirements
from streampass.ops import AMBIENT
from streampass.sim.cost import CostModel, DeviceProfile
from streampass.sim.player import Item, build_items, run_items
from streampass.sim.schedule import EPS, Race, Schedule, Slot

__all__ = ["Race", "Schedule", "Slot", "simulate"]

Node = torch.fx.Node


def _target_name(node: Node, call) -> str:
    return call.name if call is not None else ops.short_name(ops.target_name(node))


def is_device_work(a: StreamAssignment, node: Node) -> bool:
    """Whether the simulator runs ``node`` as a kernel on its stream."""
    # A control_deps wrapping something other than a stream op is a kernel too.
    return a.is_compute(node) or (node.target is ops.CONTROL_DEPS and node not in a.syncs)


def graph_steps(a: StreamAssignment):
    """What the CPU issues, in order: ``(node, its stream op or None, stream, is device work)``
    for every node of the reading (the input of :func:`build_items`)."""
    syncs, stream = a.syncs, a.stream
    for node in a.nodes:
        call = syncs.get(node)
        yield node, call, stream[node], call is None and is_device_work(a, node)


def _dependencies(a: StreamAssignment) -> list[tuple[str, Node, Node]]:
    """Every ordering the program needs, same stream or not: ``(kind, before, after)``, from
    :func:`~streampass.analysis.requirements.requirements`. The side streams' joins at exit
    are left out: :func:`_races` checks what is still running at return by itself."""
    reqs, _ = requirements(a, same_stream=True)
    return [(r.kind, r.before, r.after) for r in reqs if r.kind != "exit" or r.value is not None]


def _critical_path(a: StreamAssignment, deps, times: dict[Node, float]) -> tuple[float, list[str]]:
    g = nx.DiGraph()
    src = "__entry__"
    g.add_node(src)
    for node in a.nodes:
        if is_device_work(a, node):
            g.add_edge(src, node.name, w=times[node])
    for _, u, v in deps:
        if u is v:
            continue
        w = times[v] if is_device_work(a, v) else 0.0
        g.add_edge(src, u.name, w=times[u] if is_device_work(a, u) else 0.0)
        g.add_edge(u.name, v.name, w=w)
    if g.number_of_edges() == 0:
        return 0.0, []
    path = nx.dag_longest_path(g, weight="w", default_weight=0.0)
    length = sum(g.edges[u, v]["w"] for u, v in itertools.pairwise(path))
    names = [p for p in path if p != src]
    # Drop free (zero-time) nodes at the ends: they add nothing.
    while names and times.get(a.node_named(names[0]), 0.0) == 0.0:
        names.pop(0)
    while names and times.get(a.node_named(names[-1]), 0.0) == 0.0:
        names.pop()
    return length, names


def _as_cost(cost) -> CostModel:
    if cost is None:
        return CostModel("h100")
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, (str, DeviceProfile)):
        return CostModel(cost)
    raise TypeError(f"cost must be a CostModel, a profile name or a DeviceProfile, got {type(cost).__name__}")


def simulate(
    gm: torch.fx.GraphModule | torch.fx.Graph,
    cost: CostModel | str | DeviceProfile | None = None,
    *,
    cpu_launch: bool = False,
    external_events=(),
) -> Schedule:
    """Simulate ``gm`` on its streams and return the :class:`Schedule`. Never edits ``gm``.

    ``cost``: a :class:`~streampass.sim.cost.CostModel`, a profile name (``"h100"``, ``"h200"``,
    ``"a100"``, ``"cpu"``) or a :class:`~streampass.sim.cost.DeviceProfile`; default ``"h100"``.

    ``cpu_launch``: when False (default) the CPU issues instantly and each node's full
    cost-model time (which includes one launch overhead) is spent on its stream. When True,
    the launch overhead of each kernel is spent on the CPU thread instead, before the kernel
    reaches its stream, and each stream op costs its ``sync_cost`` on the CPU: a graph of
    many small kernels then becomes launch-bound, as on a real device.

    ``external_events``: event indices recorded outside the graph (see
    :func:`streampass.read_streams`); waiting on one does not block.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x, w):
    ...     with sp.stream(1):
    ...         a = x @ w
    ...     return a + x @ w.t()
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> gm = make_fx(f)(m, m); _ = sp.run(gm)
    >>> s = sp.simulate(gm, "h100")
    >>> s.ok, s.critical_path_time <= s.makespan < s.serial_time
    (True, True)
    """
    model = _as_cost(cost)
    a = read_streams(gm, external_events)
    times = model.node_times(a.nodes)
    profile = model.profile

    items = build_items(graph_steps(a), times, profile, cpu_launch, serial=False)
    cpu_end = run_items(items)
    serial_items = build_items(graph_steps(a), times, profile, cpu_launch, serial=True)
    serial_cpu_end = run_items(serial_items)
    serial_time = max([serial_cpu_end] + [it.end for it in serial_items])

    slots: dict[str, Slot] = {}
    flows: list[tuple[str, str]] = []
    for it in items:
        tname = _target_name(it.node, a.syncs.get(it.node))
        waited = tuple(g.node.name for g in it.gates)
        slots[it.node.name] = Slot(it.node.name, it.stream, it.start, it.end, it.kind, tname, it.issued, waited)
        flows.extend((w, it.node.name) for w in waited)
        if it.stream is not None and it.cpu > 0:
            launch = Slot(
                f"{it.node.name}:launch", None, it.issued - it.cpu, it.issued, "launch", tname, it.issued - it.cpu
            )
            slots[launch.node] = launch
    ends = [it.end for it in items] + [cpu_end]
    makespan = max(ends) if ends else 0.0

    # When the ambient stream reaches the return: its work issued before `output` is done.
    out_node = next((n for n in reversed(a.nodes) if n.op == "output"), None)
    last_on: dict[int, Item] = {}  # last item issued on each stream before the return
    last_kernel: dict[int, Item] = {}
    for it in items:
        if it.stream is not None:
            last_on[it.stream] = it
            if it.kind == "kernel":
                last_kernel[it.stream] = it
    returned_at = max(cpu_end, last_on[AMBIENT].end if AMBIENT in last_on else 0.0)

    deps = _dependencies(a)
    # The bound uses device time: with cpu_launch, launch overheads are on the CPU thread.
    device_time = dict(times)
    for it in items:
        if it.kind == "kernel":
            device_time[it.node] = it.dur
    cp_time, cp_path = _critical_path(a, deps, device_time)
    races = _races(deps, slots, returned_at, last_kernel, out_node)
    return Schedule(
        slots=slots,
        streams=a.streams,
        makespan=makespan,
        serial_time=serial_time,
        critical_path_time=cp_time,
        critical_path=cp_path,
        returned_at=returned_at,
        races=races,
        profile=profile,
        cpu_launch=cpu_launch,
        flows=flows,
    )


def _races(deps, slots: dict[str, Slot], returned_at: float, last_kernel, out_node) -> list[Race]:
    found: list[Race] = []
    seen: set[tuple[str, str, str]] = set()

    def finished(n: Node) -> float:
        s = slots.get(n.name)
        return s.end if s is not None else 0.0  # placeholders: ready at entry

    for kind, u, v in deps:
        if u is v:
            continue
        end_u = finished(u)
        if v is out_node:
            start_v = returned_at
        else:
            sv = slots.get(v.name)
            if sv is None:
                continue
            start_v = sv.start
        if end_u > start_v + EPS * max(1.0, end_u):
            key = (kind, u.name, v.name)
            if key not in seen:
                seen.add(key)
                found.append(Race(kind, u.name, v.name, end_u - start_v))
    if out_node is not None:
        # Side-stream work must be joined into the ambient stream before the return.
        for s, it in last_kernel.items():
            if s != AMBIENT and it.end > returned_at + EPS * max(1.0, it.end):
                found.append(Race("exit", it.node.name, out_node.name, it.end - returned_at))
    return found

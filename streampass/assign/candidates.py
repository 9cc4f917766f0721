"""Candidate stream assignments of a :class:`~streampass.assign.dag.WorkGraph`.

Each candidate returns ``(streams, notes)``: node -> stream for every compute node (fixed nodes
keep theirs) and node -> why it is where it is, for the nodes a rule placed. ``slots`` are the
stream indices a candidate may use, ambient (0) first. The assigner (``assign.choose``) runs
them all through ``streampass.run`` and the simulator and keeps the best; the baselines of
benchmarks/assign.py are the plain ones (:func:`chain_cover`, :func:`round_robin`,
:func:`critical_round_robin`).
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable

import networkx as nx
import torch.fx

from streampass.analysis.reading import StreamAssignment
from streampass.assign.dag import WorkGraph
from streampass.errors import StreamPassError
from streampass.ops import AMBIENT, check_stream_index
from streampass.sim.cost import PROFILES, CostModel, DeviceProfile

Node = torch.fx.Node
Candidate = tuple[dict[Node, int], dict[Node, str]]


def stream_slots(
    a: StreamAssignment, max_streams: int, side_streams: Iterable[int] | None = None, taken: Iterable[int] = ()
) -> list[int]:
    """The ambient stream and ``max_streams - 1`` side streams no node or event of the graph uses,
    nor ``taken`` (the streams of the bodies it calls: ``torch.cond``'s branches), taken from
    ``side_streams`` in order if given (a compiler that knows which indices are free at run
    time), else the smallest free indices. At most one side stream per compute node of
    the graph: no candidate puts a branch, a chain or a node on more (a larger ``max_streams``
    changes no choice, and costs neither time nor memory).

    >>> import torch, streampass as sp
    >>> a = sp.read_streams(torch.fx.symbolic_trace(lambda x: (x + 1) * 2))
    >>> stream_slots(a, 3), stream_slots(a, 3, side_streams=[7, 8, 9]), stream_slots(a, 10**9)
    ([0, 1, 2], [0, 7, 8], [0, 1, 2])
    """
    used = set(a.streams) | a.events() | set(taken)
    out = [AMBIENT]
    most = max(1, min(max_streams, len(a.compute) + 1))
    pool = side_streams if side_streams is not None else itertools.count(1)
    for k in pool:
        if len(out) >= most:
            break
        if k == AMBIENT and not isinstance(k, bool):
            raise StreamPassError(f"side_streams: {AMBIENT} is the ambient stream, not a side stream")
        if k not in used:
            try:
                out.append(check_stream_index(k))
            except StreamPassError as e:
                raise StreamPassError(f"side_streams: {e}") from None
            used.add(k)  # listed twice: one slot
    return out


def check_request(
    gm: object, cost: object, max_streams: object, memory_budget: object, side_streams: object
) -> CostModel:
    """The cost model :func:`~streampass.assign.choose.assign_streams` prices with, once its
    arguments are checked: a :class:`~streampass.errors.StreamPassError` names the first one
    that is not what it takes.

    >>> check_request(torch.fx.symbolic_trace(lambda x: x), "a100", 2, None, None).profile.name
    'a100'
    >>> check_request(torch.fx.symbolic_trace(lambda x: x), "h100", 0, None, None)
    Traceback (most recent call last):
    streampass.errors.StreamPassError: max_streams must be an int >= 1 (the ambient stream included), got 0
    """
    if not isinstance(gm, torch.fx.GraphModule):
        hint = " (pass its owning_module)" if isinstance(gm, torch.fx.Graph) else ""
        raise StreamPassError(f"assign_streams takes a torch.fx.GraphModule, got {type(gm).__name__}{hint}")
    check_max_streams(max_streams)
    if memory_budget is not None and (
        isinstance(memory_budget, bool)
        or not isinstance(memory_budget, numbers.Real)
        or math.isnan(memory_budget)
        or memory_budget < 0
    ):
        raise StreamPassError(
            f"memory_budget must be None (no budget) or a number of bytes >= 0, got {memory_budget!r} "
            f"({type(memory_budget).__name__})"
        )
    if side_streams is not None and (isinstance(side_streams, (str, bytes)) or not isinstance(side_streams, Iterable)):
        raise StreamPassError(
            f"side_streams must be None or an iterable of stream indices (ints >= 1), got {side_streams!r} "
            f"({type(side_streams).__name__})"
        )
    return cost_model(cost)


def check_max_streams(max_streams: object) -> None:
    """A StreamPassError unless ``max_streams`` is an int >= 1 (not a bool).

    >>> check_max_streams(4)
    >>> check_max_streams(1.5)
    Traceback (most recent call last):
    streampass.errors.StreamPassError: max_streams must be an int >= 1 (the ambient stream included), got 1.5 (float)
    """
    if isinstance(max_streams, bool) or not isinstance(max_streams, numbers.Integral) or max_streams < 1:
        raise StreamPassError(
            f"max_streams must be an int >= 1 (the ambient stream included), got {max_streams!r}"
            + ("" if type(max_streams) is int else f" ({type(max_streams).__name__})")
        )


def cost_model(cost: object) -> CostModel:
    """The cost model ``cost`` names: a CostModel, a DeviceProfile, a profile name, or None (h100).

    >>> cost_model(None).profile.name, cost_model("a100").profile.name
    ('h100', 'a100')
    >>> cost_model(5)
    Traceback (most recent call last):
    streampass.errors.StreamPassError: cost must be a device profile name (a100, cpu, h100, h200), a DeviceProfile, a CostModel or None (h100), got 5 (int)
    """
    if isinstance(cost, CostModel):
        return cost
    if cost is None:
        return CostModel("h100")
    if isinstance(cost, DeviceProfile) or (isinstance(cost, str) and cost in PROFILES):
        return CostModel(cost)
    raise StreamPassError(
        f"cost must be a device profile name ({', '.join(sorted(PROFILES))}), a DeviceProfile, a CostModel "
        f"or None (h100), got {cost!r}" + ("" if isinstance(cost, str) else f" ({type(cost).__name__})")
    )


def _with_fixed(w: WorkGraph, streams: dict[Node, int]) -> dict[Node, int]:
    for n, (s, _) in w.fixed.items():
        streams[n] = s
    return streams


def one_stream(w: WorkGraph) -> Candidate:
    """Every free node on the ambient stream."""
    return w.base(), {}


def chains(w: WorkGraph) -> list[list[Node]]:
    """Nimble's minimum chain cover: a maximum matching of the transitive reduction's edges
    (each node followed by at most one successor, preceded by at most one predecessor), read
    as chains, in the order of their first node. Nodes of one chain need no sync between them.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from streampass.assign.dag import work_graph
    >>> from streampass.sim.cost import CostModel
    >>> gm = make_fx(lambda x: x.sin().exp() + x.cos())(torch.ones(2))
    >>> w = work_graph(sp.read_streams(gm), CostModel())
    >>> cover = chains(w)  # two chains: which one takes `add` depends on the matching
    >>> len(cover), sorted(n.name for c in cover for n in c)
    (2, ['add', 'cos', 'exp', 'sin'])
    """
    index = {n: i for i, n in enumerate(w.nodes)}
    size = len(w.nodes)
    b = nx.Graph()  # ints only, so that the matching (and the benchmark) is the same every run
    b.add_nodes_from(range(2 * size))
    b.add_edges_from(sorted((index[u], size + index[v]) for u, v in w.reduced_edges()))
    match = nx.bipartite.hopcroft_karp_matching(b, top_nodes=range(size))
    nxt = {u: w.nodes[match[index[u]] - size] for u in w.nodes if index[u] in match}
    has_prev = set(nxt.values())
    out = []
    for n in w.nodes:
        if n in has_prev:
            continue
        chain = [n]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        out.append(chain)
    return out


def chain_cover(w: WorkGraph, slots: list[int]) -> Candidate:
    """Nimble-style: the chains of :func:`chains` mapped onto ``slots``, heaviest chain on the
    ambient stream, each other chain (heaviest first) on the least-loaded stream."""
    cover = sorted(chains(w), key=lambda c: -sum(w.device[n] for n in c))
    load = dict.fromkeys(slots, 0.0)
    streams: dict[Node, int] = {}
    for i, chain in enumerate(cover):
        s = AMBIENT if i == 0 else min(slots, key=lambda k: (load[k], k))
        load[s] += sum(w.device[n] for n in chain)
        streams.update(dict.fromkeys(chain, s))
    return _with_fixed(w, streams), {}


def segments(w: WorkGraph) -> list[list[Node]]:
    """The branches: maximal straight runs of the transitive reduction (a node continues its
    predecessor's run when it is that predecessor's only successor and has no other predecessor)."""
    preds: dict[Node, list[Node]] = {}
    out_degree: dict[Node, int] = {}
    for u, v in w.reduced_edges():
        preds.setdefault(v, []).append(u)
        out_degree[u] = out_degree.get(u, 0) + 1
    run_of: dict[Node, list[Node]] = {}
    out: list[list[Node]] = []
    for n in w.nodes:
        mine = preds.get(n, ())
        if len(mine) == 1 and out_degree[mine[0]] == 1:
            run_of[n] = run_of[mine[0]]
            run_of[n].append(n)
        else:
            run_of[n] = [n]
            out.append(run_of[n])
    return out


def round_robin(w: WorkGraph, slots: list[int]) -> Candidate:
    """Each branch (:func:`segments`) on the next stream in turn, in graph order."""
    streams: dict[Node, int] = {}
    for i, seg in enumerate(segments(w)):
        streams.update(dict.fromkeys(seg, slots[i % len(slots)]))
    return _with_fixed(w, streams), {}


def critical_round_robin(w: WorkGraph, slots: list[int]) -> Candidate:
    """The critical path on the ambient stream, the rest of each branch round-robin on the side streams."""
    path = w.critical_path()  # a list, in path order: a set's order changes between processes
    cp = set(path)
    side = slots[1:] or [AMBIENT]
    streams = dict.fromkeys(path, AMBIENT)
    notes = dict.fromkeys(path, "on the critical path")
    i = 0
    for seg in segments(w):
        rest = [n for n in seg if n not in cp]
        if rest:
            streams.update(dict.fromkeys(rest, side[i % len(side)]))
            i += 1
    return _with_fixed(w, streams), notes


def list_schedule(w: WorkGraph, slots: list[int], pin_critical: bool, cpu_weight: float = 1.0) -> Candidate:
    """Earliest-finish list scheduling in issue order, on the simulator's model (docs/assign.md).

    The CPU issues each kernel (``launch_overhead``) and each cross-stream sync (a record and a
    wait, ``sync_cost`` each, per other stream read from); a kernel starts when it is issued, its
    stream is free and its inputs are done. Each node goes where it would finish first, counting
    ``cpu_weight`` times the extra CPU time its syncs take (that delays every later launch);
    ties stay on the stream of the predecessor it depends on most, then the ambient stream.
    ``pin_critical`` keeps the critical path on the ambient stream.
    """
    p = w.profile
    pinned = set(w.critical_path()) if pin_critical else set()
    sync2, launch, time, device = 2 * p.sync_cost, p.launch_overhead, w.time, w.device
    cpu = 0.0
    free_at = dict.fromkeys(slots, 0.0)
    finish: dict[Node, float] = {}
    streams: dict[Node, int] = {}
    notes: dict[Node, str] = {}
    for n in w.nodes:
        if n in w.fixed:
            options = [w.fixed[n][0]]
            free_at.setdefault(options[0], 0.0)
        elif n in pinned:
            options = [AMBIENT]
            notes[n] = "on the critical path"
        else:
            options = slots
        preds = w.preds[n]
        if preds:
            home = streams[max(preds, key=time.__getitem__)]  # the predecessor it depends on most
            ready = max([finish[u] for u in preds])
            read_from = {streams[u] for u in preds}
        else:
            home, ready, read_from = AMBIENT, 0.0, set()
        # The least (end + cpu_weight × extra, not home, not ambient), the first of equals: the
        # comparison of those tuples, without building them.
        best, b0, b1, b2, b_end, b_issued = None, 0.0, False, False, 0.0, 0.0
        others, dev = len(read_from), device[n]
        for s in options:
            extra = sync2 * (others - (s in read_from))  # a sync per other stream
            issued = cpu + launch + extra
            start = free_at[s]
            if issued > start:
                start = issued
            if ready > start:
                start = ready
            end = start + dev
            k0, k1, k2 = end + cpu_weight * extra, s != home, s != AMBIENT
            if best is None or k0 < b0 or (k0 == b0 and (k1 < b1 or (k1 == b1 and k2 < b2))):
                best, b0, b1, b2, b_end, b_issued = s, k0, k1, k2, end, issued
        s, end, issued = best, b_end, b_issued
        streams[n], finish[n], free_at[s], cpu = s, end, end, issued
    return streams, notes


def merge_small(w: WorkGraph, streams: dict[Node, int], threshold: float) -> Candidate:
    """Move each side-stream branch whose device work is below ``threshold`` onto the stream of
    the predecessor it depends on most (the ambient stream if none): its syncs and launches
    would cost more than the overlap gains. A branch: nodes of one side stream connected by
    dependencies. Fixed nodes never move."""
    streams = dict(streams)
    notes: dict[Node, str] = {}
    seen: set[Node] = set()
    for n in w.nodes:
        s = streams[n]
        if n in seen or s == AMBIENT or n in w.fixed:
            continue
        group, stack = [], [n]
        seen.add(n)
        while stack:
            u = stack.pop()
            group.append(u)
            for v in w.preds[u] + w.succs[u]:
                if v not in seen and streams[v] == s and v not in w.fixed:
                    seen.add(v)
                    stack.append(v)
        work = sum(w.device[u] for u in group)
        if work >= threshold:
            continue
        members = set(group)
        outside = [u for g in group for u in w.preds[g] if u not in members]
        target = streams[max(outside, key=lambda u: w.time[u])] if outside else AMBIENT
        why = (
            f"too small to pay for sync+launch ({work * 1e6:.1f} us of device work < "
            f"2×(launch+sync) = {threshold * 1e6:.1f} us)"
        )
        for u in group:
            streams[u] = target
            notes[u] = why
    return streams, notes


def demote(w: WorkGraph, streams: dict[Node, int], stream: int) -> Candidate:
    """Every free node of ``stream`` moved to the ambient stream."""
    out = {n: AMBIENT if s == stream and n not in w.fixed else s for n, s in streams.items()}
    return out, {}

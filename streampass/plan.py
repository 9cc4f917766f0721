"""The sync plan: which records and waits make a graph race-free, with the fewest waits (pure).

The planner walks the graph in issue order with one vector clock per stream (as
:mod:`streampass.dag` does), using the syncs the graph already has. At each node whose
ordering requirements (:mod:`streampass.hazards`) are not yet implied, it adds waits just
before the node, on as few source streams as cover every unmet requirement, each waiting
for a record taken at the source stream's current end. It then moves every record it
added back to the earliest point that still covers what the waits were actually relied on
for, so a waiting stream never waits for work it does not need. See docs/plan.md for
why the number of waits is minimal for the given node order.

Three kinds of consumer are planned: graph nodes (raw/war/waw/entry), the output node
(exit: every output and every side stream joined into the ambient stream), and one "free
point" per value read on a stream other than its own (dealloc: the allocating stream waits
for the readers before the value may be freed; the value rides on that wait so it stays
alive until then).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import torch.fx

from . import ops
from .annotate import AMBIENT
from .hazards import requirements
from .reading import StreamAssignment

Node = torch.fx.Node


@dataclass(eq=False)
class PlannedWait:
    """Insert ``wait_event(record.event, stream)`` right before ``before``."""

    stream: int
    source: int
    before: Node
    position: float  # where the wait sits in ``stream``'s issue order (between two nodes)
    snapshot: tuple[int, ...]  # the source stream's clock when the wait is issued
    required: float = 0.0  # the latest source position some consumer relies on
    record: PlannedRecord | None = None
    used: bool = False

    @property
    def name(self) -> str:
        return f"wait({self.source}->{self.stream}) before {self.before.name}"


@dataclass(eq=False)
class PlannedRecord:
    """``record_event(event, stream)`` right after ``anchor`` (or reuse ``existing``)."""

    stream: int
    event: int
    anchor: Node | PlannedWait | None  # None: at graph entry
    existing: Node | None = None


Gate = "Node | PlannedWait"


@dataclass
class SyncPlan:
    """Everything :func:`streampass.apply.apply_plan` needs, computed without editing the graph.

    Attributes:
        waits: new waits, in the order they must be inserted.
        records: new records (records of existing events reused by a wait are not listed).
        protect: gate (an existing wait node or a :class:`PlannedWait`) -> (consumer, value)
            pairs: ``consumer`` must be data-dependent on the gate for the tensor ``value``.
        keepalive: gate -> values the gate must hold alive (deferred frees).
        first_event: the first event index new records use.
    """

    assignment: StreamAssignment
    waits: list[PlannedWait] = field(default_factory=list)
    records: list[PlannedRecord] = field(default_factory=list)
    protect: dict = field(default_factory=lambda: defaultdict(list))
    keepalive: dict = field(default_factory=lambda: defaultdict(list))
    first_event: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.waits

    def summary(self) -> str:
        return f"{len(self.records)} record(s), {len(self.waits)} wait(s) to add"


def first_free_event(a: StreamAssignment) -> int:
    """Event indices streampass allocates start above every stream and event index in the graph."""
    used = set(a.streams) | a.events() | set(a.external_events)
    for call in a.syncs.values():
        used.update(x for x in call.args if isinstance(x, int) and not isinstance(x, bool))
    return max(used) + 1


class _Planner:
    def __init__(self, a: StreamAssignment):
        self.a = a
        self.streams = a.streams
        self.slot = {s: i for i, s in enumerate(self.streams)}
        n = len(self.streams)
        self.vc = [[0] * n for _ in self.streams]
        self.pos: dict[Node, int] = {}
        # cover[b][a]: (threshold, gate) in the order gates raised stream b's knowledge of a.
        self.cover = [[[] for _ in self.streams] for _ in self.streams]
        self.items: list[dict[float, Gate]] = [{} for _ in self.streams]  # position -> item
        self.gate_pos: dict = {}
        self.event_clock: dict[int, list[int]] = {}
        self.existing_records: list[list[tuple[int, Node, int]]] = [[] for _ in self.streams]
        self.record_count: dict[int, int] = defaultdict(int)
        for call in a.syncs.values():
            if call.target is ops.RECORD_EVENT:
                self.record_count[call.args[0]] += 1
        self.relied: dict = {}
        self.plan = SyncPlan(a, first_event=first_free_event(a))

    # -- clock bookkeeping ------------------------------------------------------------------
    def _gain(self, b: int, new: list[int], gate) -> None:
        mine = self.vc[b]
        for i, v in enumerate(new):
            if v > mine[i]:
                mine[i] = v
                if i != b:
                    self.cover[b][i].append((v, gate))

    def _issue(self, node: Node) -> None:
        b = self.slot[self.a.stream[node]]
        self.vc[b][b] += 1
        p = self.vc[b][b]
        self.pos[node] = p
        self.items[b][p] = node
        self.gate_pos[node] = p
        call = self.a.syncs.get(node)
        if call is None:
            return
        if call.target is ops.RECORD_EVENT:
            ev = call.args[0]
            self.event_clock[ev] = list(self.vc[b])
            if self.record_count[ev] == 1:
                self.existing_records[b].append((p, node, ev))
        elif call.target is ops.WAIT_EVENT and call.args[0] in self.event_clock:
            self._gain(b, self.event_clock[call.args[0]], node)
        elif call.target is ops.WAIT_STREAM:
            self._gain(b, list(self.vc[self.slot[call.args[1]]]), node)
        # synchronize_* and sync_dealloc are honoured by verify, but the planner does not rely
        # on them: they cannot carry the data dependencies that keep the order under reordering.

    # -- choosing waits ---------------------------------------------------------------------
    def _unmet(self, b: int, needs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        mine = self.vc[b]
        return [(s, p) for s, p in needs if mine[s] < p]

    def _add_waits(self, b: int, unmet: list[tuple[int, int]], before: Node) -> None:
        candidates = [x for x in range(len(self.streams)) if x != b and any(self.vc[x][s] >= p for s, p in unmet)]
        best = None
        for size in range(1, len(candidates) + 1):
            for combo in itertools.combinations(candidates, size):
                if all(max(self.vc[x][s] for x in combo) >= p for s, p in unmet):
                    score = sum(max([self.vc[b][i]] + [self.vc[x][i] for x in combo]) for i in range(len(self.streams)))
                    if best is None or score > best[0]:
                        best = (score, combo)
            if best is not None:
                break
        assert best is not None, "a need on a stream that never reached it"  # requirements point backwards
        base = self.vc[b][b]
        for k, x in enumerate(best[1]):
            w = PlannedWait(
                stream=self.streams[b],
                source=self.streams[x],
                before=before,
                position=base + 0.5 + k / (2 * len(self.streams) + 2) + self._bump(b, base),
                snapshot=tuple(self.vc[x]),
            )
            self.items[b][w.position] = w
            self.gate_pos[w] = w.position
            self.plan.waits.append(w)
            self._gain(b, list(self.vc[x]), w)

    def _bump(self, b: int, base: int) -> float:
        # Several groups of waits can sit between the same two nodes of a stream (free points
        # and the exit both go before the output node): keep their positions distinct.
        n = sum(1 for p in self.items[b] if base < p < base + 1)
        return n / 1000.0

    def _covering_gate(self, b: int, s: int, p: int):
        for threshold, gate in self.cover[b][s]:
            if threshold >= p:
                return gate
        raise AssertionError("requirement met without a gate")  # pragma: no cover

    def _rely(self, gate, s: int, p: int) -> None:
        """Record that someone relies on ``gate`` for knowing stream slot ``s`` up to ``p``."""
        if not isinstance(gate, PlannedWait):
            return  # an existing sync: its record is where it is
        key = (id(gate), s)
        if self.relied.get(key, -1) >= p:
            return
        self.relied[key] = p
        gate.used = True
        x = self.slot[gate.source]
        if x == s:
            gate.required = max(gate.required, p)
            return
        inner = self._covering_gate(x, s, p)
        gate.required = max(gate.required, self.gate_pos[inner])
        self._rely(inner, s, p)

    def satisfy(self, stream: int, needs: list[tuple[Node, Node | None]], before: Node, on_gate) -> None:
        """Make every ``(producer, value)`` in ``needs`` happen before a point on ``stream``."""
        b = self.slot[stream]
        slots = [(self.slot[self.a.stream[n]], self.pos[n]) for n, _ in needs]
        unmet = self._unmet(b, slots)
        if unmet:
            self._add_waits(b, unmet, before)
        for (s, p), (_, value) in zip(slots, needs):
            gate = self._covering_gate(b, s, p)
            self._rely(gate, s, p)
            on_gate(gate, value)

    # -- the walk ---------------------------------------------------------------------------
    def run(self) -> SyncPlan:
        a, plan = self.a, self.plan
        reqs, values = requirements(a)
        by_consumer: dict[Node, list] = defaultdict(list)
        for r in reqs:
            by_consumer[r.after].append((r.before, r.value))
        for node in a.nodes:
            if node.op == "output":
                self._plan_exit(node, by_consumer[node], values)
                break
            needs = by_consumer.get(node)
            if needs:
                self.satisfy(a.stream[node], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v)))
            self._issue(node)
        self._place_records()
        return plan

    def _plan_exit(self, output: Node, needs, values) -> None:
        plan, a = self.plan, self.a

        def hold(value):
            return lambda g, _v: plan.keepalive[g].append(value)

        def free_point(cv):
            readers = [(r, None) for rs in cv.readers.values() for r in rs]
            self.satisfy(cv.stream, readers, output, hold(cv.value))

        for cv in values:
            if cv.stream != AMBIENT:
                free_point(cv)
        if needs:
            self.satisfy(a.stream[output], needs, output, lambda g, v: plan.protect[g].append((output, v)))
        for cv in values:
            if cv.stream == AMBIENT:
                free_point(cv)

    def _place_records(self) -> None:
        plan = self.plan
        plan.waits = [w for w in plan.waits if w.used]
        shared: dict[tuple[int, float], PlannedRecord] = {}
        for w in plan.waits:
            x = self.slot[w.source]
            reuse = [
                (p, n, ev)
                for p, n, ev in self.existing_records[x]
                if w.required <= p <= w.snapshot[x] and self.a.position[n] < self.a.position[w.before]
            ]
            if reuse:
                p, n, ev = min(reuse, key=lambda t: t[0])
                w.record = PlannedRecord(w.source, ev, n, existing=n)
                continue
            key = (x, w.required)
            if key not in shared:
                anchor = self.items[x].get(w.required) if w.required > 0 else None
                shared[key] = PlannedRecord(w.source, plan.first_event + len(plan.records), anchor)
                plan.records.append(shared[key])
            w.record = shared[key]


def plan_syncs(a: StreamAssignment) -> SyncPlan:
    """The records and waits that make the graph read into ``a`` race-free; edits nothing.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return x.cos() + y
    >>> plan = plan_syncs(sp.read_streams(make_fx(f)(torch.ones(2))))
    >>> [(w.source, w.stream, w.before.name) for w in plan.waits]
    [(0, 1, 'sin'), (1, 0, 'add'), (0, 1, 'output')]
    """
    return _Planner(a).run()

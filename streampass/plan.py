"""The sync plan: which records and waits make a graph race-free, with the fewest waits (pure).

The planner walks the graph in issue order with one vector clock per stream (as
:mod:`streampass.dag` does), honouring the syncs the graph already has. A *demand* is a
point with ordering requirements (:mod:`streampass.hazards`) that happens-before does not
yet imply: a node reading another stream's value, the output (exit), or the free point of
a value read on another stream (dealloc). At a demand the plan adds waits right there, each
for a source stream's whole progress so far, on a set of source streams that together cover
every unmet requirement. Knowledge travels transitively: a wait on stream b for stream a
also brings what a already knew, so later demands often need nothing.

Which set of sources to wait on is a real choice once three or more streams are involved
(two single-wait covers can leave different knowledge behind), so the choices are
searched: a Pareto frontier of (waits so far, clocks) states, pruned by dominance. The
result is the fewest waits among plans whose every wait sits at a demand and delivers
something that demand needs (docs/plan.md has the argument); ``SyncPlan.exact`` says
whether the frontier stayed within its bound (it does on all but pathological graphs).

Afterwards each record moves back to the latest source node some consumer relies on, so a
waiting stream never waits for work it does not need.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import torch.fx

from . import ops
from .dag import vector_clocks
from .hazards import CrossStreamValue, requirements
from .reading import StreamAssignment

Node = torch.fx.Node

#: Most states the search keeps per step; past it the plan is still valid, just not proven minimal.
FRONTIER_LIMIT = 24


@dataclass(eq=False)
class PlannedWait:
    """Insert ``wait_event(record.event, stream)`` right before ``before``.

    ``required`` is the position on ``source`` that consumers rely on (the record goes right
    after it); ``available`` is how far ``source`` had got when the wait is issued.
    """

    stream: int
    source: int
    before: Node
    position: float  # where the wait sits in ``stream``'s issue order, between two nodes
    available: int
    required: float = 0
    record: PlannedRecord | None = None
    used: bool = False

    @property
    def name(self) -> str:
        return f"wait({self.source}->{self.stream}) before {self.before.name}"


@dataclass(eq=False)
class PlannedRecord:
    """``record_event(event, stream)`` right after ``anchor`` (None: at graph entry)."""

    stream: int
    event: int
    anchor: Node | PlannedWait | None
    existing: Node | None = None  # an existing record of the graph, reused
    node: Node | None = None  # the node apply() created


@dataclass
class SyncPlan:
    """Everything :func:`streampass.apply.apply_plan` needs, computed without editing the graph.

    Attributes:
        waits: new waits, in walk order.
        records: new records (existing records reused by a new wait are not listed).
        protect: gate (an existing sync node or a :class:`PlannedWait`) -> (consumer, value)
            pairs: ``consumer`` must be data-dependent on the gate for the tensor ``value``
            (None: ordering only, e.g. a side stream joined at exit).
        keepalive: gate -> values the gate must hold alive (deferred frees).
        first_event: the first event index new records use.
        exact: whether the search proved the wait count minimal (see module docs).
    """

    assignment: StreamAssignment
    waits: list[PlannedWait] = field(default_factory=list)
    records: list[PlannedRecord] = field(default_factory=list)
    protect: dict = field(default_factory=lambda: defaultdict(list))
    keepalive: dict = field(default_factory=lambda: defaultdict(list))
    first_event: int = 0
    exact: bool = True

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


class _Clocks:
    """Every stream's vector clock, and the clocks existing records captured."""

    __slots__ = ("vc", "events")

    def __init__(self, vc: list[list[int]], events: dict[int, list[int]]):
        self.vc, self.events = vc, events

    def copy(self) -> _Clocks:
        return _Clocks([list(r) for r in self.vc], {e: list(c) for e, c in self.events.items()})

    def dominates(self, other: _Clocks) -> bool:
        return all(x >= y for r, o in zip(self.vc, other.vc) for x, y in zip(r, o)) and all(
            e in self.events and all(x >= y for x, y in zip(self.events[e], c)) for e, c in other.events.items()
        )


@dataclass
class _Demand:
    stream: int  # slot
    needs: list[tuple[Node, Node | None]]
    before: Node
    on_gate: object  # callable(gate, value)


class _Planner:
    def __init__(self, a: StreamAssignment, dealloc: bool):
        self.a, self.dealloc = a, dealloc
        self.streams = a.streams
        self.slot = {s: i for i, s in enumerate(self.streams)}
        self.pos: dict[Node, int] = {}
        counts = [0] * len(self.streams)
        for n in a.nodes:
            i = self.slot[a.stream[n]]
            counts[i] += 1
            self.pos[n] = counts[i]
        self.plan = SyncPlan(a, first_event=first_free_event(a))

    # -- shared by the search and the walk ------------------------------------------------
    def _fresh(self) -> _Clocks:
        n = len(self.streams)
        return _Clocks([[0] * n for _ in range(n)], {})

    def _issue(self, clk: _Clocks, node: Node, gained=None) -> None:
        """Advance ``clk`` past ``node``; ``gained(b, slot, value, gate)`` hears of new knowledge."""
        b = self.slot[self.a.stream[node]]
        mine = clk.vc[b]
        mine[b] += 1
        call = self.a.syncs.get(node)
        if call is None:
            return
        src = None
        if call.target is ops.RECORD_EVENT:
            clk.events[call.args[0]] = list(mine)
        elif call.target is ops.WAIT_EVENT:
            src = clk.events.get(call.args[0])
        elif call.target is ops.WAIT_STREAM:
            src = list(clk.vc[self.slot[call.args[1]]])
        # synchronize_* and sync_dealloc are honoured by verify, but the planner does not rely
        # on them: they cannot carry the data dependencies that keep the order under reordering.
        if src is not None:
            self._join(clk, b, src, node, gained)

    @staticmethod
    def _join(clk: _Clocks, b: int, src: list[int], gate, gained) -> None:
        mine = clk.vc[b]
        for i, v in enumerate(src):
            if v > mine[i]:
                mine[i] = v
                if gained is not None and i != b:
                    gained(b, i, v, gate)

    def _unmet(self, clk: _Clocks, d: _Demand) -> list[tuple[int, int]]:
        mine = clk.vc[d.stream]
        out = []
        for producer, _ in d.needs:
            s, p = self.slot[self.a.stream[producer]], self.pos[producer]
            if mine[s] < p:
                out.append((s, p))
        return out

    def _covers(self, clk: _Clocks, b: int, unmet: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        """Every set of source streams whose current clocks together cover ``unmet``, each
        member covering something (a wait that delivers nothing needed is never added)."""
        useful = [x for x in range(len(self.streams)) if x != b and any(clk.vc[x][s] >= p for s, p in unmet)]
        out = []
        for size in range(1, len(useful) + 1):
            for combo in itertools.combinations(useful, size):
                if all(max(clk.vc[x][s] for x in combo) >= p for s, p in unmet):
                    out.append(combo)
        return out

    def _events(self, reqs, values: list[CrossStreamValue]):
        """The walk: ("issue", node) and ("demand", _Demand) in issue order."""
        plan = self.plan
        by_consumer: dict[Node, list] = defaultdict(list)
        for r in reqs:
            by_consumer[r.after].append((r.before, r.value))
        held = self._already_held(values)
        for node in self.a.nodes:
            if node.op == "output":
                needs = by_consumer.get(node)
                if needs:
                    yield "demand", _Demand(
                        self.slot[self.a.stream[node]], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v))
                    )
                for cv in values:
                    if cv.value in held:
                        continue
                    # The value's stream waits for every reader before the value may be freed;
                    # the value rides on that wait, so it stays alive until the wait is issued.
                    readers = [(r, None) for rs in cv.readers.values() for r in rs]
                    yield "demand", _Demand(
                        self.slot[cv.stream], readers, node, lambda g, _v, v=cv.value: plan.keepalive[g].append(v)
                    )
                return
            needs = by_consumer.get(node)
            if needs:
                yield "demand", _Demand(
                    self.slot[self.a.stream[node]], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v))
                )
            yield "issue", node

    def _already_held(self, values: list[CrossStreamValue]) -> set[Node]:
        """Values an existing wait already keeps alive past all their other-stream readers."""
        if not values:
            return set()
        _, clock = vector_clocks(self.a)
        holders: dict[Node, list[Node]] = defaultdict(list)
        for node, call in self.a.syncs.items():
            if call.wrapper is not None and call.target in (ops.WAIT_EVENT, ops.WAIT_STREAM):
                for x in call.wrapper.args[2:]:
                    if isinstance(x, Node):
                        holders[self.a.root[x]].append(node)
        out = set()
        for cv in values:
            readers = [r for rs in cv.readers.values() for r in rs]
            for k in holders.get(cv.value, ()):
                if self.a.stream[k] == cv.stream and all(
                    clock[k][self.slot[self.a.stream[r]]] >= clock[r][self.slot[self.a.stream[r]]] for r in readers
                ):
                    out.add(cv.value)
        return out

    # -- 1. search: which sources each demand waits on ---------------------------------------
    def _search(self, events: list) -> list[tuple[int, ...]]:
        # A state's cost is (waits, relays): among plans with equally few waits, prefer those
        # that wait on the producer's own stream over a stream that merely knows about it
        # (a relay also makes the waiter wait for the relaying stream's unrelated work).
        frontier: list[tuple[tuple[int, int], _Clocks, tuple]] = [((0, 0), self._fresh(), ())]
        for kind, item in events:
            if kind == "issue":
                for _, clk, _ in frontier:
                    self._issue(clk, item)
                continue
            grown = []
            for cost, clk, hist in frontier:
                unmet = self._unmet(clk, item)
                if not unmet:
                    grown.append((cost, clk, (hist, ())))
                    continue
                direct = {s for s, _ in unmet}
                options = self._covers(clk, item.stream, unmet)
                for combo in options:
                    nxt = clk.copy() if len(options) > 1 else clk
                    for x in combo:
                        nxt.vc[item.stream] = [max(u, v) for u, v in zip(nxt.vc[item.stream], nxt.vc[x])]
                    relays = sum(1 for x in combo if x not in direct)
                    grown.append(((cost[0] + len(combo), cost[1] + relays), nxt, (hist, combo)))
            frontier = self._prune(grown)
        best = min(frontier, key=lambda t: t[0])[2]
        choices = []
        while best:
            best, combo = best
            choices.append(combo)
        return choices[::-1]

    def _prune(self, states: list) -> list:
        if len(states) == 1:
            return states
        states.sort(key=lambda t: (t[0], -sum(map(sum, t[1].vc))))
        kept: list = []
        for st in states:
            if not any(k[0][0] <= st[0][0] and k[0][1] <= st[0][1] and k[1].dominates(st[1]) for k in kept):
                kept.append(st)
        if len(kept) > FRONTIER_LIMIT:
            self.plan.exact = False
            kept = kept[:FRONTIER_LIMIT]
        return kept

    # -- 2. walk: place the chosen waits, track which gate each consumer relies on ----------
    def _walk(self, events: list, choices: list[tuple[int, ...]]) -> None:
        n = len(self.streams)
        clk = self._fresh()
        cover_t = [[[] for _ in range(n)] for _ in range(n)]  # thresholds, increasing
        cover_g = [[[] for _ in range(n)] for _ in range(n)]  # the gate that raised it
        self.gate_pos: dict = {}
        self.item_at: list[dict[float, object]] = [{} for _ in range(n)]
        self.existing_records: list[list[tuple[int, Node, int]]] = [[] for _ in range(n)]
        record_count: dict[int, int] = defaultdict(int)
        for call in self.a.syncs.values():
            if call.target is ops.RECORD_EVENT:
                record_count[call.args[0]] += 1

        def gained(b, i, v, gate):
            cover_t[b][i].append(v)
            cover_g[b][i].append(gate)

        def covering_gate(b, s, p):
            return cover_g[b][s][bisect.bisect_left(cover_t[b][s], p)]

        relied: dict = {}

        def rely(gate, s, p):
            if not isinstance(gate, PlannedWait):
                return  # an existing sync: its record is where it is
            key = (id(gate), s)
            if relied.get(key, -1) >= p:
                return
            relied[key] = p
            gate.used = True
            x = self.slot[gate.source]
            if x == s:
                gate.required = max(gate.required, p)
                return
            inner = covering_gate(x, s, p)  # how the source knew: it must record after that
            gate.required = max(gate.required, self.gate_pos[inner])
            rely(inner, s, p)

        in_gap: dict[tuple[int, int], int] = defaultdict(int)  # waits already between two nodes
        picks = iter(choices)
        for kind, item in events:
            if kind == "issue":
                b = self.slot[self.a.stream[item]]
                self._issue(clk, item, gained)
                p = self.pos[item]
                self.item_at[b][p] = item
                self.gate_pos[item] = p
                call = self.a.syncs.get(item)
                if call is not None and call.target is ops.RECORD_EVENT and record_count[call.args[0]] == 1:
                    self.existing_records[b].append((p, item, call.args[0]))
                continue
            b = item.stream
            combo = next(picks)
            if self._unmet(clk, item):
                base = clk.vc[b][b]
                for x in combo:
                    in_gap[b, base] += 1
                    w = PlannedWait(
                        stream=self.streams[b],
                        source=self.streams[x],
                        before=item.before,
                        # strictly between nodes base and base + 1 of the stream, in walk order
                        position=base + in_gap[b, base] / (len(self.streams) * (len(self.a.nodes) + 2)),
                        available=clk.vc[x][x],
                    )
                    self.item_at[b][w.position] = w
                    self.gate_pos[w] = w.position
                    self.plan.waits.append(w)
                    self._join(clk, b, list(clk.vc[x]), w, gained)
            for producer, value in item.needs:
                s, p = self.slot[self.a.stream[producer]], self.pos[producer]
                gate = covering_gate(b, s, p)
                rely(gate, s, p)
                item.on_gate(gate, value)

    def run(self) -> SyncPlan:
        reqs, values = requirements(self.a)
        events = list(self._events(reqs, values if self.dealloc else []))
        choices = self._search(events)
        self._walk(events, choices)
        self._place_records()
        return self.plan

    def _place_records(self) -> None:
        plan = self.plan
        plan.waits = [w for w in plan.waits if w.used]
        shared: dict[tuple[int, float], PlannedRecord] = {}
        for w in plan.waits:
            x = self.slot[w.source]
            reuse = [
                (p, n, ev)
                for p, n, ev in self.existing_records[x]
                if w.required <= p <= w.available and self.a.position[n] < self.a.position[w.before]
            ]
            if reuse:
                p, n, ev = min(reuse, key=lambda t: t[0])
                w.record = PlannedRecord(w.source, ev, n, existing=n)
                continue
            key = (x, w.required)
            if key not in shared:
                anchor = self.item_at[x].get(w.required)
                shared[key] = PlannedRecord(w.source, plan.first_event + len(plan.records), anchor)
                plan.records.append(shared[key])
            w.record = shared[key]


def plan_syncs(a: StreamAssignment, dealloc: bool = True) -> SyncPlan:
    """The records and waits that make the graph read into ``a`` race-free; edits nothing.

    ``dealloc=False`` leaves out the free points (the waits that defer frees of values read
    on other streams), to count the ordering waits alone.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return x.cos() + y
    >>> plan = plan_syncs(sp.read_streams(make_fx(f)(torch.ones(2))))
    >>> [(w.source, w.stream, w.before.name) for w in plan.waits], plan.exact
    ([(0, 1, 'sin'), (1, 0, 'add'), (0, 1, 'output')], True)
    """
    return _Planner(a, dealloc).run()

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
import operator
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
    """What each stream knows of every other stream, and the clocks existing records captured.

    ``k[b * n + s]`` is how many nodes of stream ``s`` stream ``b`` knows to be complete.
    A stream's knowledge of itself is how many of its nodes have been issued, the same in
    every state of the search, so it lives outside (``issued``) and the diagonal is unused:
    issuing a compute node then costs nothing per state.
    """

    __slots__ = ("k", "n", "events")

    def __init__(self, n: int, k: list[int] | None = None, events: dict[int, list[int]] | None = None):
        self.n = n
        self.k = k if k is not None else [0] * (n * n)
        self.events = events if events is not None else {}

    def copy(self) -> _Clocks:
        return _Clocks(self.n, list(self.k), {e: list(c) for e, c in self.events.items()})

    def know(self, issued: list[int], b: int, s: int) -> int:
        return issued[s] if s == b else self.k[b * self.n + s]

    def row(self, issued: list[int], b: int) -> list[int]:
        r = self.k[b * self.n : (b + 1) * self.n]
        r[b] = issued[b]
        return r

    def join(self, b: int, src: list[int], gate=None, gained=None) -> None:
        k, base = self.k, b * self.n
        for i, v in enumerate(src):
            if i != b and v > k[base + i]:
                k[base + i] = v
                if gained is not None:
                    gained(b, i, v, gate)

    def dominates(self, other: _Clocks) -> bool:
        return all(map(operator.ge, self.k, other.k)) and all(
            e in self.events and all(map(operator.ge, self.events[e], c)) for e, c in other.events.items()
        )

    def total(self) -> int:
        return sum(self.k)


class _StillNeeded:
    """Which positions of each stream some demand not yet reached still needs.

    Knowledge that no remaining demand can test is irrelevant: a clock entry ``v`` of stream
    ``s`` behaves exactly like the largest still-needed position ``<= v``. Rounding every
    state down to that (:meth:`canon`) makes states that differ only in irrelevant knowledge
    equal, which keeps the search's frontier small. Union-find over positions gives the
    "largest still-needed position <= v" query in near-constant time.
    """

    def __init__(self, counts: list[int], demands: list[_Demand]):
        self.parent = [list(range(c + 1)) for c in counts]  # position 0 is always "needed"
        last: dict[tuple[int, int], int] = {}
        for k, d in enumerate(demands):
            for sp in d.slots:
                last[sp] = k
        self.retire: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for sp, k in last.items():
            self.retire[k].append(sp)
        needed = {sp for sp in last}
        for s, c in enumerate(counts):
            for p in range(1, c + 1):
                if (s, p) not in needed:
                    self.parent[s][p] = p - 1

    def find(self, s: int, v: int) -> int:
        parent = self.parent[s]
        root = v
        while parent[root] != root:
            root = parent[root]
        while parent[v] != root:
            parent[v], v = root, parent[v]
        return root

    def done(self, k: int) -> None:
        """Demand ``k`` is planned: positions no later demand needs stop mattering."""
        for s, p in self.retire.pop(k, ()):
            self.parent[s][p] = p - 1

    def canon(self, clk: _Clocks) -> tuple:
        n = clk.n
        k = clk.k
        for i in range(n * n):
            b, s = divmod(i, n)
            if b != s and k[i]:
                k[i] = self.find(s, k[i])
        for c in clk.events.values():
            for s, v in enumerate(c):
                if v:
                    c[s] = self.find(s, v)
        return (tuple(k), tuple(sorted((e, tuple(c)) for e, c in clk.events.items())))


@dataclass
class _Demand:
    stream: int  # slot
    needs: list[tuple[Node, Node | None]]
    before: Node
    on_gate: object  # callable(gate, value)
    slots: list[tuple[int, int]] = field(default_factory=list)  # (stream slot, position) per need


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
        return _Clocks(len(self.streams))

    def _sync(self, clk: _Clocks, issued: list[int], node: Node, call, gained=None) -> None:
        """Apply an existing sync op of the graph to ``clk`` (``issued`` already counts it)."""
        b = self.slot[self.a.stream[node]]
        if call.target is ops.RECORD_EVENT:
            clk.events[call.args[0]] = clk.row(issued, b)
        elif call.target is ops.WAIT_EVENT:
            src = clk.events.get(call.args[0])
            if src is not None:
                clk.join(b, src, node, gained)
        elif call.target is ops.WAIT_STREAM:
            clk.join(b, clk.row(issued, self.slot[call.args[1]]), node, gained)
        # synchronize_* and sync_dealloc are honoured by verify, but the planner does not rely
        # on them: they cannot carry the data dependencies that keep the order under reordering.

    def _unmet(self, clk: _Clocks, issued: list[int], d: _Demand) -> list[tuple[int, int]]:
        b = d.stream
        return [(s, p) for s, p in d.slots if clk.know(issued, b, s) < p]

    def _covers(self, clk: _Clocks, issued: list[int], b: int, unmet: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        """Every set of source streams whose current clocks together cover ``unmet``, each
        member covering something (a wait that delivers nothing needed is never added)."""
        know = clk.know
        useful = [x for x in range(len(self.streams)) if x != b and any(know(issued, x, s) >= p for s, p in unmet)]
        if len(useful) == 1:
            return [tuple(useful)] if all(know(issued, useful[0], s) >= p for s, p in unmet) else []
        out = []
        for size in range(1, len(useful) + 1):
            for combo in itertools.combinations(useful, size):
                if all(max(know(issued, x, s) for x in combo) >= p for s, p in unmet):
                    out.append(combo)
        return out

    def _demand(self, stream: int, needs, before: Node, on_gate) -> _Demand:
        slots = [(self.slot[self.a.stream[n]], self.pos[n]) for n, _ in needs]
        return _Demand(self.slot[stream], needs, before, on_gate, slots)

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
                    yield "demand", self._demand(
                        self.a.stream[node], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v))
                    )
                for cv in values:
                    if cv.value in held:
                        continue
                    # The value's stream waits for every reader before the value may be freed;
                    # the value rides on that wait, so it stays alive until the wait is issued.
                    readers = [(r, None) for rs in cv.readers.values() for r in rs]
                    yield "demand", self._demand(
                        cv.stream, readers, node, lambda g, _v, v=cv.value: plan.keepalive[g].append(v)
                    )
                return
            needs = by_consumer.get(node)
            if needs:
                yield "demand", self._demand(
                    self.a.stream[node], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v))
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
        issued = [0] * len(self.streams)
        counts = [0] * len(self.streams)
        for n in self.a.nodes:
            counts[self.slot[self.a.stream[n]]] += 1
        demands = [item for kind, item in events if kind == "demand"]
        still = _StillNeeded(counts, demands)
        k = 0
        frontier: list[tuple[tuple[int, int], _Clocks, tuple]] = [((0, 0), self._fresh(), ())]
        for kind, item in events:
            if kind == "issue":
                issued[self.slot[self.a.stream[item]]] += 1
                call = self.a.syncs.get(item)
                if call is not None:
                    for _, clk, _ in frontier:
                        self._sync(clk, issued, item, call)
                continue
            grown = []
            b = item.stream
            for cost, clk, hist in frontier:
                unmet = self._unmet(clk, issued, item)
                if not unmet:
                    grown.append((cost, clk, (hist, ())))
                    continue
                direct = {s for s, _ in unmet}
                options = self._covers(clk, issued, b, unmet)
                for combo in options:
                    nxt = clk.copy() if len(options) > 1 else clk
                    for x in combo:
                        nxt.join(b, clk.row(issued, x))
                    relays = sum(1 for x in combo if x not in direct)
                    grown.append(((cost[0] + len(combo), cost[1] + relays), nxt, (hist, combo)))
            still.done(k)
            k += 1
            frontier = self._prune(grown, still)
        best = min(frontier, key=lambda t: t[0])[2]
        choices = []
        while best:
            best, combo = best
            choices.append(combo)
        return choices[::-1]

    def _prune(self, states: list, still: _StillNeeded) -> list:
        if len(states) == 1:
            return states
        states.sort(key=lambda t: (t[0], -t[1].total()))
        seen = set()
        unique = []
        for st in states:  # equal relevant knowledge: keep the cheapest
            key = still.canon(st[1])
            if key not in seen:
                seen.add(key)
                unique.append(st)
        kept: list = []
        for st in unique:
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
        issued = [0] * n
        picks = iter(choices)
        for kind, item in events:
            if kind == "issue":
                b = self.slot[self.a.stream[item]]
                issued[b] += 1
                p = self.pos[item]
                self.item_at[b][p] = item
                self.gate_pos[item] = p
                call = self.a.syncs.get(item)
                if call is not None:
                    self._sync(clk, issued, item, call, gained)
                    if call.target is ops.RECORD_EVENT and record_count[call.args[0]] == 1:
                        self.existing_records[b].append((p, item, call.args[0]))
                continue
            b = item.stream
            combo = next(picks)
            if self._unmet(clk, issued, item):
                base = issued[b]
                for x in combo:
                    in_gap[b, base] += 1
                    w = PlannedWait(
                        stream=self.streams[b],
                        source=self.streams[x],
                        before=item.before,
                        # strictly between nodes base and base + 1 of the stream, in walk order
                        position=base + in_gap[b, base] / (len(self.streams) * (len(self.a.nodes) + 2)),
                        available=issued[x],
                    )
                    self.item_at[b][w.position] = w
                    self.gate_pos[w] = w.position
                    self.plan.waits.append(w)
                    clk.join(b, clk.row(issued, x), w, gained)
            for (s, p), (_, value) in zip(item.slots, item.needs):
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

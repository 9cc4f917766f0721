"""The sync planner: which records and waits make a graph race-free, with the fewest waits (pure).

It walks the graph in issue order with one vector clock per stream, honouring the syncs the
graph already has. At each *demand* (a read of another stream's value, the output, the free
point of a value read on another stream) it adds waits for the newest node of each chosen
producer stream, with the record right after that node. Which producers to wait on is searched:
a Pareto frontier of (waits so far, clocks) states (:mod:`streampass.transform.frontier`), so
the result is the fewest waits for the given node order; ``SyncPlan.exact`` says whether the
frontier stayed within its bound (docs/plan.md has the argument)."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict

import torch.fx

from streampass import ops
from streampass.analysis.dag import StreamDAG
from streampass.analysis.hazards import dealloc_safe, keepalive_waits, recorded_streams
from streampass.analysis.reading import StreamAssignment
from streampass.analysis.requirements import CrossStreamValue, requirements
from streampass.transform.frontier import Clocks, Demand, StillNeeded, covering_sets, does_no_work
from streampass.transform.plan import (
    PlannedRecord,
    PlannedWait,
    SyncPlan,
    check_event_indices,
    first_free_event,
    join_free_points,
)

Node = torch.fx.Node

#: Most states the search keeps per step (with up to 6 streams; fewer with more, as comparing two
#: states costs streams**2); past it the plan is still valid, just not proven minimal.
FRONTIER_LIMIT = 256
PRUNE_EVERY = 64  # demands between prunes of a frontier that did not change
#: Beyond six streams: most streams a demand tries in every combination beyond those it must wait on
#: (2**k sets), and the most sets all states of the frontier try together; past either, one greedy set
OPTIONAL_LIMIT, OPTIONS_BUDGET = 8, 2048


class Planner:
    def __init__(self, a: StreamAssignment, dealloc: bool, min_event: int = 0):
        self.a, self.dealloc = a, dealloc
        self.streams = a.streams
        self.slot = {s: i for i, s in enumerate(self.streams)}
        self.pos: dict[Node, int] = {}
        self.on: list[list[Node]] = [[] for _ in self.streams]  # per stream slot: its nodes, in order
        for n in a.nodes:
            on = self.on[self.slot[a.stream[n]]]
            on.append(n)
            self.pos[n] = len(on)
        self.counts = [len(on) for on in self.on]
        self.plan = SyncPlan(a, first_event=max(first_free_event(a), min_event))
        n = len(self.streams)  # up to six streams, every set (the budget covers 256 states of 2**n)
        self.limit = max(1, min(FRONTIER_LIMIT, FRONTIER_LIMIT * 36 // n**2))
        self.optional, self.budget = (n, 2 ** (n + 9)) if n <= 6 else (OPTIONAL_LIMIT, OPTIONS_BUDGET)
        self.record_at: dict[tuple[int, int], tuple[Node, int]] = {}
        self._ends: dict[tuple[int, int], int] = {}
        recorded = Counter(call.args[0] for call in a.syncs.values() if call.target is ops.RECORD_EVENT)
        self._once = {e for e, k in recorded.items() if k == 1}  # events the graph records once

    # -- shared by the search and the walk ------------------------------------------------
    def _fresh(self) -> Clocks:
        return Clocks(len(self.streams))

    def _sync(self, clk: Clocks, issued: list[int], node: Node, call, gained=None) -> None:
        """Apply an existing sync op of the graph to ``clk`` (``issued`` already counts it)."""
        b = self.slot[self.a.stream[node]]
        if call.target is ops.RECORD_EVENT:
            clk.events[call.args[0]] = clk.row(issued, b)
        elif call.target is ops.WAIT_EVENT:
            src = clk.events.get(call.args[0])
            if src is not None:
                clk.join(issued, b, src, node, gained)
        elif call.target is ops.WAIT_STREAM:
            clk.join(issued, b, clk.row(issued, self.slot[call.args[1]]), node, gained)
        # synchronize_* and sync_dealloc are honoured by verify, but the planner does not rely
        # on them: they cannot carry the data dependencies that keep the order under reordering.

    def _unmet(self, clk: Clocks, issued: list[int], d: Demand) -> list[tuple[int, int]]:
        b, k = d.stream, clk.k
        base = b * clk.n  # clk.know, inlined: this runs for every demand of every search state
        return [(s, p) for s, p in d.slots if (issued[s] if s == b else k[base + s]) < p]

    def _record_point(self, a: int, p: int, issued: list[int]) -> int:
        """Where a wait for stream a's node p records: past the nodes after p that do no work
        (an existing record there is reused), but never past what a has issued so far."""
        end = self._ends.get((a, p))
        if end is None:
            end = self._stretch_end(a, p)
        return min(end if p < end else p, issued[a])

    def _sources(self, clk: Clocks, issued: list[int], d: Demand, unmet) -> dict[int, int]:
        """Candidate streams to wait on, each with the point its record would sit at.

        Within the graph only producers qualify, recorded right after the newest node the
        demand needs from them: a wait never holds the stream back for anything else. At
        exit (the output, free points) nothing runs after the wait on that stream, so any
        stream may be waited on at its last node, carrying whatever it knows by then.
        """
        if d.at_exit:
            return {
                x: self._record_point(x, issued[x], issued) for x in range(len(issued)) if x != d.stream and issued[x]
            }
        newest: dict[int, int] = {}
        for s, p in unmet:
            newest[s] = max(newest.get(s, 0), p)
        return {a: self._record_point(a, p, issued) for a, p in newest.items()}

    def _options(self, clk: Clocks, issued: list[int], d: Demand, unmet, limit: int) -> list:
        """Every set of candidate streams whose records together cover ``unmet``, with the
        knowledge each brings (:func:`frontier.covering_sets`; past ``limit``, one greedy set)."""
        points = self._sources(clk, issued, d, unmet)
        snaps = {a: clk.snap(a, p) for a, p in points.items()}
        useful = sorted(a for a, r in snaps.items() if any(r[s] >= p for s, p in unmet))
        options, exact = covering_sets(snaps, useful, unmet, limit)
        self.plan.exact &= exact
        return options

    def _demand(self, stream: int, needs, before: Node, on_gate, free_point: bool = False) -> Demand:
        slots = [(self.slot[self.a.stream[n]], self.pos[n]) for n, _ in needs]
        return Demand(
            self.slot[stream], needs, before, on_gate, slots, at_exit=before.op == "output", free_point=free_point
        )

    def _events(self, reqs, values: list[CrossStreamValue]) -> list:
        """The walk, in issue order: ``("demand", Demand, issued)`` and, for each stream op the
        graph already has, ``("sync", (node, call), issued)``, where ``issued`` counts each
        stream's nodes issued so far (the op itself included). The other nodes only advance
        those counts, so they are folded into them."""
        plan = self.plan
        by_consumer: dict[Node, list] = defaultdict(list)
        for r in reqs:
            by_consumer[r.after].append((r.before, r.value))
        held = self._already_held(values)
        slot, stream_of, syncs = self.slot, self.a.stream, self.a.syncs
        issued = [0] * len(self.streams)
        out: list = []
        for node in self.a.nodes:
            if node.op == "output":
                now = tuple(issued)
                # Free points first, then the exit joins: a side stream's free-point waits come
                # before the ambient stream's last wait on it (capturable, docs/plan.md §6).
                for cv in values:
                    if cv.value in held:
                        continue
                    # The value's stream waits for every reader before the value may be freed;
                    # the value rides on that wait, so it stays alive until the wait is issued.
                    readers = [(r, None) for rs in cv.readers.values() for r in rs]
                    demand = self._demand(
                        cv.stream,
                        readers,
                        node,
                        lambda g, _v, v=cv.value: plan.keepalive[g].append(v),
                        free_point=True,
                    )
                    out.append(("demand", demand, now))
                needs = by_consumer.get(node)
                if needs:
                    demand = self._demand(
                        stream_of[node], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v))
                    )
                    out.append(("demand", demand, now))
                return out
            needs = by_consumer.get(node)
            if needs:
                demand = self._demand(stream_of[node], needs, node, lambda g, v, c=node: plan.protect[g].append((c, v)))
                out.append(("demand", demand, tuple(issued)))
            issued[slot[stream_of[node]]] += 1
            call = syncs.get(node)
            if call is not None:
                out.append(("sync", (node, call), tuple(issued)))
        return out

    def _already_held(self, values: list[CrossStreamValue]) -> set[Node]:
        """Values the graph's own syncs already keep safe from early reuse (as verify judges)."""
        if not values or not self.a.syncs:  # only a wait or a record_stream of the graph can
            return set()
        dag = StreamDAG(self.a)
        keep, recorded = keepalive_waits(dag), recorded_streams(self.a)
        return {cv.value for cv in values if dealloc_safe(dag, cv, keep, recorded)}

    # -- 1. search: which sources each demand waits on ---------------------------------------
    def _search(self, events: list) -> list[tuple[int, ...]]:
        still = StillNeeded(self.counts, [item for kind, item, _ in events if kind == "demand"])
        k = pruned = 0
        frontier: list[tuple[int, Clocks, tuple]] = [(0, self._fresh(), ())]
        self._shared = [1] * len(self.streams)  # history entries all states have in common
        stale = False  # whether a sync of the graph may have grown a history since _shared was taken
        for kind, item, issued in events:
            if kind == "sync":
                node, call = item
                for _, clk, _ in frontier:
                    self._sync(clk, issued, node, call)
                stale = True
                continue
            if len(frontier) == 1:
                cost, clk, hist = frontier[0]
                unmet = self._unmet(clk, issued, item)
                if not unmet:  # the common case: one state, nothing to wait for
                    frontier = [(cost, clk, (hist, ()))]
                    still.done(k)
                    k += 1
                    pruned = k
                    if stale:  # else nothing changed it since it was taken
                        self._shared = [len(h) for h in clk.hpos]
                        stale = False
                    continue
                states = [(cost, clk, hist, unmet)]
            else:
                states = [(cost, clk, hist, self._unmet(clk, issued, item)) for cost, clk, hist in frontier]
            grown = []
            b = item.stream
            moved = False
            limit = min(self.optional, (self.budget // len(states)).bit_length() - 1)
            for cost, clk, hist, unmet in states:
                if not unmet:
                    grown.append((cost, clk, (hist, ())))
                    continue
                moved = True
                options = self._options(clk, issued, item, unmet, limit)
                for combo, joined in options:
                    nxt = clk.copy() if len(options) > 1 else clk
                    nxt.join(issued, b, joined)
                    grown.append((cost + len(combo), nxt, (hist, combo)))
            still.done(k)
            k += 1
            if moved or len(grown) == 1 or k - pruned >= PRUNE_EVERY:
                frontier = self._prune(grown, still)
                pruned = k
            else:
                # No state changed, so none newly dominates another; only retired positions
                # could make two equal, and that can wait (extra states never change the optimum).
                frontier = grown
            if len(frontier) == 1:
                self._shared = [len(h) for h in frontier[0][1].hpos]
                stale = False
        best = min(frontier, key=lambda t: t[0])[2]
        choices = []
        while best:
            best, combo = best
            choices.append(combo)
        return choices[::-1]

    def _prune(self, states: list, still: StillNeeded) -> list:
        if len(states) == 1:
            return states
        states.sort(key=lambda t: (t[0], -t[1].total()))
        best = states[0]
        if all(best[0] <= st[0] and best[1].dominates(st[1], self._shared) for st in states[1:]):
            return [best]  # the common case, without rounding every state
        if self.limit == 1:  # (a hundred streams and more) one state: no rounding either
            self.plan.exact = False
            return [best]
        seen = set()
        unique = []
        for st in states:  # equal relevant knowledge: keep the cheapest
            key = still.canon(st[1], self._shared)
            if key not in seen:
                seen.add(key)
                unique.append(st)
        kept: list = []
        for st in unique:  # past the limit the rest is cut anyway: stop (each test costs all of kept)
            if not any(k[0] <= st[0] and k[1].dominates(st[1], self._shared) for k in kept):
                kept.append(st)
                if len(kept) > self.limit:
                    break
        if len(kept) > self.limit:
            self.plan.exact = False
            kept = kept[: self.limit]
        return kept

    # -- 2. walk: place the chosen waits, track which gate each consumer relies on ----------
    def _walk(self, events: list, choices: list[tuple[int, ...]]) -> None:
        n = len(self.streams)
        clk = self._fresh()
        cover_t = [[[] for _ in range(n)] for _ in range(n)]  # thresholds, increasing
        cover_g = [[[] for _ in range(n)] for _ in range(n)]  # the gate that raised it

        def gained(b, i, v, gate):
            cover_t[b][i].append(v)
            cover_g[b][i].append(gate)

        def covering_gate(b, s, p):
            gate = cover_g[b][s][bisect.bisect_left(cover_t[b][s], p)]
            if isinstance(gate, PlannedWait):
                gate.used = True
            return gate

        picks = iter(choices)
        for kind, item, issued in events:
            if kind == "sync":
                node, call = item
                self._sync(clk, issued, node, call, gained)
                continue
            b = item.stream
            combo = next(picks)
            points = self._sources(clk, issued, item, self._unmet(clk, issued, item)) if combo else {}
            waits = []
            for a in combo:
                point = points[a]
                w = PlannedWait(self.streams[b], self.streams[a], item.before, point, free_point=item.free_point)
                waits.append((w, clk.snap(a, point)))
            for w, snap in waits:  # all snapshots taken before any join: the waits are independent
                self.plan.waits.append(w)
                clk.join(issued, b, snap, w, gained)
            for (s, p), (_, value) in zip(item.slots, item.needs):
                item.on_gate(covering_gate(b, s, p), value)

    def run(self, reqs=None) -> SyncPlan:
        reqs, values = reqs if reqs is not None else requirements(self.a)
        events = self._events(reqs, values if self.dealloc else [])
        choices = self._search(events)
        self._walk(events, choices)
        self._place_records()
        join_free_points(self.plan)
        return self.plan

    def _stretch_end(self, s: int, p: int) -> int:
        """Where a record for "stream s up to its node p" can go without waiting for more work.

        Nodes that do no work on the device (inputs, attributes, getitems, records) can be
        passed over: a *stretch* is a node that works (or the stream's start) and the
        passable nodes after it, and the record point for any of them is the stretch's last
        node, so every input is covered by one record at entry. An existing record of the
        graph (of an event recorded once) in the stretch is reused instead of adding one: its
        position is the stretch's end. Computed only for the stretches the walk asks about
        (``_ends`` keeps them).
        """
        on, syncs = self.on[s], self.a.syncs
        first = p
        while first > 1 and _passable(on[first - 1], syncs):
            first -= 1
        last = p
        while last < len(on) and _passable(on[last], syncs):  # on[last] is position last + 1
            last += 1
        end = last
        for q in range(first, last + 1):
            call = syncs.get(on[q - 1])
            if call is not None and call.target is ops.RECORD_EVENT and call.args[0] in self._once:
                end = q
                self.record_at[s, q] = (on[q - 1], call.args[0])
                break
        for q in range(first, last + 1):
            self._ends[s, q] = end
        return end

    def _place_records(self) -> None:
        plan = self.plan
        plan.waits = [w for w in plan.waits if w.used]
        shared: dict[tuple[int, int], PlannedRecord] = {}
        for w in plan.waits:
            a = self.slot[w.source]
            key = (a, w.point)
            if key not in shared:
                if key in self.record_at:
                    node, ev = self.record_at[key]
                    shared[key] = PlannedRecord(w.source, ev, node, existing=node)
                else:
                    shared[key] = PlannedRecord(w.source, plan.next_event, self.on[a][w.point - 1])
                    plan.records.append(shared[key])
            w.record = shared[key]


def _passable(n: Node, syncs) -> bool:
    """Whether a record may be placed past ``n``: it does no work on the device, or records."""
    call = syncs.get(n)
    if call is not None:
        return call.target is ops.RECORD_EVENT
    return n.op in ("placeholder", "get_attr") or does_no_work(n)


def plan_syncs(a: StreamAssignment, dealloc: bool = True, reqs=None, min_event: int = 0) -> SyncPlan:
    """The records and waits that make the graph read into ``a`` race-free; edits nothing.

    ``dealloc=False`` leaves out the free points (the waits that defer frees of values read
    on other streams), to count the ordering waits alone. ``reqs``: the graph's
    :func:`~streampass.analysis.requirements.requirements`, if already computed. New events
    take indices from ``min_event`` up if that is above the graph's own (for bodies).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return x.cos() + y
    >>> plan = plan_syncs(sp.read_streams(make_fx(f)(torch.ones(2))))
    >>> [(w.source, w.stream, w.before.name) for w in plan.waits], plan.exact
    ([(0, 1, 'sin'), (1, 0, 'add'), (0, 1, 'output'), (1, 0, 'output')], True)

    Stream 1 reads ``x`` after the ambient stream's record at entry, the add waits for
    ``sin``, stream 1 waits for the add before ``sin`` may be freed, and the ambient stream
    joins stream 1 after that (capturable).
    """
    plan = Planner(a, dealloc, min_event).run(reqs)
    check_event_indices(a, plan.first_event, len(plan.records))
    return plan

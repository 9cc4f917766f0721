"""Price a candidate assignment without building it: the planner's sync plan for the candidate's
streams, played by the simulator as if :mod:`streampass.transform.apply` had inserted it.

This is what ``annotated_copy`` + ``streampass.run`` + ``simulate`` compute (the same planner,
the same simulator items, the same memory estimate; ``tests/test_assign_price.py`` checks they
agree on random graphs), less the edit, which is nine tenths of ``run``'s time: a candidate costs
a plan and a simulation of the graph's nodes, not a copied, rewritten and recompiled module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from operator import getitem

import torch.fx

from streampass import ops
from streampass.analysis.reading import StreamAssignment, annotated_stream
from streampass.analysis.requirements import Orderings, accesses
from streampass.assign.memory import LivePeak, ordering_deps
from streampass.ops import AMBIENT
from streampass.sim.cost import CostModel
from streampass.sim.player import Items, build_items, ideal_makespan, run_items
from streampass.sim.simulate import graph_steps, is_device_work
from streampass.transform.encoding import WRAPPABLE, last_work, readers
from streampass.transform.pipeline import attributes_to_hoist
from streampass.transform.plan import PlannedRecord, PlannedWait, SyncPlan
from streampass.transform.planner import plan_syncs

Node = torch.fx.Node


@dataclasses.dataclass(eq=False)
class Priced:
    """One candidate's price: the simulated makespan after its sync plan, the syncs, the memory."""

    makespan: float
    waits: int
    records: int
    peak_bytes: int
    plan: SyncPlan


class _Planned:
    """A sync of the plan, standing in for the node ``apply`` would make and for its call (the
    simulator reads a call's ``target`` and ``args``, and names a node in its messages)."""

    __slots__ = ("args", "index", "sync", "target")

    def __init__(self, index: int, sync: PlannedWait | PlannedRecord, target, args: tuple):
        self.index, self.sync, self.target, self.args = index, sync, target, args

    @property
    def name(self) -> str:
        return f"{'record' if self.target is ops.RECORD_EVENT else 'wait'}#{self.index}"


def restreamed(a: StreamAssignment, streams: Mapping[Node, int]) -> StreamAssignment:
    """``a`` with the given compute nodes moved: what :func:`streampass.read_streams` reads from a
    copy of the graph annotated with ``streams`` (views carry no annotation of their own, so
    their stream does not change; a getitem of a multi-output op moves with its op).

    >>> import torch, streampass as sp
    >>> gm = torch.fx.symbolic_trace(lambda x: x.sin() + x.cos())
    >>> a = sp.read_streams(gm)
    >>> sin = a.node_named("sin")
    >>> restreamed(a, {sin: 2}).streams, a.streams
    ([0, 2], [0])
    """
    stream = {**a.stream, **streams}
    for n, made_by in a.producer.items():
        if made_by in streams:
            stream[n] = streams[made_by]
    return dataclasses.replace(a, stream=stream)


def hoisted(a: StreamAssignment) -> StreamAssignment:
    """``a`` as :func:`streampass.read_streams` reads the graph after ``run`` has moved every
    ``get_attr`` up to the inputs (``transform.pipeline.hoist_attributes``): the order ``run``
    plans in. A moved ``get_attr`` is outside every fork/join region there: its own annotation
    or the ambient stream.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> class M(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__(); self.w = torch.nn.Parameter(torch.ones(2, 2))
    ...     def forward(self, x):
    ...         return x.sin() @ self.w
    >>> a = sp.read_streams(make_fx(M())(torch.ones(2, 2)))
    >>> [n.op for n in a.nodes][:3], [n.op for n in hoisted(a).nodes][:3]
    (['placeholder', 'call_function', 'get_attr'], ['placeholder', 'get_attr', 'call_function'])
    """
    lead, moved = attributes_to_hoist(a.nodes)
    if not moved:
        return a
    nodes = lead + moved + [n for n in a.nodes[len(lead) :] if n.op != "get_attr"]
    stream = dict(a.stream)
    for n in moved:
        stream[n] = annotated_stream(n) or AMBIENT
    return dataclasses.replace(a, nodes=nodes, stream=stream, position={n: i for i, n in enumerate(nodes)})


class Pricer:
    """Prices candidates of one graph: ``Pricer(a, model)(streams)`` -> :class:`Priced`.

    ``times``: node -> cost-model seconds of the device work and the stream ops (the nodes the
    simulator times), computed once (``known`` may pass the ones a
    :class:`~streampass.assign.dag.WorkGraph` already has, ``table`` its ``accesses`` and
    ``orderings`` its ``orderings``).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> gm = make_fx(lambda x, w: x @ w + x @ w.t())(m, m)
    >>> price = Pricer(sp.read_streams(gm), CostModel())
    >>> mm = price.a.node_named("mm")
    >>> one, two = price({}), price({mm: 1})
    >>> one.waits, two.waits > 0, two.makespan < one.makespan
    (0, True, True)
    """

    def __init__(
        self, a: StreamAssignment, model: CostModel, cpu_launch: bool = True, known=None, table=None, orderings=None
    ):
        self.a, self.model, self.cpu_launch = hoisted(a), model, cpu_launch
        self.cpu_floor: float | None = None
        self._index: tuple = (None, {})  # (work graph, node -> its place in it), for tight_bound
        self.peak = LivePeak(self.a)  # the memory estimate's static part, for every candidate
        # What each node reads and writes: the same for every candidate, and for every order.
        self.table = table or accesses(self.a)  # a WorkGraph built by hand has an empty one
        # and every ordering, filtered per candidate (they do not move with the get_attrs)
        self.orderings = orderings or Orderings(self.a, self.table)
        # Per node, in issue order: (node, its stream op, whether it is device work, whether the
        # edit's encoding counts it as work issued before the next sync): none depends on streams.
        syncs, kinds = self.a.syncs, ops.CALL_OPS
        self.static = [
            (n, syncs.get(n), n not in syncs and is_device_work(self.a, n), n.op in kinds and n.target is not getitem)
            for n in self.a.nodes
        ]
        self.readers = {n: readers(n) for n, _, _, counted in self.static if counted}  # for last_work
        # The simulator reads the time of device work and of stream ops only.
        known = known or {}
        needed = (n for n, call, work, _ in self.static if (work or call is not None) and n not in known)
        self.times: dict = {**model.node_times(needed), **known}

    def bound(self, w, streams: Mapping[Node, int]) -> float:
        """A lower bound on ``self(streams).makespan`` for a candidate over the whole
        :class:`~streampass.assign.dag.WorkGraph` ``w`` (node -> stream for every compute node),
        without planning: the larger of

        - the work on its streams with every cross-stream dependency met for free
          (:func:`~streampass.sim.player.ideal_makespan`), and
        - with ``cpu_launch``, the CPU's own time: every launch and existing sync, plus a record
          and a wait for each stream the graph did not have (its work must be joined back
          before the return, through an event of its own).
        """
        return self._bound(w, streams, new_streams=len(set(streams.values()) - set(self.a.streams)))

    def tight_bound(self, w, streams: Mapping[Node, int]) -> float:
        """:meth:`bound`, raised by the CPU time of the syncs any plan for ``streams`` must issue
        (with ``cpu_launch``, on a graph with no stream op of its own; else :meth:`bound`).

        A dependency ``u -> v`` across streams is met only through a chain of syncs issued
        between the two launches: a record on ``u``'s stream after ``u``, and a wait on ``v``'s
        stream before ``v``. So the waits on each stream stab the launch intervals of the
        dependencies into it, and the records on each stream those out of it. Stabbing each
        interval at its end, when no earlier point does, places the fewest points and each as
        late as possible: any plan has at least as many syncs before every launch. Each costs
        ``sync_cost`` of CPU time, so the work simulated as in ``ideal_makespan`` with those
        delays, and the CPU's total with at least that many syncs, are lower bounds.

        >>> import torch, streampass as sp
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> from streampass.assign.dag import work_graph
        >>> m = torch.empty(64, 64, device="meta")  # kernels shorter than their launch
        >>> a = sp.read_streams(make_fx(lambda x: (x.sin() + x.cos()).relu())(m))
        >>> w, price = work_graph(a, CostModel()), Pricer(a, CostModel())
        >>> sin, cos, add, relu = w.nodes
        >>> two = {sin: 0, cos: 1, add: 0, relu: 0}  # add waits for cos: a record and a wait
        >>> price.bound(w, two) < price.tight_bound(w, two) <= price(two).makespan
        True
        """
        if not self.cpu_launch or self.a.syncs:
            return self.bound(w, streams)
        profile = self.model.profile
        sync, launch = profile.sync_cost, profile.launch_overhead
        if self._index[0] is not w:
            self._index = (w, {n: i for i, n in enumerate(w.nodes)})
        index = self._index[1]
        last_wait: dict[int, int] = {}  # stream -> the compute index of its last wait (before it)
        last_record: dict[int, int] = {}
        points = 0
        cpu = makespan = 0.0
        end: dict = {}
        last_end: dict[int, float] = {}
        preds, times = w.preds, w.time
        for j, v in enumerate(w.nodes):
            s = streams[v]
            ready, wait, waited = 0.0, False, last_wait.get(s, -1)
            for u in preds.get(v, ()):
                e = end[u]
                if e > ready:
                    ready = e
                t = streams[u]
                if t != s:
                    i = index[u]
                    if waited <= i:
                        wait = True
                    if last_record.get(t, -1) <= i:
                        last_record[t] = j
                        points += 1
                        cpu += sync
            if wait:
                last_wait[s] = j
                points += 1
                cpu += sync
            t = times[v]
            issue = t if t < launch else launch
            cpu += issue
            start = last_end.get(s, cpu)
            if cpu > start:
                start = cpu
            if ready > start:
                start = ready
            end[v] = last_end[s] = e = start + (t - issue)
            if e > makespan:
                makespan = e
        new = len(set(streams.values()) - set(self.a.streams))  # as bound() counts them
        return max(cpu, makespan, self._cpu_floor() + max(points, 2 * new) * sync)

    def _cpu_floor(self) -> float:
        """What the simulator's CPU spends on the graph as it is (with ``cpu_launch``)."""
        if self.cpu_floor is None:
            items = build_items(graph_steps(self.a), self.times, self.model.profile, True, serial=False)
            self.cpu_floor = sum(it.cpu for it in items)
        return self.cpu_floor

    def floor(self, w) -> float:
        """A lower bound on :meth:`bound`, so on the price, of every candidate over ``w`` that
        is not the single-stream one: each node on a stream of its own, each dependency met for
        free, and with ``cpu_launch`` the CPU's time as the graph has it, plus a record and a
        wait if the graph has no side stream (every other candidate then adds one). When one
        stream already costs no more than this, no candidate can be faster.

        >>> import torch, streampass as sp
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> from streampass.assign.dag import work_graph
        >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
        >>> a = sp.read_streams(make_fx(lambda x, w: ((x @ w) @ w).relu())(m, m))  # a chain
        >>> price = Pricer(a, CostModel())
        >>> price.floor(work_graph(a, CostModel())) >= price({}).makespan
        True
        """
        own = {n: i for i, n in enumerate(w.nodes)}
        return self._bound(w, own, new_streams=0 if set(self.a.streams) - {AMBIENT} else 1)

    def _bound(self, w, streams: Mapping[Node, int], new_streams: int) -> float:
        """The larger of ``w``'s work on ``streams`` with dependencies met for free and, with
        ``cpu_launch``, the CPU's time on the graph as it is plus a record and a wait per new stream."""
        profile = self.model.profile
        ideal = ideal_makespan(w.nodes, streams, w.preds, w.time, profile, self.cpu_launch)
        if not self.cpu_launch:
            return ideal
        return max(ideal, self._cpu_floor() + 2 * new_streams * profile.sync_cost)

    def __call__(self, streams: Mapping[Node, int]) -> Priced:
        a = restreamed(self.a, streams) if streams else self.a
        plan = plan_syncs(a, reqs=self.orderings.for_streams(a))
        items, wraps, made = self._lay(a, plan)
        cpu_end = run_items(items)
        makespan = max([cpu_end] + [it.end for it in items])
        span = {it.node: (it.start, it.end) for it in items}
        holds = [(it.issued, deps) for it, deps in wraps]
        for gate in set(plan.keepalive) | set(plan.protect):
            end = made[gate].end if gate in made else span[gate][1] if gate in span else None
            if end is not None:
                values = list(plan.keepalive.get(gate, ())) + [
                    v for _, v in plan.protect.get(gate, ()) if v is not None
                ]
                holds.append((end, values))
        peak = self.peak(span, makespan, holds)
        return Priced(makespan, len(plan.waits), len(plan.records), peak, plan)

    def _lay(self, a: StreamAssignment, plan: SyncPlan):
        """``(items, wraps, made)``: the simulator's items for the graph as ``apply`` would leave
        it, for each sync the nodes its encoding orders it after (``(item, nodes)``, syncs with
        none left out), and each planned wait's item.

        The planned syncs go where the edit puts them: records at entry right after the leading
        inputs, each wait right before its node (in plan order), each other record right after
        its anchor or its wait; several inserted at one place each go right after it, so the last
        planned comes first. The encoding (``transform.apply``'s ``encode``) orders every sync of
        a stream after the work issued on that stream since its previous sync (a ``wait_stream``
        after the other stream's too), through the part of it nothing later in it reads
        (``last_work``), and the program holds those tensors until the sync is issued; an
        existing ``control_deps`` wrapper keeps its own dependencies.
        """
        before: dict[Node, list[PlannedWait]] = {}
        for w in plan.waits:
            before.setdefault(w.before, []).append(w)
        after: dict[object, list[PlannedRecord]] = {}
        entry: list[PlannedRecord] = []
        for r in plan.records:
            if r.after is not None:
                after.setdefault(r.after, []).insert(0, r)
            elif r.anchor is not None and r.anchor.op in ("placeholder", "get_attr"):
                entry.insert(0, r)
            else:
                after.setdefault(r.anchor, []).insert(0, r)
        out = Items(self.model.profile, self.cpu_launch)
        cost = self.model.profile.sync_cost  # of a planned record or wait
        wraps: list[tuple[object, list[Node]]] = []
        made: dict[PlannedWait, object] = {}
        pending: dict[int, list[Node]] = {}  # per stream: work issued since its last sync
        known, times = self.readers, self.times

        def sync(planned, target, event: int, stream: int):
            step = _Planned(len(out.items), planned, target, (event, stream))
            item = out.sync(step, step, stream, cost)
            deps = last_work(pending.pop(stream, []), known)
            if deps:
                wraps.append((item, deps))
            return item

        def record(r: PlannedRecord) -> None:
            sync(r, ops.RECORD_EVENT, r.event, r.stream)

        def wait(w: PlannedWait) -> None:
            made[w] = sync(w, ops.WAIT_EVENT, w.record.event, w.stream)
            for r in after.get(w, ()):
                record(r)

        leading = True
        stream_of = a.stream
        for node, call, work, counted in self.static:
            if leading and node.op not in ("placeholder", "get_attr"):
                leading = False
                for r in entry:
                    record(r)
            for w in before.get(node, ()):
                wait(w)
            s = stream_of[node]
            if call is None:
                if work:
                    out.kernel(node, s, times[node])
                if counted:
                    pending.setdefault(s, []).append(node)
            else:
                item = out.sync(node, call, s, times[node])
                if call.target in WRAPPABLE:
                    deps = last_work(pending.pop(s, []), known)
                    if call.target is ops.WAIT_STREAM:
                        deps = deps + last_work(pending.get(call.args[1], []), known)
                    if call.wrapper is not None:
                        deps = deps + ordering_deps(call.wrapper)
                    if deps:
                        wraps.append((item, deps))
            for r in after.get(node, ()):
                record(r)
        if leading:
            for r in entry:
                record(r)
        return out.items, wraps, made

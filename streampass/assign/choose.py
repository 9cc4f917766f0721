"""``streampass.assign_streams``: pick the stream of every compute node, by simulation.

Candidates (``assign.candidates``) are priced by the sync plan ``streampass.run`` would add for
them and a simulation of it (``assign.price``: the numbers a run on an annotated copy gives,
without the copy), in order of a lower bound that skips those that cannot win; the
single-stream assignment wins unless another is strictly faster. Never edits the user's graph;
:meth:`StreamChoice.apply` writes the choice.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch.fx

from streampass import collective_buckets
from streampass.analysis.bodies import streams_below
from streampass.analysis.reading import read_streams
from streampass.assign import candidates as cand
from streampass.assign.dag import WorkGraph, fixed_streams, work_graph
from streampass.assign.evaluate import Evaluation
from streampass.assign.fusion import fused_cost, fusion_groups, keep_together
from streampass.assign.search import Search
from streampass.assign.select import leaders, pick
from streampass.ops import AMBIENT
from streampass.sim.cost import CostModel, DeviceProfile
from streampass.sim.schedule import Schedule
from streampass.transform.pipeline import collector_paused


@dataclass
class StreamChoice:
    """What :func:`assign_streams` chose, and why.

    Attributes:
        streams: node name -> stream index for every compute node (0 = ambient), fixed ones included.
        evaluation: the winning candidate's :class:`~streampass.assign.evaluate.Evaluation`;
            :attr:`schedule` is its simulated :class:`~streampass.sim.schedule.Schedule` after
            ``streampass.run`` (syncs included).
        single_stream: the simulated makespan with every free node on the ambient stream.
        waits, records: the syncs ``run`` adds for this choice.
        peak_bytes: the estimated peak live memory of that schedule (``assign.memory``).
        candidate: the name of the candidate that won.
        candidates: every candidate priced, batch by batch (one stream, the candidates, the
            local search), each in order of lower bound (``Pricer.bound``).
        skipped: ``(name, lower bound)`` of the candidates not priced: even with free syncs
            they could not come within :data:`TIE` of the fastest. When no assignment at all
            could beat one stream (``Pricer.floor``), the others are not even built and this is
            ``[(ANY_OTHER, that bound)]``.
        reasons: node name -> why it is on the stream it is on (fixed, critical path, too small, ...).
        free: the nodes the choice may place (the rest are fixed by the graph).
        seconds: wall time of the whole search.
        model: the cost model the candidates were priced with (with ``keep_fusions``, the one
            that prices what inductor fuses as one kernel): simulate the applied graph with it
            to see the predicted schedule.
    """

    streams: dict[str, int]
    evaluation: Evaluation = field(repr=False)
    single_stream: float
    waits: int
    records: int
    peak_bytes: int
    candidate: str
    candidates: list[Evaluation] = field(repr=False)
    reasons: dict[str, str] = field(repr=False)
    free: frozenset[str] = field(repr=False)
    seconds: float = 0.0
    note: str = ""
    skipped: list[tuple[str, float]] = field(default_factory=list, repr=False)
    model: CostModel | None = field(default=None, repr=False)

    @property
    def makespan(self) -> float:
        """The simulated makespan of the graph after this choice and ``streampass.run``."""
        return self.evaluation.makespan

    @property
    def schedule(self) -> Schedule:
        """The whole simulated schedule after this choice and ``run`` (built on first use: a
        copy of the graph, ``run`` and :func:`streampass.simulate`)."""
        return self.evaluation.schedule

    @property
    def used(self) -> list[int]:
        """The streams the choice puts work on, ambient first."""
        return sorted(set(self.streams.values()) | {AMBIENT})

    def groups(self) -> dict[int, list[str]]:
        """Stream -> the nodes placed on it, in graph order."""
        out: dict[int, list[str]] = {}
        for name, s in self.streams.items():
            out.setdefault(s, []).append(name)
        return out

    def explain(self) -> str:
        """A few lines: the candidates' makespans, the streams chosen, why nodes stayed ambient."""
        us = 1e6
        one = next((e for e in self.candidates if e.name == "one stream"), None)
        lines = [
            f"chose {self.candidate!r}: {self.makespan * us:.1f} us simulated vs {self.single_stream * us:.1f} us "
            f"on one stream; streams {self.used}; run adds {self.waits} wait(s), {self.records} record(s); "
            f"peak ~{self.peak_bytes / 2**20:.1f} MiB"
            + (f" (one stream ~{one.peak_bytes / 2**20:.1f} MiB)" if one is not None else "")
        ]
        if self.note:
            lines.append(self.note)
        lines.append(
            "candidates: " + ", ".join(f"{e.name} {e.makespan * us:.1f} us/{e.waits}w" for e in self.candidates)
        )
        if self.skipped:
            lines.append(
                "not priced (lower bound already too slow): "
                + ", ".join(f"{name} >= {bound * us:.1f} us" for name, bound in self.skipped)
            )
        for s, names in sorted(self.groups().items()):
            shown = ", ".join(names[:8]) + (f", ... ({len(names)} nodes)" if len(names) > 8 else "")
            lines.append(f"stream {s}: {shown}")
        why: dict[str, list[str]] = {}
        for name, reason in self.reasons.items():
            why.setdefault(reason, []).append(name)
        for reason, names in why.items():
            lines.append(f"{len(names)} node(s) {reason}: {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
        return "\n".join(lines)

    @property
    def explanation(self) -> str:
        return self.explain()

    def apply(self, gm: torch.fx.GraphModule) -> int:
        """Write the choice into ``gm`` as ``custom.stream`` annotations (free nodes only);
        returns how many nodes changed. Then ``streampass.run(gm)`` adds the syncs. On a
        :class:`~streampass.errors.StreamPassError` (a node missing or annotated otherwise)
        ``gm`` is left as it was."""
        from streampass.transform.assign_apply import apply_streams

        return apply_streams(gm, {k: s for k, s in self.streams.items() if k in self.free})

    def __repr__(self) -> str:
        return (
            f"<StreamChoice {self.candidate}: streams {self.used}, {self.makespan * 1e6:.1f} us "
            f"(one stream {self.single_stream * 1e6:.1f} us), {self.waits} wait(s)>"
        )


def generate(w: WorkGraph, slots: list[int], groups: list | None = None):
    """``(name, streams, notes)`` for every candidate the search prices first; with ``groups``
    (``assign.fusion``), each group of every candidate on one stream."""
    if groups:
        for name, streams, notes in generate(w, slots):
            kept, why = keep_together(w, streams, groups)
            yield name, kept, {**notes, **why}
        return
    p = w.profile
    threshold = 2 * (p.launch_overhead + p.sync_cost)
    yield "one stream", *cand.one_stream(w)
    if len(slots) < 2 or len(w.free) < 2:
        return
    base = {
        "nimble": cand.chain_cover(w, slots),
        "round robin": cand.round_robin(w, slots),
        "critical path + round robin": cand.critical_round_robin(w, slots),
        "list": cand.list_schedule(w, slots, pin_critical=False),
        "list, critical path ambient": cand.list_schedule(w, slots, pin_critical=True),
        "list, launch-blind": cand.list_schedule(w, slots, pin_critical=False, cpu_weight=0.0),
    }
    for name, (streams, notes) in base.items():
        yield name, streams, notes
        merged, why = cand.merge_small(w, streams, threshold)
        if merged != streams:
            yield f"{name}, merged", merged, {**notes, **why}


def assign_streams(
    gm: torch.fx.GraphModule,
    cost: CostModel | str | DeviceProfile | None = "h100",
    max_streams: int = 4,
    memory_budget: float | None = None,
    *,
    cpu_launch: bool = True,
    external_events=(),
    side_streams: Iterable[int] | None = None,
    exhaustive: bool = False,
    keep_fusions: bool = False,
) -> StreamChoice:
    """Choose a stream for every compute node of ``gm``; ``gm`` is not edited.

    Nodes the graph already places (a ``custom.stream`` annotation, a fork/join region) keep their
    stream, and existing stream ops stay. Every candidate (one stream; Nimble's chain cover;
    round robin over branches; critical path on the ambient stream; earliest-finish list
    scheduling; each with small branches merged back, docs/assign.md) uses at most
    ``max_streams`` streams for the free nodes and is priced as ``streampass.run`` on a copy and
    :func:`streampass.simulate` would price it (``cpu_launch=True``: launches and syncs cost CPU
    time, so tiny kernels do not pay for a side stream). The fastest wins; candidates within
    :data:`~streampass.assign.select.TIE` of it count as equal, and among them those within
    :data:`~streampass.assign.select.MEM_TIE` of the least
    peak memory; of these the fastest, then the one with fewer waits, wins. A
    multi-stream choice must be strictly faster than one stream; candidates whose estimated
    peak memory exceeds ``memory_budget`` bytes are left out.
    ``side_streams``: the indices side streams may take, in order of preference (default: the
    smallest the graph does not use); a compiler passes indices it knows are free at run time.
    ``cost``: a profile name (``"h100"``, ``"h200"``, ``"a100"``, ``"cpu"``), a ``DeviceProfile`` or a
    ``CostModel``; None is h100. ``max_streams`` is an int >= 1, ``memory_budget`` None or bytes >= 0;
    any other value raises :class:`~streampass.errors.StreamPassError` (``candidates.check_request``).
    Candidates whose lower bound cannot come within :data:`TIE` of the fastest are not priced
    (``StreamChoice.skipped``); ``exhaustive=True`` prices every one, for the same choice, slower.
    ``keep_fusions=True`` places each chain of pointwise ops inductor would fuse as one unit
    (:mod:`streampass.assign.fusion`: inductor never fuses across streams), in every candidate,
    the single-stream one included (a free op fused with a fixed one joins its stream), and
    prices each such chain as the one kernel inductor makes of it (``fused_cost``);
    ``assign="auto"`` inside ``torch.compile`` sets it.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x, w):
    ...     return (x @ w).relu() + (x @ w.t()).sigmoid()
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> gm = make_fx(f)(m, m)
    >>> choice = sp.assign_streams(gm)
    >>> choice.used, choice.makespan < choice.single_stream
    ([0, 1], True)
    >>> choice.apply(gm) > 0, sp.run(gm).ok, sp.verify(gm).ok
    (True, True, True)
    >>> small = make_fx(f)(torch.ones(8, 8), torch.ones(8, 8))
    >>> sp.assign_streams(small).used  # kernels too small to pay for a sync
    [0]
    """
    t0 = time.perf_counter()
    model = cand.check_request(gm, cost, max_streams, memory_budget, side_streams)  # a StreamPassError if not
    with collector_paused():  # as run pauses it, and for the same reason (docs/design.md)
        choice = _choose(
            gm,
            model,
            max_streams,
            memory_budget,
            cpu_launch,
            external_events,
            side_streams,
            exhaustive,
            keep_fusions,
        )
    choice.seconds = time.perf_counter() - t0
    return choice


def _choose(gm, model, max_streams, memory_budget, cpu_launch, external_events, side_streams, exhaustive, keep_fusions):
    """:func:`assign_streams` itself (its caller keeps the collector paused and the time)."""
    events = tuple(external_events) or tuple((gm.meta.get("streampass") or {}).get("external_events", ()))
    a = read_streams(gm, events)
    groups = fusion_groups(a) if keep_fusions else None
    fixed = fixed_streams(a)  # reads every body's streams: once
    if groups:
        model = fused_cost(a, groups, model, fixed)
    if keep_fusions:  # inductor may merge these after the pass: across streams it would race
        groups = [*groups, *collective_buckets.merged_groups(a)]
    w = work_graph(a, model, fixed)
    slots = cand.stream_slots(a, max_streams, side_streams, streams_below(gm, a))
    free = frozenset(n.name for n in w.free)
    budget = float("inf") if memory_budget is None else memory_budget
    search = Search(gm, a, w, free, model, cpu_launch, events, budget, prune=not exhaustive)
    rest = generate(w, slots, groups)
    single = search.price(*next(rest))
    others = len(slots) > 1 and len(w.free) > 1  # as generate() has them
    if others and not model.profile.concurrent_streams:
        # Streams that run one after another cannot overlap anything: syncs are all they add.
        return _choice(w, single, single, [single], [(ANY_OTHER, single.makespan)], free, model, memory_budget)
    floor = search.pricer.floor(w) if others and search.prune and single.peak_bytes <= budget else None
    if floor is not None and floor >= single.makespan * (1 - 1e-9):
        # No other assignment can be strictly faster (a chain, a launch-bound graph): one stream
        # wins whatever the others cost, so they are neither built nor priced.
        return _choice(w, single, single, [single], [(ANY_OTHER, floor)], free, model, memory_budget)
    # Against the fastest multi-stream candidate, not one stream: the leaders below are the
    # multi-stream candidates tied with it, and must be the same as if every one were priced.
    search.batch(rest, than=lambda e: e is not single)
    # Local search: move each side stream of the leaders (the candidates tied with the fastest,
    # at most select.LEADERS of them, in order of preference) back to the ambient stream.
    moves = []
    for lead in leaders(search.evals(), single, budget):
        by_node = {n: lead.streams[n.name] for n in w.nodes}
        for s in sorted(set(lead.streams.values()) - {AMBIENT}):
            if any(by_node[n] == s for n in w.free):
                streams, notes = cand.demote(w, by_node, s)
                if groups:  # a fixed member keeps its group on its stream
                    streams, notes = keep_together(w, streams, groups)
                moves.append((f"{lead.name}, stream {s} ambient", streams, notes))
    search.batch(moves)
    if not any(e.peak_bytes <= budget for e in search.tried.values()):
        search.prune = False  # the least memory may be among the skipped
        search.batch((name, streams, notes) for name, _, streams, notes in search.skipped.values())
    evals = search.evals()
    best = pick(evals, single, budget)
    skipped = [(name, bound) for name, bound, *_ in search.skipped.values()]
    return _choice(w, best, single, evals, skipped, free, model, memory_budget)


#: the name :attr:`StreamChoice.skipped` gives every candidate not built when none can beat one stream
ANY_OTHER = "every other assignment"


def _choice(w, best, single, evals, skipped, free, model, memory_budget) -> StreamChoice:
    budget = float("inf") if memory_budget is None else memory_budget
    note = ""
    if best is single and len(evals) + len(skipped) > 1:
        rival = min((e for e in evals if e is not single), key=lambda e: e.makespan, default=None)
        if rival is not None and rival.makespan < single.makespan and rival.peak_bytes > budget:
            note = (
                f"one stream within memory_budget={memory_budget}: the faster candidates need more memory "
                f"({rival.name!r} predicts {rival.makespan * 1e6:.1f} us against {single.makespan * 1e6:.1f} us, "
                f"peak {rival.peak_bytes} bytes against {single.peak_bytes})"
            )
        elif rival is not None:
            note = (
                f"streams do not pay: the best multi-stream candidate ({rival.name!r}) predicts "
                f"{rival.makespan * 1e6:.1f} us against {single.makespan * 1e6:.1f} us on one stream"
            )
        elif not model.profile.concurrent_streams:
            note = f"streams do not pay: streams on the {model.profile.name!r} profile run one after another"
        else:
            note = "streams do not pay: no multi-stream candidate can beat one stream (lower bounds)"
    if best.peak_bytes > budget:
        note = (note + "; " if note else "") + f"no candidate fits memory_budget={memory_budget}: least memory chosen"
    reasons = _reasons(w, best, note)
    return StreamChoice(
        streams=best.streams,
        evaluation=best,
        single_stream=single.makespan,
        waits=best.waits,
        records=best.records,
        peak_bytes=best.peak_bytes,
        candidate=best.name,
        candidates=evals,
        skipped=skipped,
        reasons=reasons,
        free=free,
        note=note,
        model=model,
    )


def _reasons(w: WorkGraph, best: Evaluation, note: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in w.nodes:
        s = best.streams[n.name]
        if n in w.fixed:
            out[n.name] = f"{w.fixed[n][1]} (stream {w.fixed[n][0]})"
        elif s == AMBIENT:
            if note.startswith("streams do not pay"):
                out[n.name] = "on the ambient stream: streams do not pay for this graph"
            elif note.startswith("one stream within memory_budget"):
                out[n.name] = "on the ambient stream: the faster multi-stream candidates exceed memory_budget"
            else:
                out[n.name] = best.notes.get(n.name, f"placed on the ambient stream by {best.name!r}")
    return out

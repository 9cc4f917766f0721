"""The search's bookkeeping (:func:`streampass.assign_streams`): which candidates were priced, in
which order, and which were skipped because their lower bound cannot win (docs/assign.md,
"Skipping candidates that cannot win")."""

from __future__ import annotations

import time

from streampass.assign.dag import WorkGraph
from streampass.assign.evaluate import Evaluation, evaluate
from streampass.assign.price import Pricer
from streampass.assign.select import TIE
from streampass.sim.cost import CostModel


class Search:
    """The candidates priced so far, and those skipped because their lower bound
    (:meth:`~streampass.assign.price.Pricer.tight_bound`) cannot come within :data:`TIE` of the
    fastest priced: skipping them changes nothing :func:`~streampass.assign.select.pick` could choose.

    Each batch is priced in order of that bound, so that the fast ones, priced first, skip more;
    :meth:`evals` lists them in the order of :meth:`~streampass.assign.price.Pricer.bound`
    (then as generated), the order the selection breaks exact ties by. Every candidate the
    selection can prefer is priced whatever the order (its bound is below the fastest's
    makespan within :data:`TIE`), so the order priced decides only which slower ones are skipped.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from streampass.assign import candidates as cand
    >>> from streampass.assign.dag import work_graph
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> gm = make_fx(lambda x, w: (x @ w).relu() + (x @ w.t()).sin())(m, m)
    >>> a, model = sp.read_streams(gm), CostModel("h100")
    >>> w = work_graph(a, model)
    >>> search = Search(gm, a, w, {n.name for n in w.free}, model, True, (), float("inf"))
    >>> one = search.price("one stream", *cand.one_stream(w))
    >>> slots = [0, 1]
    >>> search.batch([("nimble", *cand.chain_cover(w, slots)), ("round robin", *cand.round_robin(w, slots))])
    >>> [e.name for e in search.evals()]  # round robin places them as Nimble does: priced once
    ['one stream', 'nimble']
    """

    def __init__(self, gm, a, w: WorkGraph, free, model: CostModel, cpu_launch, events, budget, prune=True):
        self.gm, self.w, self.free, self.model = gm, w, free, model
        self.cpu_launch, self.events, self.budget, self.prune = cpu_launch, events, budget, prune
        self.pricer = Pricer(a, model, cpu_launch, known=w.time, table=w.accesses, orderings=w.orderings)
        self.tried: dict[tuple, Evaluation] = {}
        self.skipped: dict[tuple, tuple] = {}  # key -> (name, bound, streams, notes)
        self.order: dict[tuple, tuple] = {}  # key -> (batch, bound, place in the batch by bound)
        self.batches = 0

    def key(self, streams) -> tuple:
        """What tells two candidates apart: the stream of each node of the work graph, in order
        (a candidate places every one of them)."""
        return tuple(map(streams.get, self.w.nodes))

    def evals(self) -> list[Evaluation]:
        """The candidates priced, batch by batch, each batch in order of :meth:`Pricer.bound`."""
        return [self.tried[k] for k in sorted(self.tried, key=self.order.__getitem__)]

    def price(self, name, streams, notes, order=(0, 0.0, 0)) -> Evaluation:
        key = self.key(streams)
        if key not in self.tried:
            named = {n.name: streams[n] for n in self.w.nodes if n in streams}  # in issue order
            t0 = time.perf_counter()
            fixed = self.w.fixed  # the free nodes are the others
            p = self.pricer({n: s for n, s in streams.items() if n not in fixed})
            gm, free, model, cpu, events = self.gm, self.free, self.model, self.cpu_launch, self.events

            def replay(named=named, name=name):
                return evaluate(gm, name, named, free, model, cpu, events).schedule

            self.tried[key] = Evaluation(
                name,
                named,
                p.makespan,
                p.waits,
                p.records,
                p.peak_bytes,
                time.perf_counter() - t0,
                {n.name: v for n, v in notes.items()},
                replay=replay,
            )
            self.order[key] = order
            self.skipped.pop(key, None)
        return self.tried[key]

    def batch(self, candidates, than=lambda e: True) -> None:
        """Price ``(name, streams, notes)`` candidates in order of lower bound, skipping those
        whose bound is more than :data:`TIE` above the fastest priced candidate for which
        ``than`` holds (within the memory budget)."""
        w, prune, pricer = self.w, self.prune, self.pricer
        self.batches += 1
        todo = {}
        for name, streams, notes in candidates:
            key = self.key(streams)
            if key in self.tried or key in todo:
                continue
            todo[key] = (name, pricer.tight_bound(w, streams) if prune else 0.0, streams, notes, len(todo))
        for key, (name, bound, streams, notes, i) in sorted(todo.items(), key=lambda kv: kv[1][1]):
            fits = [e.makespan for e in self.tried.values() if e.peak_bytes <= self.budget and than(e)]
            if prune and fits and bound > min(fits) * (1 + TIE):
                self.skipped[key] = (name, bound, streams, notes)
            else:  # listed where the plain bound puts it (a stable sort: then as generated)
                self.price(name, streams, notes, (self.batches, pricer.bound(w, streams) if prune else 0.0, i))

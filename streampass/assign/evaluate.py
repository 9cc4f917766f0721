"""Price one candidate assignment the direct way: annotate a copy, ``streampass.run`` it,
simulate the result. :mod:`streampass.assign.price` computes the same numbers without the copy
and the edit; this is the reference it is tested against, and how a chosen candidate's whole
schedule is built.

The user's graph is never edited: the copy (``transform.assign_apply.annotated_copy``) shares
its parameters and has its own nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch.fx

from streampass.assign.memory import peak_bytes
from streampass.sim.cost import CostModel
from streampass.sim.schedule import Schedule
from streampass.sim.simulate import simulate
from streampass.transform.assign_apply import annotated_copy
from streampass.transform.pipeline import run


@dataclass
class Evaluation:
    """One candidate, priced.

    ``streams``: node name -> stream (every compute node); ``makespan``: the simulated makespan
    after ``run`` (syncs included); ``waits``/``records``: the syncs ``run`` adds;
    ``peak_bytes``: :mod:`streampass.assign.memory`'s estimate; ``seconds``: wall time of the
    pricing. ``schedule``: the whole simulated :class:`~streampass.sim.schedule.Schedule` of the
    graph after ``run``; a candidate priced by :class:`~streampass.assign.price.Pricer` builds it
    on first use (a copy, ``run`` and ``simulate``: what :func:`evaluate` does).
    """

    name: str
    streams: dict[str, int]
    makespan: float
    waits: int
    records: int
    peak_bytes: int
    seconds: float
    notes: dict[str, str] = field(default_factory=dict, repr=False)
    replay: Callable[[], Schedule] | None = field(default=None, repr=False, compare=False)
    built: Schedule | None = field(default=None, repr=False, compare=False)

    @property
    def schedule(self) -> Schedule:
        if self.built is None:
            self.built = self.replay()
        return self.built

    def __getstate__(self) -> dict:
        # A copy or pickle carries the schedule, not the closure over the graph that builds it
        # (a closure cannot be pickled, and an unpickled graph is traced again, with new names).
        return {**self.__dict__, "built": self.schedule, "replay": None}

    @property
    def used(self) -> list[int]:
        """The streams the candidate puts work on."""
        return sorted(set(self.streams.values()))


def evaluate(
    gm: torch.fx.GraphModule,
    name: str,
    streams: Mapping[str, int],
    free: set[str],
    model: CostModel,
    cpu_launch: bool = True,
    external_events=(),
    notes: Mapping[str, str] | None = None,
) -> Evaluation:
    """Annotate a copy of ``gm`` with ``streams`` (only the ``free`` nodes are written), run
    the pass on it and simulate it.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> gm = make_fx(lambda x, w: x @ w + x @ w.t())(m, m)
    >>> one = evaluate(gm, "one", {"mm": 0, "mm_1": 0, "add": 0}, {"mm", "mm_1", "add"}, CostModel())
    >>> two = evaluate(gm, "two", {"mm": 1, "mm_1": 0, "add": 0}, {"mm", "mm_1", "add"}, CostModel())
    >>> one.waits, two.waits > 0, two.schedule.ok, two.makespan < one.makespan
    (0, True, True, True)
    """
    t0 = time.perf_counter()
    copy = annotated_copy(gm, {k: s for k, s in streams.items() if k in free})
    result = run(copy, external_events=external_events, bind_runtime=False, recompile=False)
    schedule = simulate(copy, model, cpu_launch=cpu_launch, external_events=external_events)
    peak = peak_bytes(copy, schedule, external_events)
    return Evaluation(
        name,
        dict(streams),
        schedule.makespan,
        result.waits_added,
        result.records_added,
        peak,
        time.perf_counter() - t0,
        dict(notes or {}),
        built=schedule,
    )

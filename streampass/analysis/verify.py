"""A static race detector: which ordering requirements the graph's syncs leave unmet."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch.fx

from streampass.analysis.dag import StreamDAG
from streampass.analysis.hazards import KINDS, Hazard, find_hazards


@dataclass
class Report:
    """What :func:`verify` found. ``ok`` is True when there is no hazard."""

    hazards: list[Hazard] = field(default_factory=list)
    streams: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.hazards

    def by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for h in self.hazards:
            out[h.kind] += 1
        return out

    def __str__(self) -> str:
        if self.ok:
            return f"no hazards on streams {self.streams}"
        lines = [f"{len(self.hazards)} hazard(s) on streams {self.streams}:"]
        lines += [f"  {h}" for h in self.hazards]
        return "\n".join(lines)


def verify(g: torch.fx.GraphModule | torch.fx.Graph, external_events: Iterable[int] = ()) -> Report:
    """Check a graph for stream races; never edits it.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y * 2
    >>> report = verify(make_fx(f)(torch.ones(2)))
    >>> report.ok, sorted(k for k, n in report.by_kind().items() if n)
    (False, ['dealloc', 'entry', 'exit', 'raw'])
    """
    dag = StreamDAG.from_graph(g, external_events)
    return Report(find_hazards(dag), dag.streams)

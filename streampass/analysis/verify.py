"""A static race detector: which ordering requirements the graph's syncs leave unmet."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch.fx

from streampass.analysis import bodies
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

    def with_body(self, body: Report, name: str, op: str) -> Report:
        """This report and a body's (``name``, called by the node ``op``): the body's hazards
        name its nodes as ``name.node``."""
        inside = [
            Hazard(h.kind, tuple(f"{name}.{n}" for n in h.nodes), f"in {name} (called by {op}): {h.message}")
            for h in body.hazards
        ]
        return Report(self.hazards + inside, sorted(set(self.streams) | set(body.streams)))

    def __str__(self) -> str:
        if self.ok:
            return f"no hazards on streams {self.streams}"
        lines = [f"{len(self.hazards)} hazard(s) on streams {self.streams}:"]
        lines += [f"  {h}" for h in self.hazards]
        return "\n".join(lines)


def verify(g: torch.fx.GraphModule | torch.fx.Graph, external_events: Iterable[int] | None = None) -> Report:
    """Check a graph for stream races; never edits it. The bodies of its higher-order ops
    (``torch.cond``'s branches, ...) are checked too, each as a graph of its own
    (:mod:`streampass.analysis.bodies`); their hazards name nodes as ``body.node``.

    ``external_events``: the event indices recorded outside the graph. Left out, they are the
    ones :func:`streampass.run` recorded on the module (none for a graph it has not run), so a
    graph ``run`` accepted, or one ``StreamPass(keep_graphs=True)`` kept, verifies as it is.

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
    gm = g if isinstance(g, torch.fx.GraphModule) else g.owning_module
    if external_events is None:
        external_events = recorded_external_events(gm) if gm is not None else ()
    dag = StreamDAG.from_graph(g, external_events)
    report = Report(find_hazards(dag), dag.streams)
    for body in bodies.bodies(gm) if isinstance(gm, torch.fx.GraphModule) else ():
        inner = verify(body.module, bodies.external_events(dag.assignment))
        bodies.check_caller(body, dag.assignment, inner.streams)
        report = report.with_body(inner, body.name, body.op.name)
    return report


def recorded_external_events(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The external events :func:`streampass.run` was given for ``gm`` (read, never set).

    >>> import torch, streampass as sp
    >>> from streampass import ops
    >>> g = torch.fx.Graph()
    >>> x = g.placeholder("x")
    >>> _ = g.call_function(ops.WAIT_EVENT, (5, 1))
    >>> _ = g.output(g.call_function(torch.ops.aten.sin.default, (x,)))
    >>> gm = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> recorded_external_events(gm), sp.run(gm, external_events=[5]).ok, recorded_external_events(gm)
    ((), True, (5,))
    >>> verify(gm).ok
    True
    """
    return tuple((gm.meta.get("streampass") or {}).get("external_events", ()))

"""streampass as a torch.fx pass, for ``torch.fx.passes.infra.pass_manager.PassManager``.

:class:`StreamSyncPass` follows torch.fx's pass protocol (``torch/fx/passes/infra/pass_base.py``):
``requires`` reads the graph's streams and refuses what streampass cannot plan, ``call`` plans
and applies the syncs and returns a ``PassResult``, ``ensures`` verifies the result race-free.
Called as a whole (what ``PassManager`` does) it does the three on one reading.
Each step raises :class:`~streampass.errors.StreamPassError` naming the node at fault, which
``PassManager`` reports with the pass's name; a failed ``call`` leaves the graph as it was.

>>> import torch, streampass as sp
>>> from torch.fx.experimental.proxy_tensor import make_fx
>>> from torch.fx.passes.infra.pass_manager import PassManager
>>> def f(x):
...     with sp.stream(1):
...         y = x.sin()
...     return y + x.cos()
>>> gm = make_fx(f)(torch.ones(4))
>>> result = PassManager([StreamSyncPass()])(gm)
>>> result.modified, sp.verify(result.graph_module).ok
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from streampass.analysis.reading import read_streams
from streampass.analysis.verify import verify
from streampass.errors import StreamPassError
from streampass.transform.pipeline import RunResult, run

__all__ = ["StreamSyncPass"]


@dataclass(eq=False)
class StreamSyncPass(PassBase):
    """Insert the record/wait syncs a multi-stream graph needs (:func:`streampass.run`).

    Attributes:
        external_events: event indices recorded outside the graph (see :func:`streampass.run`).
        bind_runtime: make the graph callable eagerly (its stream/event table), as ``run`` does.
        last: the :class:`~streampass.transform.pipeline.RunResult` of the latest ``call``.
    """

    external_events: tuple[int, ...] = ()
    bind_runtime: bool = True
    last: RunResult | None = field(default=None, repr=False)

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult:
        """``requires``, ``call`` and ``ensures`` on one reading: ``run`` plans from the reading
        ``requires`` makes, and its final check (as strong as :func:`verify`, on the reading the
        edit kept up to date) is what ``ensures`` would find, so the graph is read once, not
        three times. A subclass that overrides one of them gets torch's sequence instead."""
        if any(getattr(type(self), h) is not getattr(StreamSyncPass, h) for h in ("requires", "call", "ensures")):
            return super().__call__(graph_module)
        a = read_streams(graph_module, external_events=self.external_events)
        self.last = run(
            graph_module, external_events=self.external_events, bind_runtime=self.bind_runtime, assignment=a
        )
        _raise_if_hazards(self.last.after)
        return PassResult(graph_module, self.last.changed)

    def requires(self, graph_module: torch.fx.GraphModule) -> None:
        read_streams(graph_module, external_events=self.external_events)

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        self.last = run(graph_module, external_events=self.external_events, bind_runtime=self.bind_runtime)
        return PassResult(graph_module, self.last.changed)

    def ensures(self, graph_module: torch.fx.GraphModule) -> None:
        _raise_if_hazards(verify(graph_module, external_events=self.external_events))


def _raise_if_hazards(report) -> None:
    if not report.ok:
        first = report.hazards[0]
        raise StreamPassError(f"{len(report.hazards)} hazard(s) left: {first}", first.nodes[-1])

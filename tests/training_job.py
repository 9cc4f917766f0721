"""A training loop as people write it, run in its own process by tests/test_compile_use.py.

``python tests/training_job.py {enabled|enable|eager}`` trains a small two-branch model for
three steps under ``torch.compile`` with torch's default caches (the caller points
``TORCHINDUCTOR_CACHE_DIR`` at a fresh folder) and prints one JSON line: the losses, a
checksum of the trained parameters, inductor's and AOT autograd's cache counters, the syncs
the compiled code ran, and what StreamPass reported.

* ``enabled``: the first forward inside ``with streampass.inductor.enabled()``; every
  ``backward()`` and optimizer step after the block, and the later steps outside it.
* ``enable``: ``streampass.inductor.enable()`` once, then plain training.
* ``auto``: as ``enabled``, with ``StreamPass(assign="auto")``: streampass also places the
  nodes the model left on the ambient stream (every aten kernel priced at 100 us, so that
  side streams pay on this small model).
* ``eager``: the same loop without ``torch.compile`` (the reference).
"""

from __future__ import annotations

import json
import sys

import torch

import streampass as sp
import streampass.inductor as spi
from streampass.sim.cost import CostModel


def aten_100us(node: torch.fx.Node) -> float | None:
    target = node.target
    return 1e-4 if isinstance(target, torch._ops.OpOverload) and target.namespace == "aten" else None


class TwoBranch(torch.nn.Module):
    """Two projections on side streams, a buffer counting steps, joined on the ambient stream."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        with sp.stream(1):
            left = torch.relu(self.a(x))
        with sp.stream(2):
            right = torch.sigmoid(self.b(x))
        self.steps.add_(1)
        return (left * right).sum()


def main(mode: str) -> dict:
    torch.manual_seed(0)
    model = TwoBranch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(8, 16) for _ in range(3)]
    step = model if mode == "eager" else torch.compile(model)
    syncs0 = sum(spi.RUNTIME_SYNCS.values())
    if mode == "auto":
        p = spi.StreamPass(keep_graphs=True, assign="auto", assign_cost=CostModel("h100", overrides=aten_100us))
    else:
        p = spi.StreamPass(keep_graphs=True)
    losses = []
    if mode == "enable":
        spi.enable(p)
    for i, x in enumerate(xs):
        opt.zero_grad()
        if mode in ("enabled", "auto") and i == 0:
            with spi.enabled(p):
                loss = step(x)
        else:
            loss = step(x)
        loss.backward()  # outside the block: the backward compiles here, lazily
        opt.step()
        losses.append(loss.item())
    from torch._dynamo.utils import counters

    return {
        "losses": losses,
        "checksum": sum(float(t.double().sum()) for t in model.state_dict().values()),
        "steps": float(model.steps),
        "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
        "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "aot_miss": counters["aot_autograd"]["autograd_cache_miss"],
        "syncs": sum(spi.RUNTIME_SYNCS.values()) - syncs0,
        "reports": [
            [
                r.graph,
                r.records_added,
                r.waits_added,
                r.verified_graph is not None and sp.verify(r.verified_graph).ok,
                r.assigned,
                r.streams,
            ]
            for r in p.reports
        ],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))

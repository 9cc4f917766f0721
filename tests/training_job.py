"""A training loop as people write it, run in its own process by tests/test_compile_use.py.

``python tests/training_job.py {enabled|enable|auto|eager} [two_branch|wait_stream] [save=F|load=F]`` trains a
small model (:class:`TwoBranch`, the default, or :class:`WaitStream`) for
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

``save=F`` writes torch's cache artifacts (``torch.compiler.save_cache_artifacts``) to the file
``F`` after the loop; ``load=F`` loads them (``load_cache_artifacts``) before it, as a job does
on a fresh machine.
"""

from __future__ import annotations

import json
import sys

import torch

import streampass as sp
import streampass.inductor as spi
from streampass.sim.cost import CostModel

from user_stream_programs import CpuStream


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


class WaitStream(torch.nn.Module):
    """PyTorch's CUDA-semantics pattern with ``torch.Stream`` objects: the side stream waits for
    the main one, and the main one for the side stream before the join. The join's
    ``wait_stream`` threads several values through its ``control_deps``. Eagerly on CPU the
    streams are ``CpuStream``s: a CPU stream's own ``wait_stream`` raises."""

    def __init__(self, stream=torch.Stream):
        super().__init__()
        self.main, self.side = stream("cpu"), stream("cpu")
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)
        self.o = torch.nn.Linear(16, 1)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        with self.main:
            self.side.wait_stream(self.main)
            with self.side:
                b = torch.tanh(self.b(x))
            a = torch.relu(self.a(x))
            self.main.wait_stream(self.side)
            self.steps.add_(1)
            return self.o(a + b).pow(2).mean()


def main(mode: str, model_name: str = "two_branch", artifacts: str = "") -> dict:
    action, _, path = artifacts.partition("=")
    if action == "load":
        with open(path, "rb") as f:
            assert torch.compiler.load_cache_artifacts(f.read()) is not None
    torch.manual_seed(0)
    stream = CpuStream if mode == "eager" else torch.Stream
    model = WaitStream(stream) if model_name == "wait_stream" else TwoBranch()
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
    if action == "save":
        saved = torch.compiler.save_cache_artifacts()
        assert saved is not None
        with open(path, "wb") as f:
            f.write(saved[0])
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
    print(json.dumps(main(*sys.argv[1:])))

"""Corpus programs compiled in a process of their own, run by tests/test_corpus.py cold then warm.

``python tests/corpus_job.py NAME...`` compiles each named program of
tests/user_stream_programs.py under ``streampass.inductor.enabled()`` with torch's FX-graph and
AOT-autograd caches on (the caller points ``TORCHINDUCTOR_CACHE_DIR`` at a folder that the first
run fills and the second finds), runs the backward of a training program after the block,
and prints one JSON line: per program, whether outputs, in-place updates and gradients
equal eager, the syncs the compiled code ran, the graphs StreamPass compiled, and inductor's
cache counters.
"""

from __future__ import annotations

import json
import sys

import torch
import torch._dynamo
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters

import streampass.inductor as spi

from test_corpus import _backward, _grads, _inputs, _target, _tensors
from user_stream_programs import PROGRAMS


def one(name: str) -> dict:
    (p,) = [p for p in PROGRAMS if p.name == name]
    torch._dynamo.reset()
    counters.clear()
    owner_c, fn_c = _target(p)
    compiled = torch.compile(fn_c, fullgraph=p.fullgraph)
    owner_e, fn_e = _target(p)
    inputs_e = _inputs(p)
    want = fn_e(*inputs_e)
    inputs_c = _inputs(p)
    passes = spi.StreamPass()
    before = sum(spi.RUNTIME_SYNCS.values())
    with spi.enabled(passes):
        got = compiled(*inputs_c)
    if p.training:  # after the block, as a training loop does
        _backward(got)
        _backward(want)
    ran = sum(spi.RUNTIME_SYNCS.values()) - before

    def same(a, b) -> bool:
        try:
            torch.testing.assert_close(a, b)
        except AssertionError:
            return False
        return True

    ok = same(_tensors(got), _tensors(want)) and same(_tensors(inputs_c), _tensors(inputs_e))
    if p.training:
        ok = ok and same(_grads(inputs_c, owner_c), _grads(inputs_e, owner_e))
    return {
        "equal": ok,
        "syncs": ran,
        "compiled": [r.graph for r in passes.reports],
        "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
        "fx_bypass": counters["inductor"]["fxgraph_cache_bypass"],
        "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
    }


if __name__ == "__main__":
    with inductor_config.patch(fx_graph_cache=True), functorch_config.patch(enable_autograd_cache=True):
        print(json.dumps({name: one(name) for name in sys.argv[1:]}))

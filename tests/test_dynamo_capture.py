"""streampass.dynamo_capture: a program as torch.compile sees it, for the CLI and notebooks.

tests/test_corpus.py checks every upstream program against what the inductor pass read; these
check the capture's own promises: the user's streams and syncs kept, nothing of the program run,
no cache entry left that could hit dynamo's recompile limit or drop the user's own.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import streampass as sp
from streampass.dynamo_capture import capture
from streampass.runtime import execute

AMBIENT, SIDE = torch.Stream("cpu"), torch.Stream("cpu")
RAN: list[str] = []


def two_streams(x, w):
    with AMBIENT:  # on CPU dynamo has no current stream: a sync needs a stream to be issued on
        a = x.sin()
        with SIDE:
            y = x @ w
            e = torch.Event("cpu")
            e.record()
        e.wait()
        RAN.append("two_streams")  # a side effect dynamo replays after the graph
        return y + a


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.side = torch.Stream("cpu")

    def forward(self, x):
        a = x.cos()
        with self.side:
            y = x @ self.w
        return y + a


def test_user_streams_are_side_streams_and_their_syncs_are_kept():
    gm = capture(two_streams, torch.randn(8, 8), torch.randn(8, 8))
    a = sp.read_streams(gm)
    by_name = {n.name: a.stream[n] for n in a.nodes}
    # dynamo numbered AMBIENT 0 on CPU: here it is a side stream, as the user wrote it
    assert 0 not in (by_name["sin"], by_name["mm"]) and by_name["sin"] != by_name["mm"]
    kinds = sorted(call.target.__name__ for call in a.syncs.values())
    assert kinds == ["record_event.default", "wait_event.default"], kinds
    assert not RAN  # nothing of the program ran


def test_run_reuses_the_users_syncs_and_the_result_computes_what_eager_does():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = capture(two_streams, x, w)
    before = sp.read_streams(gm).syncs
    result = sp.run(gm)
    assert result.ok and sp.verify(gm).ok
    kept = {call.args for call in sp.read_streams(gm).syncs.values()}
    assert {call.args for call in before.values()} <= kept  # the user's record and wait stay
    (out,) = execute(gm, x, w)
    torch.testing.assert_close(out, x @ w + x.sin())


def test_a_module_s_parameters_become_inputs():
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(4, 8)
    gm = capture(m, x)
    shapes = [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder"]
    assert sorted(shapes) == [(4, 8), (8, 8)]
    assert sp.read_streams(gm).streams == [0, 1]
    assert sp.run(gm).ok
    value = {(4, 8): x, (8, 8): m.w.detach()}
    (out,) = execute(gm, *(value[s] for s in shapes))
    with torch.no_grad():
        torch.testing.assert_close(out, m(x))


def test_many_captures_of_one_function_stay_below_the_recompile_limit():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    limit = torch._dynamo.config.recompile_limit
    for _ in range(limit + 4):
        gm = capture(two_streams, x, w)
    assert sp.read_streams(gm).syncs


def test_a_capture_leaves_the_users_own_compiled_function_compiled():
    def f(x):
        with SIDE:
            y = x * 2
        return y + 1

    counter = CompileCounter()
    compiled = torch.compile(f, backend=counter)
    x = torch.randn(4)
    compiled(x)
    capture(f, x)
    compiled(x)
    assert counter.frame_count == 1


def test_a_graph_break_is_a_clear_error_naming_the_function():
    def breaks(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    with pytest.raises(sp.StreamPassError, match=r"breaks: torch\.compile could not capture it as one graph"):
        capture(breaks, torch.randn(4))

"""PyTorch's own user-stream programs (tests/user_stream_programs.py) compiled under StreamPass.

For each program: it compiles under ``streampass.inductor.enabled()`` with torch's FX-graph and
AOT caches on (a fresh directory per test); the outputs, and the gradients of a backward run
after the block, equal eager; every graph the pass saw verifies clean; and the compiled code
ran at least as many syncs as the plans held. Programs upstream expects to fail must fail with
the same exception type.

On CPU, dynamo has no current stream (``torch.accelerator`` has no device), so a sync issued
outside any ``with stream:`` block fails inside dynamo (``IndexError: deque index out of
range``) before any pass runs. The CUDA current stream is therefore translated to one CPU stream
that the harness enters around every program, inside the compiled function (eagerly: a
:class:`~user_stream_programs.CpuStream`). streampass reads it as a side stream like the
program's own (dynamo gives it index 0; see :mod:`streampass.transform.dynamo_indices`).

With ``STREAMPASS_CORPUS_DEVICE=cuda`` (what tests/test_cuda_corpus.py sets) the same programs
run on CUDA: streams, events and inputs on the GPU, no stand-ins, the real current stream, and
the syncs that ran counted by the profiler (``cudaStreamWaitEvent`` calls) instead of the CPU
lowering's counter.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch._dynamo
import torch.utils._pytree as pytree
from torch._dynamo.utils import counters

import streampass as sp
import streampass.inductor as spi
from streampass.analysis.reading import events_recorded_outside

from reference import TORCH, job, planned_syncs
from user_stream_programs import DEVICE, ON_CPU, PROGRAMS, CpuStream, Program

CURRENT = CpuStream("cpu") if ON_CPU else None  # the CPU stand-in for CUDA's current stream (module doc)


pytestmark = pytest.mark.usefixtures("fresh_caches")


def _in_current_stream(fn):
    if not ON_CPU:
        return fn

    def program(*args):
        with CURRENT:
            return fn(*args)

    return program


def _target(p: Program):
    """What to compile and what to call eagerly: fresh each time (modules carry state)."""
    if p.kind == "module":
        torch.manual_seed(0)
        module = p.fn().to(DEVICE)
        return module, _in_current_stream(module)
    return p.fn, _in_current_stream(p.fn)


def _inputs(p: Program):
    """Fresh inputs on the corpus device (the programs make them on CPU); leaves stay leaves."""
    if ON_CPU:
        return p.inputs()

    def move(t):
        return t.detach().to(DEVICE).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t

    return pytree.tree_map(move, p.inputs())


def _tensors(out):
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _backward(out) -> None:
    loss = sum(t.sum() for t in _tensors(out) if t.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()


def _grads(inputs, owner):
    grads = [t.grad for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if isinstance(owner, torch.nn.Module):
        grads += [q.grad for q in owner.parameters()]
    return grads


#: the CUDA runtime calls a planned sync becomes (record, wait, host synchronize)
CUDA_SYNC_CALLS = ("cudaEventRecord", "cudaStreamWaitEvent", "cudaEventSynchronize", "cudaStreamSynchronize")


@contextlib.contextmanager
def _counting_syncs():
    """Yields a list that holds, after the block, how many syncs the compiled code ran in it:
    the CPU lowering's counter, or on CUDA the profiler's count of the runtime calls."""
    ran: list[int] = []
    if ON_CPU:
        before = sum(spi.RUNTIME_SYNCS.values())
        yield ran
        ran.append(sum(spi.RUNTIME_SYNCS.values()) - before)
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield ran
        torch.cuda.synchronize()
    ran.append(sum(1 for e in prof.events() if any(e.name.startswith(c) for c in CUDA_SYNC_CALLS)))


#: the programs this torch runs as upstream expects, and those only a newer one does (Program.since)
HERE = [p for p in PROGRAMS if p.since <= TORCH]
NEWER = [p for p in PROGRAMS if p.since > TORCH]


@pytest.mark.parametrize("assign", [None, "auto"])
@pytest.mark.parametrize("p", HERE, ids=[p.name for p in HERE])
def test_upstream_program(p: Program, assign):
    """``assign="auto"``: the same, with streampass also choosing streams for the nodes the
    program left unplaced (issue 15): the program's own streams and syncs stay as they are."""
    owner_c, compiled_fn = _target(p)
    compiled = torch.compile(compiled_fn, fullgraph=p.fullgraph)
    # priced for an H100 on any device: with the default cost a CPU graph keeps one stream
    passes = spi.StreamPass(keep_graphs=True, assign=assign, assign_cost="h100")
    if p.raises is not None:
        with pytest.raises(p.raises, match=p.match or None), spi.enabled(passes):
            compiled(*_inputs(p))
        return

    owner_e, eager_fn = _target(p)
    inputs_e = _inputs(p)
    want = eager_fn(*inputs_e)
    inputs_c = _inputs(p)
    with _counting_syncs() as counted:
        with spi.enabled(passes):
            got = compiled(*inputs_c)
        if p.training:  # the backward compiles here, after the block, as in a training loop
            _backward(got)
    if p.training:
        _backward(want)
    (ran,) = counted

    torch.testing.assert_close(_tensors(got), _tensors(want))
    torch.testing.assert_close(_tensors(inputs_c), _tensors(inputs_e))  # in-place updates too
    if p.training:
        torch.testing.assert_close(_grads(inputs_c, owner_c), _grads(inputs_e, owner_e))
    kept = [r for r in passes.reports if r.verified_graph is not None]
    # every graph inductor compiled (each is a cache miss or bypass here) went through the pass
    compiled_graphs = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_bypass"]
    assert len(passes.reports) == compiled_graphs
    for r in kept:  # an event waited on before the graph records it was recorded outside it
        report = sp.verify(r.verified_graph)  # with the external events it carries
        assert report.ok, report
    assert ran >= sum(planned_syncs(r.verified_graph) for r in kept)
    kinds = [r.graph for r in passes.reports]
    assert kinds.count("forward") == kinds.count("backward")  # each backward after the block too
    if assign is None and p.fullgraph:
        _captured_as_the_pass_saw_it(p, [r for r in passes.reports if r.graph != "backward"])


def _captured_as_the_pass_saw_it(p: Program, forward: list) -> None:
    """``streampass.dynamo_capture.capture`` (what ``streampass inspect/assign`` read) gives the
    streams the pass read in the forward graph it compiled, and its graph, after ``run``,
    verifies clean and computes what eager does."""
    from streampass.dynamo_capture import capture
    from streampass.runtime import execute

    _, fn = _target(p)
    gm = capture(fn, *_inputs(p))
    outside = events_recorded_outside(gm)
    a = sp.read_streams(gm, outside)
    if forward:
        assert [a.streams] == [r.streams for r in forward]
    else:  # inductor had nothing to compile (the program computes nothing): neither has the capture
        assert a.streams == [0] and not any(a.is_compute(n) for n in a.nodes)
        return  # its outputs are the inputs, which AOT autograd returns outside the graph
    assert sp.run(gm, external_events=outside).ok and sp.verify(gm, outside).ok
    if ON_CPU and any(n.target is torch.ops.streams.record_stream.default for n in gm.graph.nodes):
        return  # eager torch has no record_stream for a CPU tensor (the program's stand-in skips it)
    _, eager_fn = _target(p)
    with torch.no_grad():
        want = _tensors(eager_fn(*_inputs(p)))
    leaves = [t for t in pytree.tree_leaves(_inputs(p)) if isinstance(t, torch.Tensor)]
    placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    assert placeholders in (0, len(leaves))  # dynamo drops inputs the graph does not read
    got = _tensors(execute(gm, *leaves[:placeholders]))
    # AOT autograd returns the inputs it updated in place first, then the function's outputs
    torch.testing.assert_close(got[len(got) - len(want) :], want)


def _upstream_expectation_holds(p: Program) -> bool:
    """Whether plain ``torch.compile`` (inductor, no streampass) does what upstream expects."""
    _, fn = _target(p)
    torch._dynamo.reset()
    try:
        out = torch.compile(fn, fullgraph=p.fullgraph)(*_inputs(p))
        if p.training:
            _backward(out)
    except Exception as e:
        import re

        return p.raises is not None and isinstance(e, p.raises) and re.search(p.match, str(e)) is not None
    finally:
        torch._dynamo.reset()
    return p.raises is None


def test_programs_only_a_newer_torch_runs_fail_without_streampass_too():
    """The corpus leaves out what this torch itself cannot do (each program's ``since``, with the
    reason by it): plain torch.compile must fail those too, so that streampass is not the cause.
    On the newest torch the list is empty; HERE is then the whole corpus."""
    assert len(HERE) + len(NEWER) == len(PROGRAMS) and len(HERE) >= 90
    held = [p.name for p in NEWER if _upstream_expectation_holds(p)]
    assert not held, f"torch {torch.__version__} runs these as upstream expects: lower their since: {held}"


# --------------------------------------------------------------------------------------------
# Cold, then warm in a second process
# --------------------------------------------------------------------------------------------
#: corpus programs whose graphs torch 2.13 caches (no user sync: torch wraps those in
#: ``control_deps``, which its FX-graph cache declines), and some it declines, which recompile
WARM = [
    "stream_enter_exit", "stream_context_graph_break", "stream_input", "nested_stream_enter_exit",
    "local_stream_nested_enter_exit", "stream_with_mutation", "stream_backward_simple", "event_tracing",
    "epilogue_copy_streams_inference", "epilogue_copy_stream_tracking", "backward_sync_control_deps_e2e",
    "record_stream", "event_record_on_different_stream_no_error", "del_single_stream_no_sync_dealloc",
    "ctx_event_across_graph_break", "ctx_event_created_outside_of_graph",  # events recorded outside
    # declined: user syncs
    "control_deps_wrapping_record_event", "multiple_stream_contexts", "bidirectional_stream_sync",
    "del_multi_stream_sync_dealloc",
]  # fmt: skip


@pytest.mark.slow
def test_programs_cold_then_warm_in_a_second_process(tmp_path):
    """A second process that finds torch's caches filled runs the same syncs and computes what
    eager does; it compiles again exactly the graphs torch declined to cache (each goes
    through StreamPass again), and nothing else."""
    names = [n for n in WARM if n in {p.name for p in HERE if p.raises is None}]
    cache = str(tmp_path / "cache")
    cold = job("corpus_job.py", *names, cache=cache)
    warm = job("corpus_job.py", *names, cache=cache)
    for name in names:
        c, w = cold[name], warm[name]
        assert c["equal"] and w["equal"], name
        assert w["syncs"] == c["syncs"], name
        assert len(w["compiled"]) == c["fx_bypass"], (name, c, w)
        assert len(c["compiled"]) == c["fx_miss"] + c["fx_bypass"], (name, c)
    # which graphs torch declines to cache is torch's choice, and differs between releases
    served = [n for n in names if cold[n]["compiled"] and not warm[n]["compiled"]]
    assert len(served) >= len(names) // 2, served

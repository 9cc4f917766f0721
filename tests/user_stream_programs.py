"""CPU corpus of the user programs in PyTorch's stream tests.

Every entry re-expresses, in our own code, one upstream test's compiled program from

* ``test/dynamo/test_streams.py``     (newest stored revision, 78,945 chars, 62 tests)
* ``test/inductor/test_user_streams.py`` (revision 01ec0f7c969c, 79,286 chars, 63 tests)
* ``test/dynamo/test_ctx_manager.py`` (revision 008329794cb9, 95,916 chars): its eleven CUDA stream
  and event tests (``test_cuda_stream_*``, ``test_cuda_event_*``; ``test_cuda_stream_compared_with_constant``
  gives two programs). Its other tests are grad-mode, autocast, profiler and device contexts.
* ``test/inductor/test_control_deps.py`` (revision 063cd4b472cb, 31,510 chars): the four programs
  with user streams; its other tests build ``control_deps`` by hand in a post-grad pass or on a
  hand-made graph, and ``test_ordering_barrier_is_nop`` compiles the same program as
  ``test_control_deps_passthrough_creates_ordering_barrier``.

with the same sequence of stream switches, syncs and ops, translated to CPU. Nothing here
uses streampass; there is no pytest code. ``PROGRAMS`` is the list a harness iterates.
With ``STREAMPASS_CORPUS_DEVICE=cuda`` in the environment the same programs use CUDA streams and
events, and every stand-in below is torch's own object or call (:data:`DEVICE`).

Skipped upstream tests (no user program is compiled, or the body is empty)
-------------------------------------------------------------------------
test/dynamo/test_streams.py::TestStreams::
  test_stream_weakref                    - eager ``weakref.ref(torch.Stream("cpu"))``; nothing compiled
  test_event_weakref                     - eager ``weakref.ref(torch.Event("cpu"))``; nothing compiled
  test_stream_enter_exit_graph_break     - upstream body is ``pass`` (skipped placeholder)
  test_nested_stream_enter_exit_graph_break - upstream body is ``pass`` (skipped placeholder)
  test_new_stream_api                    - tests the private ``torch._dynamo.variables.streams.new_stream``
                                           from inside a custom backend; the compiled program is ``x + 1``
  test_current_stream_api                - same, for the private ``get_current_stream`` helper
  test_run_opcheck_fork_join             - ``torch.library.opcheck`` on the private streams::fork/join ops
  test_run_opcheck_wait_record           - opcheck on streams::record_event/wait_event
  test_run_opcheck_wait_record_stream    - opcheck on streams::wait_stream
  test_is_marked_side_effectful          - asserts membership of ops in ``torch.fx.node._side_effectful_functions``
  test_sync_dealloc_has_fake_impl        - calls streams::sync_dealloc under FakeTensorMode; nothing compiled
  test_record_stream_has_fake_impl       - calls streams::record_stream under FakeTensorMode; nothing compiled
  test_cuda_event_record_on_stream       - eager ``Stream.record_event(torch.cuda.Event())`` C++ type check
                                           (also ``unittest.skip`` upstream); nothing compiled
test/inductor/test_user_streams.py::
  TestStreamUtils::test_constants, test_get_stream_name_default, test_get_stream_name_side_streams,
  test_get_stream_name_cached            - inductor stream-name constants / ``get_stream_name`` helper
  TestWrapperCodegenStreams::test_enter_device_context_with_stream_info,
  test_exit_device_context_with_stream_info, test_enter_cuda_stream_context,
  test_exit_cuda_stream_context          - construct inductor wrapper-codegen line objects
  TestStreamCodegen::test_enter_cuda_stream_context_codegen,
  test_exit_cuda_stream_context_codegen  - codegen those line objects into an IndentedBuffer
Older stored revisions also had multi-GPU tests (test_get_current_stream_return_different_device,
test_get_current_stream_return_no_index, test_new_event_api) and inductor unit tests of
CudaEventFactory / CUDAStreamPool / config and of its event codegen lines (test_event_record_codegen,
test_event_wait_codegen, test_stream_context_with_event_sync); none compiles a user program, they are
not in the newest revisions and not here.

CPU translation (what works on CPU in torch 2.13.0, checked eagerly)
-------------------------------------------------------------------
* ``torch.cuda.Stream()`` -> ``torch.Stream('cpu')`` (module level / inputs) or ``torch.Stream('cpu')``
  inside fn too: the device is always named, since on a CUDA build of torch without a GPU
  ``torch.Stream()`` is a CUDA stream and cannot be created. ``with s:``, ``s.synchronize()``, ``s.wait_event(e)``,
  ``s.query()`` work. NOTE: every CPU stream has stream_id 0, so all CPU streams compare equal.
* ``torch.cuda.stream(s)`` -> ``with s:``.
* ``torch.cuda.Event()`` -> ``torch.Event``; ``e.wait()``/``e.wait(s)``/``e.synchronize()``/
  ``e.query()`` work, but ``e.record()`` raises "cpu backend doesn't support events." and so do
  ``Stream.record_event()`` and ``Stream.wait_stream()`` (both record an event internally);
  ``Tensor.record_stream`` has no CPU kernel; ``torch.accelerator.current_stream()`` /
  ``torch.accelerator.synchronize()`` raise (no accelerator). Documented alternatives used:
    - ``make_event(...)`` / ``make_stream(...)`` where upstream constructs the object inside the
      compiled function: under ``torch.compile`` (``torch.compiler.is_compiling()``) they return a
      real ``torch.Event``/``torch.Stream`` (so dynamo traces exactly the upstream construction);
      eagerly they return ``CpuEvent``/``CpuStream``.
    - ``CpuEvent`` / ``CpuStream``: subclasses of torch.Event/torch.Stream (dynamo treats instances
      passed in or held at module level as ordinary events/streams) whose ``record`` /
      ``record_event`` / ``wait_stream`` are no-ops. That is exact on CPU: CPU work runs
      synchronously in program order. Used for upstream objects created outside fn.
    - ``current_stream()`` for ``torch.accelerator.current_stream()`` / ``torch.cuda.current_stream()``:
      compiled -> ``torch.accelerator.current_stream()``; eager -> ``CpuStream("cpu")`` (equal to
      every CPU stream, incl. the entered one). ``.cuda_stream`` -> ``.stream_id``.
    - ``record_stream(t, s)`` for ``t.record_stream(s)``: compiled -> ``t.record_stream(s)``;
      eager -> no-op (CPU has no caching allocator).
  The compiled path therefore sees the upstream calls unchanged; where the CPU backend cannot run
  them at run time (e.g. the graph's streams::record_event on a real CPU torch.Event), the
  ``[eager-backend: ...]`` note prefix says so.
* Sizes are small (4x4, 16, ...). Inputs are deterministic (seeded per call) fresh tensors.
  Training inputs are leaves with requires_grad (upstream's ``torch.ones(..., requires_grad=True) + 1``
  is a non-leaf; here the same values are made leaves so their grads can be compared).
* Upstream often backprops one output (``actual[1].sum().backward()``); a harness that sums all
  tensor outputs covers that too.
* The ``[eager-backend: ...]`` prefix of each note is the result of
  ``torch.compile(fn, backend="eager", fullgraph=p.fullgraph)(*p.inputs())`` (+ backward when
  training) on this CPU-only machine, torch 2.13.0+cpu. "fails at run" = dynamo produced a graph
  and the failure came when running it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Program:
    name: str  # short unique id
    upstream: str  # "test/<file>.py::<Class>::<test>"
    fn: Callable  # the function to torch.compile (or an nn.Module factory, see kind)
    inputs: Callable[[], tuple]  # fresh inputs each call
    training: bool  # True when upstream runs backward
    kind: str = "function"  # "function" or "module"
    raises: type | None = None  # exception type upstream expects torch.compile to raise
    match: str = ""  # a regex the message must match, where upstream checks the message
    since: tuple[int, int] = (2, 11)  # the oldest torch that behaves as upstream expects
    fullgraph: bool = True  # False where upstream's program graph-breaks on purpose
    note: str = ""  # what upstream checks, how the CPU version differs


# --------------------------------------------------------------------------------------------
# CPU stand-ins (see the module docstring)
# --------------------------------------------------------------------------------------------
#: where the programs' streams and events live: "cpu" (the stand-ins below), or "cuda", set by
#: ``STREAMPASS_CORPUS_DEVICE=cuda`` (tests/test_cuda_corpus.py), where every stand-in is the real
#: thing: torch's own Event/Stream, recorded and waited on eagerly too, as upstream runs them.
DEVICE = os.environ.get("STREAMPASS_CORPUS_DEVICE", "cpu")
ON_CPU = DEVICE == "cpu"

if ON_CPU:

    class CpuEvent(torch.Event):
        """A torch.Event whose record() is a no-op: CPU events cannot be recorded, and CPU work is
        already ordered, so waiting on / synchronizing this event is correct as a no-op too."""

        def record(self, stream=None) -> None:
            return None

    class CpuStream(torch.Stream):
        """A torch.Stream whose wait_stream()/record_event() do not record a CPU event (which raises)."""

        def wait_stream(self, stream) -> None:
            return None

        def record_event(self, event=None):
            if event is None:
                event = CpuEvent(self.device)
            event.record(self)
            return event

else:  # torch's Stream.record_event refuses Event subclasses: no stand-in at all
    CpuEvent = torch.Event
    CpuStream = torch.Stream


# The device is always named: on a CUDA build of torch without a GPU, ``torch.Stream()`` means a
# CUDA stream ("Backend doesn't support create a new Stream").
_DEVICE = (DEVICE,)


def _real() -> bool:
    """Whether to call torch's own API: always on CUDA, and on CPU while dynamo traces."""
    return not ON_CPU or torch.compiler.is_compiling()


def make_event(*args, **kwargs):
    """``torch.Event(*args, **kwargs)`` when compiling or on CUDA, else a CpuEvent."""
    if _real():
        return torch.Event(*(args or _DEVICE), **kwargs)
    return CpuEvent(*(args or _DEVICE), **kwargs)


def record_event(stream):
    """``stream.record_event()``, as upstream writes it, on CUDA. On CPU, while compiling, as
    ``torch.Event(DEVICE)`` + ``record(stream)``: dynamo runs ``Stream.record_event`` on the real
    stream while tracing, which raises on CPU ("cpu backend doesn't support events"); the
    two-step form traces to the same record_event op. Eagerly on CPU a CpuEvent (recording is a
    no-op on CPU). ``tests/test_compile_events.py`` traces ``record_event()`` itself on CPU."""
    if not ON_CPU:
        return stream.record_event()
    if torch.compiler.is_compiling():
        e = torch.Event(DEVICE)
        e.record(stream)
        return e
    return CpuEvent()


def make_stream(*args, **kwargs):
    """``torch.Stream(*args, **kwargs)`` when compiling or on CUDA, else a CpuStream."""
    if _real():
        return torch.Stream(*(args or _DEVICE), **kwargs)
    return CpuStream(*(args or _DEVICE), **kwargs)


def current_stream():
    """``torch.accelerator.current_stream()`` when compiling or on CUDA; eagerly on CPU a CpuStream
    (so that ``current_stream().wait_stream(s)`` runs eagerly, as on CUDA)."""
    if _real():
        return torch.accelerator.current_stream()
    return CpuStream("cpu")


def record_stream(tensor: torch.Tensor, stream) -> None:
    """``tensor.record_stream(stream)`` when compiling or on CUDA; eagerly on CPU nothing (no kernel)."""
    if _real():
        tensor.record_stream(stream)


# --------------------------------------------------------------------------------------------
# input helpers: deterministic fresh tensors
# --------------------------------------------------------------------------------------------
def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int = 0, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).requires_grad_(requires_grad)


def _two(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """upstream's ``(torch.ones(2, 2) + 1, torch.ones(2, 2))`` at 4x4."""
    return (
        (torch.ones(4, 4) + 1).requires_grad_(requires_grad),
        torch.ones(4, 4).requires_grad_(requires_grad),
    )


DYN = "test/dynamo/test_streams.py::TestStreams::"
IND = "test/inductor/test_user_streams.py::"
CTX = "test/dynamo/test_ctx_manager.py::CtxManagerTests::"
CD = "test/inductor/test_control_deps.py::TestControlDeps::"


# ============================================================================================
# test/dynamo/test_streams.py
# ============================================================================================
def stream_enter_exit(x, y, s1, s2):
    with s1:
        z1 = torch.add(x, y)
    with s2:
        z = torch.add(x, y)
        y = z + 2 + z1

    return y


def stream_context_graph_break(x, y):
    s2 = torch.Stream(DEVICE)
    s1 = torch.Stream(DEVICE)
    with s1:
        z1 = torch.add(x, y)
    with s2:
        z = torch.add(x, y)
        y = z + 2 + z1
        torch._dynamo.graph_break()
        y = y + 1

    return y


def stream_input(x, y, s):
    z = torch.add(x, y)
    y = z + 2
    return y, s


def local_stream_return(x, y):
    s = torch.Stream(DEVICE)
    z = torch.add(x, y)
    y = z + 2
    return y, s


def get_current_stream_return(x, s):
    with s:
        s0 = current_stream()
    return x, s0


def cuda_current_stream_attrs(x):
    return current_stream().stream_id


def cuda_current_stream_with_entered_stream(x, s):
    with s:
        return current_stream().stream_id


def nested_stream_enter_exit(x, y, s0, s1, s2):
    with s1:
        with s2:
            z1 = torch.add(x, y)
    with s0:
        z0 = torch.add(x, y)
        with s2:
            y = 2 + z1

    return z0, y


def local_stream_enter_exit(x, y):
    s2 = torch.Stream(DEVICE)
    s1 = torch.Stream(DEVICE)
    with s1:
        z1 = torch.add(x, y)
    with s2:
        z = torch.add(x, y)
        y = z + 2 + z1

    return y


def local_stream_nested_enter_exit(x, y):
    s2 = torch.Stream(DEVICE)
    s1 = torch.Stream(DEVICE)
    s0 = torch.Stream(DEVICE)
    with s1:
        with s2:
            z1 = torch.add(x, y)
    with s0:
        z0 = torch.add(x, y)
        with s2:
            y = 2 + z1

    return z0, y


def stream_with_mutation(x, y):
    s2 = torch.Stream(DEVICE)
    s1 = torch.Stream(DEVICE)
    s0 = torch.Stream(DEVICE)
    with s1:
        with s2:
            x.add_(y)
    with s0:
        z1 = torch.add(y, y)
        z0 = torch.add(z1, y)
        with s2:
            y = 2 + z1

    return z0, y


def stream_backward_simple(x, y):
    s2 = torch.Stream(DEVICE)
    s0 = torch.Stream(DEVICE)
    with s0:
        y0 = 2 * x + y
    with s2:
        z = 2 * x + y

    return y0, z


def stream_backward_sync(x, y):
    s2 = torch.Stream(DEVICE)
    s0 = torch.Stream(DEVICE)
    with s0:
        y0 = 2 * x + y
    with s2:
        z = 2 * x + y

    return y0, z


def event_tracing(x):
    e = make_event()
    e.record()
    x.add_(1)
    return x


def record_stream_problem_basic(x):
    e = make_event()
    with torch.Stream(device=DEVICE):
        y = torch.ones(4, 4, device=DEVICE)
        e.record()
        z = y * x

    with torch.Stream(device=DEVICE):
        e.wait()
        z0 = y * 2 * x

    return z0, z


def record_stream_problem_interleaved(x):
    e = make_event()
    with torch.Stream(device=DEVICE):
        y = torch.ones(4, 4, device=DEVICE)
        z = y * x
        e.record()

    with torch.Stream(device=DEVICE):
        e.wait()
        z0 = y * 2 * z
        e.record()

    with torch.Stream(device=DEVICE):
        e.wait()
        z1 = y * x * z0
        e.record()

    with torch.Stream(device=DEVICE):
        e.wait()
        z2 = y * 4 * z1
        e.record()

    e.wait()
    return z, z1, z2


def epilogue_copy_streams_inference(x):
    with torch.Stream(device=DEVICE):
        with torch.no_grad():
            x.add_(2)

    return x


def epilogue_copy_streams_external(x):
    with torch.Stream(device=DEVICE):
        x.mul_(3)
    return x.sin()


def control_deps_wrapping_record_event(x):
    s1 = torch.Stream(device=DEVICE)
    s2 = torch.Stream(device=DEVICE)
    e = make_event()

    with s1:
        y = x + 1
        z = y * 2
        e.record()

    with s2:
        e.wait()
        w = z + 3

    return w


def control_deps_wrapping_wait_event(x):
    s1 = torch.Stream(device=DEVICE)
    s2 = torch.Stream(device=DEVICE)
    e = make_event()

    with s1:
        y = x + 1
        e.record()

    with s2:
        a = x * 3
        e.wait()
        z = y * a

    return z


def control_deps_prevents_invalid_reordering(x):
    s1 = torch.Stream(device=DEVICE)
    s2 = torch.Stream(device=DEVICE)
    e = make_event()

    with s1:
        y = x + 1
        z = y * 2
        e.record()

    with s2:
        e.wait()
        w = z + 3

    return w


def cross_event_deps_multiple_events(x):
    s1 = torch.Stream(device=DEVICE)
    s2 = torch.Stream(device=DEVICE)
    s3 = torch.Stream(device=DEVICE)
    e1 = make_event()
    e2 = make_event()

    with s1:
        y = x + 1
        e1.record()
        z = x + 5
        e2.record()

    with s2:
        e1.wait()
        a = x * 3

    with s3:
        e2.wait()
        b = x * 7

    return a + b + y + z


def cross_event_deps_event_reuse(x):
    s1 = torch.Stream(device=DEVICE)
    s2 = torch.Stream(device=DEVICE)
    e = make_event()

    with s1:
        y = x + 1
        e.record()  # first record
        z = y * 2
        e.record()  # second record, reuses same event

    with s2:
        e.wait()
        w = x + 3

    return w + z


class BwMutationWithStream(torch.autograd.Function):
    """upstream test_epilogue_copy_stream_tracking's autograd.Function, streams on cpu."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x)
        ctx.s1 = torch.Stream(device=DEVICE)
        ctx.s2 = torch.Stream(device=DEVICE)
        # Do computation on stream s2
        with ctx.s2:
            result = x * 2 + y
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        # Mutate saved tensor x on stream s1 in backward
        with ctx.s1:
            x.mul_(2)
        # Compute gradients on stream s2
        with ctx.s2:
            grad_x = grad_output * 2
            grad_y = grad_output.clone()
        return grad_x, grad_y, None, None


def epilogue_copy_stream_tracking(x, y):
    result = BwMutationWithStream.apply(x, y)
    return result


def inductor_lowering(x):
    e = make_event()
    x += x + 1
    e.record()
    return x


def backward_sync_control_deps_e2e(x, y):
    s0 = torch.Stream(DEVICE)
    s1 = torch.Stream(DEVICE)
    with s0:
        z0 = 2 * x + y
    with s1:
        z1 = 3 * x + y
    return z0, z1


def record_stream_fn(x):
    s = torch.Stream(DEVICE)
    record_stream(x, s)
    return x


def event_record_after_input_mutation_errors(x):
    s = torch.Stream(DEVICE)
    e = make_event()
    with s:
        x.add_(1)
        e.record()
    return e


def event_record_after_input_mutation_stack_traces(x):
    s = torch.Stream(DEVICE)
    e = make_event()
    with s:
        x.add_(1)
        e.record()
    return e


def event_record_after_input_mutation_record_event(x):
    s = make_stream()
    with s:
        x.add_(1)
        e = s.record_event()
    return e


def event_record_after_input_mutation_through_view(x):
    s = torch.Stream(DEVICE)
    e = make_event()
    v = x.view(-1)
    with s:
        v.add_(1)
        e.record()
    return e


def event_record_after_input_mutation_input_event(x, e):
    s = torch.Stream(DEVICE)
    with s:
        x.add_(1)
        e.record()
    return x


def event_record_before_input_mutation_no_error(x):
    s = torch.Stream(DEVICE)
    e = make_event()
    with s:
        e.record()
        x.add_(1)
    return e


def event_record_on_different_stream_no_error(x):
    s0 = torch.Stream(DEVICE)
    s1 = torch.Stream(DEVICE)
    e = make_event()
    with s0:
        x.add_(1)
    with s1:
        e.record()
    return e


def event_not_returned_no_error(x):
    s = torch.Stream(DEVICE)
    e = make_event()
    with s:
        x.add_(1)
        e.record()
    return x


def event_synchronize_tracing(x):
    e = make_event()
    e.record()
    x = x + 1
    e.synchronize()
    return x


def event_synchronize_inductor_lowering(x):
    e = make_event()
    x = x + 1
    e.record()
    e.synchronize()
    return x


def control_deps_wrapping_synchronize_event(x):
    e = make_event()
    y = x + 1
    e.record()
    e.synchronize()
    # z uses y which was produced before the record
    z = y * 2
    return z


def external_event_synchronize_threads_inputs(x):
    e = make_event()
    y = x + 1
    e.record()
    e.synchronize()
    z = y * 2
    return z


def event_synchronize_control_deps_e2e(x):
    e = make_event()
    y = x + 1
    e.record()
    e.synchronize()
    z = y * 2
    return z


def event_synchronize_e2e(a_list):
    a_cpu_list = []
    a_to_cpu_event_list = []
    for a in a_list:
        a_cpu = a.to(device="cpu", non_blocking=True)
        e = make_event()
        e.record()
        a_cpu_list.append(a_cpu)
        a_to_cpu_event_list.append(e)

    for e in a_to_cpu_event_list:
        e.synchronize()

    return torch.cat(a_cpu_list)


_DEFAULT_STREAM_EVENT = CpuEvent(DEVICE)  # upstream: e = torch.cuda.Event() outside f


def event_record_wait_on_default_stream(x):
    y = x + 1
    _DEFAULT_STREAM_EVENT.record()
    _DEFAULT_STREAM_EVENT.wait()
    return y + 1


def record_stream_inductor_output_code(x):
    s = torch.Stream(device=DEVICE)
    y = x + 1
    record_stream(y, s)
    z = y * 2
    return z


def del_multi_stream_sync_dealloc(x, y):
    s = torch.Stream(DEVICE)
    e = make_event()
    z0 = x + 1
    with s:
        z = torch.add(x, y)
        e.record()
    e.wait()
    del x
    return z0, z


def del_same_stream_no_sync_dealloc(x, y):
    s = torch.Stream(DEVICE)
    e = make_event()
    with s:
        z = torch.add(x, y)
        del x
        e.record()
    e.wait()
    return z


def del_single_stream_no_sync_dealloc(x, y):
    z = torch.add(x, y)
    del x
    return z


class Holder:
    """upstream test_del_attr_multi_stream_sync_dealloc's attribute holder."""


def del_attr_multi_stream_sync_dealloc(x, y):
    s = torch.Stream(DEVICE)
    e = make_event()
    h = Holder()
    h.tensor = x
    z0 = x + 1
    with s:
        z = torch.add(h.tensor, y)
        e.record()
    e.wait()
    del h.tensor
    return z0, z


def del_subscr_multi_stream_sync_dealloc(x, y):
    s = torch.Stream(DEVICE)
    e = make_event()
    d = {"t": x}
    z0 = x + 1
    with s:
        z = torch.add(d["t"], y)
        e.record()
    e.wait()
    del d["t"]
    return z0, z


def stream_pointer_extraction_edge_cases(stream_a, stream_b, default_stream):
    return (
        stream_a.stream_id,
        stream_b.stream_id,
        default_stream.stream_id,
    )


# ============================================================================================
# test/inductor/test_user_streams.py
# ============================================================================================
# ---- TestUserStreamCompile -----------------------------------------------------------------
def compile_with_user_stream_context(x, y):
    # Create a side stream
    s = torch.Stream(DEVICE)
    # Perform operation on default stream
    z = x + y
    # Perform operation on side stream
    with s:
        w = z * 2
    # Synchronize before using result
    s.synchronize()
    return w + 1


def compile_preserves_stream_semantics(x):
    s = torch.Stream(DEVICE)
    # Work on default stream
    a = x * 2
    # Work on side stream
    with s:
        b = x * 3
    s.synchronize()
    return a + b


def multiple_stream_contexts(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)

    a = x + 1  # default stream

    with s1:
        b = x * 2  # stream 1

    with s2:
        c = x * 3  # stream 2

    s1.synchronize()
    s2.synchronize()
    return a + b + c


def nested_stream_contexts(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)

    with s1:
        a = x * 2
        with s2:
            b = x * 3
        c = a + 1  # back on s1

    s1.synchronize()
    s2.synchronize()
    return a + b + c


def stream_context_with_data_dependency(x):
    s = torch.Stream(DEVICE)

    # Compute on default stream
    a = x * 2

    # Use result on side stream
    with s:
        b = a + 1  # depends on 'a' from default stream

    s.synchronize()
    return b


def event_record_and_wait(x):
    s = torch.Stream(DEVICE)
    event = make_event()

    # Compute on default stream
    a = x * 2
    # Record event on default stream
    event.record()

    with s:
        # Wait for event before using 'a'
        event.wait()
        b = a + 1

    s.synchronize()
    return b


def event_record_on_stream(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    event = make_event()

    with s1:
        a = x * 2
        # Record on s1
        event.record(s1)

    with s2:
        # Wait for s1's work before proceeding
        event.wait(s2)
        b = a + 1

    s1.synchronize()
    s2.synchronize()
    return b


def multiple_events_multiple_streams(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    event1 = make_event()
    event2 = make_event()

    # Work on s1
    with s1:
        a = x * 2
        event1.record(s1)

    # Work on s2, depends on s1
    with s2:
        event1.wait(s2)
        b = a + 1
        event2.record(s2)

    # Back to default stream, wait for s2
    event2.wait()
    c = b + x

    s1.synchronize()
    s2.synchronize()
    return c


def event_wait_without_record(x):
    s = torch.Stream(DEVICE)
    event = make_event()

    # Record the event first
    event.record()

    with s:
        # Wait is valid after record
        event.wait()
        a = x * 2

    s.synchronize()
    return a


def stream_wait_event(x):
    s = torch.Stream(DEVICE)
    event = make_event()

    a = x * 2
    event.record()

    # Use stream.wait_event instead of event.wait
    s.wait_event(event)
    with s:
        b = a + 1

    s.synchronize()
    return b


def bidirectional_stream_sync(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    event_s1 = make_event()
    event_s2 = make_event()

    # s1 does work
    with s1:
        a = x * 2
        event_s1.record(s1)

    # s2 waits for s1, does work, signals back
    with s2:
        event_s1.wait(s2)
        b = a + 1
        event_s2.record(s2)

    # s1 waits for s2
    with s1:
        event_s2.wait(s1)
        c = b * 2

    s1.synchronize()
    s2.synchronize()
    return c


def three_streams_pipeline(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    s3 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()

    # Stage 1 on s1
    with s1:
        a = x * 2
        e1.record(s1)

    # Stage 2 on s2, depends on s1
    with s2:
        e1.wait(s2)
        b = a + 1
        e2.record(s2)

    # Stage 3 on s3, depends on s2
    with s3:
        e2.wait(s3)
        c = b * 3

    s1.synchronize()
    s2.synchronize()
    s3.synchronize()
    return c


def parallel_streams_join(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    s3 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()
    e3 = make_event()

    # Parallel work on three streams
    with s1:
        a = x * 2
        e1.record(s1)

    with s2:
        b = x * 3
        e2.record(s2)

    with s3:
        c = x * 4
        e3.record(s3)

    # Join all results on default stream
    e1.wait()
    e2.wait()
    e3.wait()
    result = a + b + c

    s1.synchronize()
    s2.synchronize()
    s3.synchronize()
    return result


def fan_out_fan_in(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e_start = make_event()
    e1 = make_event()
    e2 = make_event()

    # Initial work on default stream
    a = x * 2
    e_start.record()

    # Fan out to s1 and s2
    with s1:
        e_start.wait(s1)
        b = a + 1
        e1.record(s1)

    with s2:
        e_start.wait(s2)
        c = a + 2
        e2.record(s2)

    # Fan in on default stream
    e1.wait()
    e2.wait()
    result = b + c

    s1.synchronize()
    s2.synchronize()
    return result


def four_streams_diamond(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    s3 = torch.Stream(DEVICE)
    e_start = make_event()
    e1 = make_event()
    e2 = make_event()

    # Start on default stream
    a = x + 1
    e_start.record()

    # Parallel branches on s1 and s2
    with s1:
        e_start.wait(s1)
        b = a * 2
        e1.record(s1)

    with s2:
        e_start.wait(s2)
        c = a * 3
        e2.record(s2)

    # Join on s3
    with s3:
        e1.wait(s3)
        e2.wait(s3)
        d = b + c

    s1.synchronize()
    s2.synchronize()
    s3.synchronize()
    return d


def stream_reuse_across_iterations(x):
    s = torch.Stream(DEVICE)
    event = make_event()
    result = x

    for _ in range(3):
        with s:
            result = result * 2
            event.record(s)
        event.wait()

    s.synchronize()
    return result


def no_fusion_across_streams(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()

    # These could be fused if on same stream, but should NOT be fused
    with s1:
        a = x * 2
        b = a + 1
        c = b * 3
        e1.record(s1)

    with s2:
        d = x * 4
        e = d + 2
        f = e * 5
        e2.record(s2)

    e1.wait()
    e2.wait()
    return c + f


def no_fusion_across_streams_with_dependency(x):
    s = torch.Stream(DEVICE)
    event = make_event()

    # Work on default stream
    a = x * 2
    b = a + 1
    event.record()

    # Work on side stream - depends on default stream
    with s:
        event.wait()
        c = b * 3  # depends on b from default stream
        d = c + 1

    s.synchronize()
    return d


def fusion_within_same_stream(x):
    s = torch.Stream(DEVICE)

    with s:
        # Multiple pointwise ops on same stream - should fuse
        a = x * 2
        b = a + 1
        c = b * 3
        d = c + 2

    s.synchronize()
    return d


def no_fusion_simple_dependency_across_streams(x):
    s1 = make_stream()
    s2 = torch.Stream(DEVICE)

    with s1:
        a = x + 1
    e = record_event(s1)
    s2.wait_event(e)
    with s2:
        b = a * 2
    s1.synchronize()
    s2.synchronize()
    return b


def no_combo_kernel_fusion_across_streams(x, y, z, w):
    s = torch.Stream(DEVICE)
    event = make_event()

    # Independent pointwise ops on different streams at the same topological level
    a = x + y
    event.record()
    with s:
        event.wait()
        b = z + w
    s.synchronize()
    return a, b


def combo_kernel_fusion_within_same_stream(x, y):
    s = torch.Stream(DEVICE)

    with s:
        # Two independent pointwise ops on the same stream
        a = x * 2
        b = y * 3

    s.synchronize()
    return a + b


def cross_stream_stride_copy(x):
    s1 = make_stream()
    s2 = torch.Stream(DEVICE)

    with s1:
        a = x + 1
        b = a[:, ::2]  # non-contiguous slice
    e = record_event(s1)
    s2.wait_event(e)
    with s2:
        c = b.contiguous()
        d = c + 1
    s2.synchronize()
    return d


def no_buffer_reuse_across_streams(x):
    s1 = make_stream()
    s2 = torch.Stream(DEVICE)
    with s1:
        a = x + 1
    e = record_event(s1)
    s2.wait_event(e)
    with s2:
        b = a + 2
    s2.synchronize()
    return b


def stream_record_wait_event_not_dropped(x):
    s1 = make_stream()
    s2 = torch.Stream(DEVICE)
    with s1:
        a = x + 1
    e = record_event(s1)
    s2.wait_event(e)
    with s2:
        b = a * 2
    s2.synchronize()
    return b


def stream_synchronize_not_dropped(x):
    s = torch.Stream(DEVICE)
    with s:
        a = x + 1
    s.synchronize()
    b = a * 2
    return b


def stream_wait_stream_not_dropped(x):
    s1 = torch.Stream(DEVICE)
    s2 = make_stream()
    with s1:
        a = x + 1
    s2.wait_stream(s1)
    with s2:
        b = a * 2
    s2.synchronize()
    return b


def codegen_structure_single_stream(x):
    s = torch.Stream(DEVICE)
    a = x * 2
    with s:
        b = x * 3
    s.synchronize()
    return a + b


def codegen_structure_pipeline(x, w1, w2):
    s = torch.Stream(DEVICE)
    event = make_event()
    a = x @ w1
    event.record()
    with s:
        event.wait()
        b = a @ w2
    s.synchronize()
    return b


def codegen_structure_three_stream_pipeline(x, w1, w2, w3):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    s3 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()
    with s1:
        a = x @ w1
        e1.record(s1)
    with s2:
        e1.wait(s2)
        b = a @ w2
        e2.record(s2)
    with s3:
        e2.wait(s3)
        c = b @ w3
    s1.synchronize()
    s2.synchronize()
    s3.synchronize()
    return c


def codegen_structure_parallel_matmuls(x, w1, w2):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()
    with s1:
        a = x @ w1
        e1.record(s1)
    with s2:
        b = x @ w2
        e2.record(s2)
    e1.wait()
    e2.wait()
    c = a + b
    s1.synchronize()
    s2.synchronize()
    return c


# ---- TestStreamOrderingStress --------------------------------------------------------------
def heavy_matmul_chain(x, w, depth=8):
    """upstream TestStreamOrderingStress._heavy_matmul_chain."""
    h = x
    for _ in range(depth):
        h = h @ w
    return h


def race_producer_consumer(x, w):
    s = torch.Stream(DEVICE)
    e = make_event()

    # Heavy producer on default stream
    a = heavy_matmul_chain(x, w)
    e.record()

    with s:
        e.wait()  # removing this would cause a race
        b = a + 1

    s.synchronize()
    return b


def race_ping_pong(x, w):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()

    with s1:
        a = heavy_matmul_chain(x, w)
        e1.record(s1)

    with s2:
        e1.wait(s2)
        b = heavy_matmul_chain(a, w)
        e2.record(s2)

    with s1:
        e2.wait(s1)
        c = b + a

    s1.synchronize()
    s2.synchronize()
    return c


def race_fan_out(x, w):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    s3 = torch.Stream(DEVICE)
    e = make_event()
    e1 = make_event()
    e2 = make_event()
    e3 = make_event()

    # Slow producer
    a = heavy_matmul_chain(x, w)
    e.record()

    with s1:
        e.wait()
        r1 = a * 2
        e1.record(s1)

    with s2:
        e.wait()
        r2 = a * 3
        e2.record(s2)

    with s3:
        e.wait()
        r3 = a * 4
        e3.record(s3)

    e1.wait()
    e2.wait()
    e3.wait()
    result = r1 + r2 + r3

    s1.synchronize()
    s2.synchronize()
    s3.synchronize()
    return result


def race_diamond(x, w):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e_fork = make_event()
    e1 = make_event()
    e2 = make_event()

    base = x @ w
    e_fork.record()

    with s1:
        e_fork.wait()
        branch1 = heavy_matmul_chain(torch.relu(base), w)
        e1.record(s1)

    with s2:
        e_fork.wait()
        branch2 = heavy_matmul_chain(torch.sigmoid(base), w)
        e2.record(s2)

    e1.wait()
    e2.wait()
    result = branch1 + branch2

    s1.synchronize()
    s2.synchronize()
    return result


def race_pipeline(x, w):
    streams = [torch.Stream(DEVICE) for _ in range(4)]
    events = [make_event() for _ in range(3)]

    with streams[0]:
        h = heavy_matmul_chain(x, w, depth=4)
        events[0].record(streams[0])

    with streams[1]:
        events[0].wait(streams[1])
        h = heavy_matmul_chain(h, w, depth=4)
        events[1].record(streams[1])

    with streams[2]:
        events[1].wait(streams[2])
        h = heavy_matmul_chain(h, w, depth=4)
        events[2].record(streams[2])

    with streams[3]:
        events[2].wait(streams[3])
        h = h + x  # quick consumer - races if wait is missing

    for s in streams:
        s.synchronize()
    return h


def race_back_to_back(x, w):
    s = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()

    a = heavy_matmul_chain(x, w)
    e1.record()

    with s:
        e1.wait()
        b = heavy_matmul_chain(a, w)
        e2.record(s)

    e2.wait()
    c = b + 1

    s.synchronize()
    return c


def race_triton_on_user_stream(x, w):
    s = torch.Stream(DEVICE)
    e = make_event()

    with s:
        # Heavy matmul chain produces data on user stream
        a = heavy_matmul_chain(x, w)
        # pointwise on the same user stream
        b = torch.relu(a)
        e.record(s)

    e.wait()
    s.synchronize()
    return b


# ---- TestGenericStreamCompile: streams/events created outside the compiled function ----------
_GB_STREAM = torch.Stream(DEVICE)
_GB_CUDA_STREAM = torch.Stream(
    stream_id=_GB_STREAM.stream_id,
    device_index=_GB_STREAM.device_index,
    device_type=_GB_STREAM.device_type,
)


def generic_stream_basic(x):
    with _GB_CUDA_STREAM:
        a = x * 2
        b = a + 1

    _GB_CUDA_STREAM.synchronize()
    return b


_GE_STREAM = torch.Stream(DEVICE)
_GE_EVENT = CpuEvent(DEVICE)
_GE_CUDA_STREAM = torch.Stream(
    stream_id=_GE_STREAM.stream_id,
    device_index=_GE_STREAM.device_index,
    device_type=_GE_STREAM.device_type,
)


def generic_stream_with_event(x):
    # Work on default stream
    a = x * 2
    _GE_EVENT.record()

    with _GE_CUDA_STREAM:
        _GE_EVENT.wait()
        b = a + 1

    _GE_CUDA_STREAM.synchronize()
    return b


_GM_STREAM1 = torch.Stream(DEVICE)
_GM_STREAM2 = torch.Stream(DEVICE)
_GM_EVENT = CpuEvent(DEVICE)
_GM_CUDA_STREAM1 = torch.Stream(
    stream_id=_GM_STREAM1.stream_id,
    device_index=_GM_STREAM1.device_index,
    device_type=_GM_STREAM1.device_type,
)
_GM_CUDA_STREAM2 = torch.Stream(
    stream_id=_GM_STREAM2.stream_id,
    device_index=_GM_STREAM2.device_index,
    device_type=_GM_STREAM2.device_type,
)


def generic_stream_multiple(x):
    with _GM_CUDA_STREAM1:
        a = x * 2
        _GM_EVENT.record()

    with _GM_CUDA_STREAM2:
        _GM_EVENT.wait()
        b = a + 1

    _GM_CUDA_STREAM1.synchronize()
    _GM_CUDA_STREAM2.synchronize()
    return b


_GR_STREAM = torch.Stream(DEVICE)
_GR_EVENT = CpuEvent(DEVICE)
_GR_CUDA_STREAM = torch.Stream(
    stream_id=_GR_STREAM.stream_id,
    device_index=_GR_STREAM.device_index,
    device_type=_GR_STREAM.device_type,
)


def generic_event_record_on_stream(x):
    with _GR_CUDA_STREAM:
        a = x * 2
        # Record event with explicit stream
        _GR_EVENT.record(_GR_CUDA_STREAM)

    _GR_EVENT.wait()
    b = a + 1

    _GR_CUDA_STREAM.synchronize()
    return b


# ---- TestStreamIdentity ----------------------------------------------------------------------
_SI_USER_STREAM = torch.Stream(DEVICE)


def single_stream_identity(x):
    with _SI_USER_STREAM:
        return x * 2


_MI_STREAM_A = torch.Stream(DEVICE)
_MI_STREAM_B = torch.Stream(DEVICE)


def multiple_stream_identity(x):
    event = make_event()
    with _MI_STREAM_A:
        a = x * 2
        event.record()
    with _MI_STREAM_B:
        event.wait()
        b = a + 1
    _MI_STREAM_B.synchronize()
    return b


# ---- TestPDLWithMultiStream ------------------------------------------------------------------
def pdl_single_side_stream(x):
    s = torch.Stream(DEVICE)
    with s:
        a = x * 2
        b = a + 1
    s.synchronize()
    return b


def pdl_correctness_with_multiple_streams(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()

    with s1:
        a = x * 2 + 1
        e1.record(s1)

    with s2:
        b = x * 3 + 2
        e2.record(s2)

    e1.wait()
    e2.wait()
    return a + b


def pdl_cross_stream_events_preserved(x):
    s = torch.Stream(DEVICE)
    event = make_event()

    a = x * 2 + 1
    event.record()

    with s:
        event.wait()
        b = a + 3

    s.synchronize()
    return b


def pdl_same_stream_consecutive_kernels(x, y):
    s = torch.Stream(DEVICE)
    with s:
        # Two separate fused groups on the same stream
        a = x**2 + x
        y.copy_(a)
    s.synchronize()
    return y


def pdl_no_fusion_across_streams(x):
    s1 = torch.Stream(DEVICE)
    s2 = torch.Stream(DEVICE)
    e1 = make_event()
    e2 = make_event()

    with s1:
        a = x * 2
        b = a + 1
        e1.record(s1)

    with s2:
        c = x * 3
        d = c + 2
        e2.record(s2)

    e1.wait()
    e2.wait()
    return b + d


def pdl_stress_multistream_correctness(x, w):
    s = torch.Stream(DEVICE)
    e = make_event()

    h = x
    for _ in range(4):
        h = h @ w
    e.record()

    with s:
        e.wait()
        out = torch.relu(h) + 1.0

    s.synchronize()
    return out


def pdl_mutation_across_streams(x):
    s = torch.Stream(DEVICE)
    event = make_event()

    # Produce a new buffer (not input mutation) then record
    a = x * 2
    event.record()

    with s:
        event.wait()
        # In-place add on side stream
        a.add_(1)

    s.synchronize()
    return a


# ---- TestStreamCudagraphInteraction: stream and events created outside fn --------------------
_IC_S1 = torch.Stream(DEVICE)
_IC_EV = CpuEvent(DEVICE)
_IC_EV2 = CpuEvent(DEVICE)


def implicit_current_stream_with_cudagraphs(x, y):
    _IC_EV.record()
    with _IC_S1:
        _IC_EV.wait()
        z = x * 2
        _IC_EV2.record()
    _IC_EV2.wait()
    return z + y


_EC_S1 = torch.Stream(DEVICE)
_EC_EV = CpuEvent(DEVICE)
_EC_EV2 = CpuEvent(DEVICE)


def explicit_current_stream_with_cudagraphs(x, y):
    cur = current_stream()
    _EC_EV.record(cur)
    with _EC_S1:
        _EC_EV.wait()
        z = x * 2
        _EC_EV2.record()
    _EC_EV2.wait(cur)
    return z + y


# --------------------------------------------------------------------------------------------
# test/dynamo/test_ctx_manager.py (CtxManagerTests): its CUDA stream and event tests
# --------------------------------------------------------------------------------------------
def ctx_stream_context_manager1(x):
    s = make_stream()
    x = torch.mul(x, 5)
    x = torch.add(x, 2)
    current = current_stream()
    s.wait_stream(current)
    with s:
        x = torch.relu(x)
    current.wait_stream(s)
    x = torch.add(x, 1)
    x = torch.cos(x)
    return x


_XB_STREAM = CpuStream(DEVICE)


def ctx_stream_across_graph_break(x, current):
    s = make_stream() if not ON_CPU else _XB_STREAM  # see the note
    x = torch.mul(x, 5)
    x = torch.add(x, 2)
    torch._dynamo.graph_break()  # upstream: print("foo")
    tcs = s  # upstream: tcs = torch.cuda.stream(s), entered below
    s.wait_stream(current)
    with tcs:
        x = torch.relu(x)
    current.wait_stream(s)
    x = torch.add(x, 1)
    x = torch.cos(x)
    return x


def ctx_stream_context_manager2(x, s):
    x = torch.mul(x, 5)
    x = torch.add(x, 2)
    current = current_stream()
    s.wait_stream(current)
    with s:
        x = torch.relu(x)
    current.wait_stream(s)
    with current if not ON_CPU else contextlib.nullcontext():  # see the note
        x = torch.relu(x)
    s2 = make_stream()
    s2.wait_stream(current)
    with s2:
        x = torch.relu(x)
    current.wait_stream(s2)
    x = torch.add(x, 1)
    x = torch.cos(x)
    return x


def ctx_stream_method(x):
    x = torch.mul(x, 1)
    x = torch.add(x, 2)
    new_stream = make_stream()
    cur_stream = current_stream()
    new_stream.wait_stream(cur_stream)
    with new_stream:
        x = torch.sin(x)
        x = torch.add(x, 3)
    cur_stream.wait_stream(new_stream)
    x = torch.add(x, 4)
    cur_stream.query()
    cur_stream.synchronize()
    with new_stream:
        x = torch.add(x, 5)
    new_stream.synchronize()
    x = torch.relu(x)
    x = torch.cos(x)
    return x


def ctx_stream_compared_with_none(x):
    x = torch.mul(x, 1)
    x = torch.add(x, 2)
    if current_stream() is not None:
        return x + 1
    return x - 1


def ctx_stream_compared_with_str(x):
    x = torch.mul(x, 1)
    x = torch.add(x, 2)
    if current_stream() != "const_str":
        return x + 1
    return x - 1


def ctx_stream_compared_with_stream(x, s0, s1):
    if s0 == s1:
        return x + 1
    return x - 1


def ctx_event_reconstruct(x):
    e = make_event()
    x = torch.mul(x, 5)
    x = torch.add(x, 2)
    return x, e


def ctx_event_across_graph_break(x, current):
    e = make_event()
    e.record(current)
    x = torch.mul(x, 5)
    x = torch.add(x, 2)
    torch._dynamo.graph_break()  # upstream: print("foo")
    current.wait_event(e)
    x = torch.add(x, 1)
    x = torch.cos(x)
    return x, e


_CO_STREAM = torch.Stream(DEVICE)
_CO_EVENT = CpuEvent(DEVICE)


def ctx_event_created_outside_of_graph(foo):
    _CO_EVENT.wait()
    return foo + 1, _CO_EVENT


def _mm_on_user_stream() -> tuple[torch.Tensor]:
    """Upstream's eager half: ``torch.mm(x, x, out=foo)`` and ``event.record()`` on a user stream."""
    x = _randn(8, 8, seed=3).to(DEVICE)
    foo = torch.empty(8, 8, device=DEVICE)
    with _CO_STREAM:
        torch.mm(x, x, out=foo)
        _CO_EVENT.record()
    return (foo,)


def ctx_event_method_create_stream_outside_of_compile(x, cur_stream, new_stream):
    x = torch.mul(x, 1)
    x = torch.add(x, 2)
    x = torch.add(x, 3)
    event = record_event(cur_stream)
    event.query()
    new_stream.wait_event(event)
    with new_stream:
        x = torch.add(x, 4)
    new_event = make_event()
    new_event.record(new_stream)
    new_event.wait(cur_stream)
    x = torch.add(x, 5)
    new_event.synchronize()  # use new event to sync
    x = torch.relu(x)
    x = torch.cos(x)
    return x


def ctx_event_method(x):
    """Upstream's body is the one above, with both streams obtained inside the function."""
    return ctx_event_method_create_stream_outside_of_compile(x, current_stream(), make_stream())


# --------------------------------------------------------------------------------------------
# test/inductor/test_control_deps.py (TestControlDeps): the tests that compile a user stream program
# --------------------------------------------------------------------------------------------
def cd_orders_void_op_across_nested_calls(x):
    s1 = make_stream()
    s2 = make_stream()
    e = make_event()
    with s1:
        y = x + 1
        e.record()
    with s2:
        a = x * 3
        e.wait()
        z = y * a
    return z


def cd_passthrough_creates_ordering_barrier(x):
    s = make_stream()
    e = make_event()
    with s:
        y = x + 1
        e.record()
    e.wait()
    return y * 2


def cd_host_to_device_transfer_between_sync_passthroughs(x, w):
    meta = torch.tensor(x.shape[-2], dtype=torch.long)  # a host tensor, live across the sync
    residual = x.sin()
    s = make_stream()
    with s:
        out = x @ w
    s.synchronize()
    extra = meta.to(device=out.device, dtype=out.dtype)
    return torch.cat((out, extra.expand(*out.shape[:-1], 1), residual), dim=-1)


# ============================================================================================
# the corpus
# ============================================================================================
_AFTER_BREAK = (
    "The current stream is passed in (upstream: torch.cuda.current_stream() inside; on CUDA the "
    "input is that stream). CPU: dynamo has no current stream, and a graph break inside the "
    "harness's `with` makes dynamo trace the function as a frame of its own, outside it."
)
_EV_NOTE = "make_event() is torch.Event('cpu') when compiling, CpuEvent eagerly (CPU events cannot record)."

PROGRAMS: list[Program] = [
    # ---------------------------------------------------------------- test/dynamo/test_streams.py
    Program(
        name="stream_enter_exit",
        upstream=DYN + "test_stream_enter_exit",
        fn=stream_enter_exit,
        inputs=lambda: (*_two(), torch.Stream(DEVICE), torch.Stream(DEVICE)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Two streams passed as args, entered one after the other. Upstream checks one fw "
            "graph, the stream annotation of each node, and equality with eager."
        ),
    ),
    Program(
        name="stream_context_graph_break",
        upstream=DYN + "test_stream_context_graph_break",
        fn=stream_context_graph_break,
        inputs=lambda: _two(),
        training=False,
        fullgraph=False,
        note=(
            "[eager-backend: ok] "
            "torch._dynamo.graph_break() inside a locally created stream's context; upstream "
            "expects 2 fw graphs (test is unittest.skip upstream: 'Needs graph break support "
            "with annotation context')."
        ),
    ),
    Program(
        name="stream_input",
        upstream=DYN + "test_stream_input",
        fn=stream_input,
        inputs=lambda: (*_two(), torch.Stream(DEVICE)),
        training=False,
        note=("[eager-backend: ok] A stream passed in and returned unchanged; upstream checks compiled == eager."),
    ),
    Program(
        name="local_stream_return",
        upstream=DYN + "test_local_stream_return",
        fn=local_stream_return,
        inputs=lambda: _two(),
        training=False,
        note=(
            "[eager-backend: ok] "
            "A stream created inside and returned; upstream checks it is a torch.Stream and a "
            "new one each call (assertNotEqual). On CPU all streams compare equal (stream_id 0), "
            "so that inequality cannot hold here."
        ),
    ),
    Program(
        name="get_current_stream_return",
        upstream=DYN + "test_get_current_stream_return",
        fn=get_current_stream_return,
        inputs=lambda: (torch.ones(4, 4) + 1, torch.Stream(DEVICE)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "torch.accelerator.current_stream() inside `with s:`; upstream checks it returns s. "
            "CPU: current_stream() is torch.accelerator.current_stream() when compiling (raises "
            "on CPU: no accelerator), torch.Stream('cpu') eagerly (== s, all CPU streams equal)."
        ),
    ),
    Program(
        name="cuda_current_stream_attrs",
        upstream=DYN + "test_cuda_current_stream_attrs",
        fn=cuda_current_stream_attrs,
        inputs=lambda: (torch.zeros(1),),
        training=False,
        note=(
            "[eager-backend: fails: Unsupported: bad device argument to "
            "torch.accelerator.current_stream] "
            "Upstream returns torch.cuda.current_stream().cuda_stream (backend='eager', "
            "fullgraph) and compares with eager. CPU: current_stream().stream_id (see "
            "current_stream())."
        ),
    ),
    Program(
        name="cuda_current_stream_with_entered_stream",
        upstream=DYN + "test_cuda_current_stream_with_entered_stream",
        fn=cuda_current_stream_with_entered_stream,
        inputs=lambda: (torch.zeros(1), torch.Stream(DEVICE)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Returns torch.cuda.current_stream().cuda_stream inside `with s:` (s passed in); "
            "upstream compares with eager. CPU: current_stream().stream_id."
        ),
    ),
    Program(
        name="nested_stream_enter_exit",
        upstream=DYN + "test_nested_stream_enter_exit",
        fn=nested_stream_enter_exit,
        inputs=lambda: (*_two(), torch.Stream(DEVICE), torch.Stream(DEVICE), torch.Stream(DEVICE)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Three streams passed as args, nested contexts (s1>s2, s0>s2). Upstream checks one "
            "fw graph with per-node stream annotations and equality with eager."
        ),
    ),
    Program(
        name="local_stream_enter_exit",
        upstream=DYN + "test_local_stream_enter_exit",
        fn=local_stream_enter_exit,
        inputs=lambda: _two(),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Same as stream_enter_exit with the streams created inside; upstream checks annotations."
        ),
    ),
    Program(
        name="local_stream_nested_enter_exit",
        upstream=DYN + "test_local_stream_nested_enter_exit",
        fn=local_stream_nested_enter_exit,
        inputs=lambda: _two(),
        training=False,
        note=("[eager-backend: ok] Nested contexts of three locally created streams; upstream checks annotations."),
    ),
    Program(
        name="stream_with_mutation",
        upstream=DYN + "test_stream_with_mutation",
        fn=stream_with_mutation,
        inputs=lambda: _two(),
        training=False,
        note=(
            "[eager-backend: ok] "
            "In-place x.add_(y) on a nested stream (input mutation); upstream checks the "
            "functionalized graph: the copy_ epilogue carries the mutating stream's annotation."
        ),
    ),
    Program(
        name="stream_backward_simple",
        upstream=DYN + "test_stream_backward_simple",
        fn=stream_backward_simple,
        inputs=lambda: _two(requires_grad=True),
        training=True,
        note=(
            "[eager-backend: ok] "
            "Two side streams in forward; upstream backprops actual[1] and checks the bw graph: "
            "per-stream annotations, control_deps-wrapped record_event and a sync_dealloc."
        ),
    ),
    Program(
        name="stream_backward_sync",
        upstream=DYN + "test_stream_backward_sync",
        fn=stream_backward_sync,
        inputs=lambda: _two(requires_grad=True),
        training=True,
        note=(
            "[eager-backend: ok] "
            "Same program as stream_backward_simple with device cuda:0 tensors; upstream checks "
            "the bw graph's record/wait (control_deps) and sync_dealloc for the cross-stream grad."
        ),
    ),
    Program(
        name="event_tracing",
        upstream=DYN + "test_event_tracing",
        fn=event_tracing,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "A local event recorded on the current stream, then an input mutation; upstream checks "
            "the graph has streams.record_event before add/copy_. " + _EV_NOTE
        ),
    ),
    Program(
        name="record_stream_problem_basic",
        upstream=DYN + "test_record_stream_problem_basic",
        fn=record_stream_problem_basic,
        inputs=lambda: (torch.ones(4, 4, requires_grad=True),),
        training=True,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "y allocated on one anonymous stream and used on another after e.record()/e.wait(); "
            "upstream backprops actual[1] and checks the bw graph has a sync_dealloc for y's "
            "gradient use (the record_stream problem). " + _EV_NOTE
        ),
    ),
    Program(
        name="record_stream_problem_interleaved",
        upstream=DYN + "test_record_stream_problem_interleaved",
        fn=record_stream_problem_interleaved,
        inputs=lambda: (torch.ones(4, 4, requires_grad=True),),
        training=True,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Four anonymous streams chained by one reused event (record/wait each hop), y used on "
            "all; upstream backprops actual[1] and checks interleaved record/wait/sync_dealloc in "
            "the bw graph. " + _EV_NOTE
        ),
    ),
    Program(
        name="epilogue_copy_streams_inference",
        upstream=DYN + "test_epilogue_copy_streams_inference",
        fn=epilogue_copy_streams_inference,
        inputs=lambda: (torch.ones(4, 4, requires_grad=True),),
        training=True,
        note=(
            "[eager-backend: ok] "
            "no_grad in-place add on a leaf inside a stream context, x returned; upstream runs "
            "actual.sum().backward() and checks the add/copy_ epilogue is annotated with the stream."
        ),
    ),
    Program(
        name="epilogue_copy_streams_external",
        upstream=DYN + "test_epilogue_copy_streams_external",
        fn=epilogue_copy_streams_external,
        inputs=lambda: (torch.ones(4, 4, requires_grad=True).clone(),),
        training=False,
        raises=RuntimeError,
        match="Mutations on inputs with user-specified streams",
        note=(
            "[eager-backend: no error raised; upstream expects RuntimeError from extract_graph's"
            " AOTAutograd path, which the eager backend does not run] "
            "In-place mul_ of a grad-requiring input inside a stream; upstream expects "
            "RuntimeError 'Mutations on inputs with user-specified streams are not yet supported' "
            "from extract_graph (AOTAutograd). Upstream's fn is also wrapped in "
            "@torch.compile(backend='eager'); here it is the bare function."
        ),
    ),
    Program(
        name="control_deps_wrapping_record_event",
        upstream=DYN + "test_control_deps_wrapping_record_event",
        fn=control_deps_wrapping_record_event,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Producer stream with work before e.record(), consumer stream waits; upstream runs "
            "the private wrap_all_sync_nodes_with_control_deps on the fw graph and checks 2 "
            "control_deps nodes and the wait depending on the record. " + _EV_NOTE
        ),
    ),
    Program(
        name="control_deps_wrapping_wait_event",
        upstream=DYN + "test_control_deps_wrapping_wait_event",
        fn=control_deps_wrapping_wait_event,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Consumer stream has work (a = x * 3) before e.wait(); upstream checks both record and "
            "wait get control_deps wrappers (private pass). " + _EV_NOTE
        ),
    ),
    Program(
        name="control_deps_prevents_invalid_reordering",
        upstream=DYN + "test_control_deps_prevents_invalid_reordering",
        fn=control_deps_prevents_invalid_reordering,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Same program as control_deps_wrapping_record_event; upstream moves add_1 before the "
            "control_deps node and expects graph.lint() to raise. " + _EV_NOTE
        ),
    ),
    Program(
        name="cross_event_deps_multiple_events",
        upstream=DYN + "test_cross_event_deps_multiple_events",
        fn=cross_event_deps_multiple_events,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "s1 records e1 then e2, s2 waits e1, s3 waits e2; upstream (wrapping patched out, "
            "then applied manually) checks each wait's control_deps depends on its own record. " + _EV_NOTE
        ),
    ),
    Program(
        name="cross_event_deps_event_reuse",
        upstream=DYN + "test_cross_event_deps_event_reuse",
        fn=cross_event_deps_event_reuse,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "One event recorded twice on s1 with work between, waited on s2; upstream checks the "
            "wait depends on the second record (last write wins). " + _EV_NOTE
        ),
    ),
    Program(
        name="epilogue_copy_stream_tracking",
        upstream=DYN + "test_epilogue_copy_stream_tracking",
        fn=epilogue_copy_stream_tracking,
        inputs=lambda: (
            torch.ones(4, 4, requires_grad=True),
            torch.ones(4, 4, requires_grad=True),
        ),
        training=True,
        since=(
            2,
            13,
        ),  # torch 2.11's inductor fails on it ('a leaf Variable that requires grad is being used in an in-place operation')
        note=(
            "[eager-backend: ok] "
            "autograd.Function with ctx streams: forward on s2, backward mutates the saved x on s1 "
            "and computes grads on s2; upstream checks the bw epilogue copy_ is on s1's index. "
            "Upstream passes x.clone()/y.clone() (non-leaves); here leaves, so grads are visible."
        ),
    ),
    Program(
        name="inductor_lowering",
        upstream=DYN + "test_inductor_lowering",
        fn=inductor_lowering,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "In-place x += x + 1 then e.record(); upstream compiles with inductor "
            "(implicit_fallbacks=False) and only checks it runs. " + _EV_NOTE
        ),
    ),
    Program(
        name="backward_sync_control_deps_e2e",
        upstream=DYN + "test_backward_sync_control_deps_e2e",
        fn=backward_sync_control_deps_e2e,
        inputs=lambda: _two(requires_grad=True),
        training=True,
        note=(
            "[eager-backend: ok] "
            "Two side streams in forward; upstream backprops actual[0] and checks the bw graph has "
            ">= 1 control_deps node wrapping its syncs."
        ),
    ),
    Program(
        name="record_stream",
        upstream=DYN + "test_record_stream",
        fn=record_stream_fn,
        inputs=lambda: (_randn(16),),
        training=False,
        since=(2, 13),  # torch 2.11's dynamo runs Tensor.record_stream on fake tensors, which have no kernel for it
        note=(
            "[eager-backend: traces, fails at run: NotImplementedError: Could not run "
            "'aten::record_stream' with arguments from the 'CPU' backend.] "
            "x.record_stream(s) on a local stream; upstream (EagerAndRecordGraphs, fullgraph) "
            "checks a streams.record_stream node is in the graph. CPU: record_stream(x, s) is "
            "x.record_stream(s) when compiling, a no-op eagerly (aten::record_stream has no CPU kernel)."
        ),
    ),
    Program(
        name="event_record_after_input_mutation_errors",
        upstream=DYN + "test_event_record_after_input_mutation_errors",
        fn=event_record_after_input_mutation_errors,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        raises=RuntimeError,
        match="An event was recorded on a stream",
        since=(2, 12),  # torch 2.11 has no check for an event recorded after an input mutation
        note=(
            "[eager-backend: raises as upstream expects: RuntimeError "
            "(InternalTorchDynamoError): An event was recorded on a stream where a graph input "
            "was previously mutated.] "
            "Input mutated then e.record() on the same stream, event returned; upstream expects "
            "RuntimeError 'An event was recorded on a stream' (backend='eager', fullgraph). " + _EV_NOTE
        ),
    ),
    Program(
        name="event_record_after_input_mutation_stack_traces",
        upstream=DYN + "test_event_record_after_input_mutation_stack_traces",
        fn=event_record_after_input_mutation_stack_traces,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        raises=RuntimeError,
        match="An event was recorded on a stream",
        since=(2, 12),  # torch 2.11 has no check for an event recorded after an input mutation
        note=(
            "[eager-backend: raises as upstream expects: RuntimeError "
            "(InternalTorchDynamoError): An event was recorded on a stream where a graph input "
            "was previously mutated.] "
            "Same program; upstream checks the RuntimeError text names 'Input mutation occurred "
            "here:' x.add_(1) and 'Event record occurred here:' e.record(). " + _EV_NOTE
        ),
    ),
    Program(
        name="event_record_after_input_mutation_record_event",
        upstream=DYN + "test_event_record_after_input_mutation_record_event",
        fn=event_record_after_input_mutation_record_event,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        raises=RuntimeError,
        match="An event was recorded on a stream",
        since=(2, 12),  # torch 2.11 has no check for an event recorded after an input mutation
        note=(
            "[eager-backend: raises as upstream expects: RuntimeError "
            "(InternalTorchDynamoError): An event was recorded on a stream where a graph input "
            "was previously mutated.] "
            "Input mutated then e = s.record_event() on the same stream; upstream expects "
            "RuntimeError 'An event was recorded on a stream'. make_stream() is torch.Stream('cpu') "
            "when compiling, CpuStream eagerly (CPU Stream.record_event raises)."
        ),
    ),
    Program(
        name="event_record_after_input_mutation_through_view",
        upstream=DYN + "test_event_record_after_input_mutation_through_view",
        fn=event_record_after_input_mutation_through_view,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        raises=RuntimeError,
        match="An event was recorded on a stream",
        since=(2, 12),  # torch 2.11 has no check for an event recorded after an input mutation
        note=(
            "[eager-backend: raises as upstream expects: RuntimeError "
            "(InternalTorchDynamoError): An event was recorded on a stream where a graph input "
            "was previously mutated.] "
            "Input mutated through a view (v = x.view(-1); v.add_(1)) then e.record(); upstream "
            "expects RuntimeError 'An event was recorded on a stream'. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_record_after_input_mutation_input_event",
        upstream=DYN + "test_event_record_after_input_mutation_input_event",
        fn=event_record_after_input_mutation_input_event,
        inputs=lambda: (torch.ones(4, 4), CpuEvent(DEVICE)),
        training=False,
        raises=RuntimeError,
        match="An event was recorded on a stream",
        since=(2, 12),  # torch 2.11 has no check for an event recorded after an input mutation
        note=(
            "[eager-backend: raises as upstream expects: RuntimeError "
            "(InternalTorchDynamoError): An event was recorded on a stream where a graph input "
            "was previously mutated.] "
            "The event is an input (upstream torch.Event('cpu'); here CpuEvent('cpu')); input mutated "
            "then e.record(); upstream expects RuntimeError 'An event was recorded on a stream'."
        ),
    ),
    Program(
        name="event_record_before_input_mutation_no_error",
        upstream=DYN + "test_event_record_before_input_mutation_no_error",
        fn=event_record_before_input_mutation_no_error,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "e.record() before the input mutation on the same stream, event returned (no tensor "
            "output; the mutation of x is the observable); upstream expects no error. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_record_on_different_stream_no_error",
        upstream=DYN + "test_event_record_on_different_stream_no_error",
        fn=event_record_on_different_stream_no_error,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Mutation on s0, record on s1, event returned; upstream expects no error. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_not_returned_no_error",
        upstream=DYN + "test_event_not_returned_no_error",
        fn=event_not_returned_no_error,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        raises=RuntimeError,
        match="An event was recorded on a stream",
        since=(2, 12),  # torch 2.11 has no check for an event recorded after an input mutation
        note=(
            "[eager-backend: raises as upstream expects: RuntimeError "
            "(InternalTorchDynamoError): An event was recorded on a stream where a graph input "
            "was previously mutated.] "
            "Despite the name, upstream expects RuntimeError 'An event was recorded on a stream' "
            "(mutation then record on the same stream, x returned). " + _EV_NOTE
        ),
    ),
    Program(
        name="event_synchronize_tracing",
        upstream=DYN + "test_event_synchronize_tracing",
        fn=event_synchronize_tracing,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "record, compute, e.synchronize(); upstream checks record_event then a control_deps-"
            "wrapped streams.synchronize_event threading the add. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_synchronize_inductor_lowering",
        upstream=DYN + "test_event_synchronize_inductor_lowering",
        fn=event_synchronize_inductor_lowering,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "compute, record, synchronize; upstream compiles with inductor (implicit_fallbacks="
            "False) and only checks it runs. " + _EV_NOTE
        ),
    ),
    Program(
        name="control_deps_wrapping_synchronize_event",
        upstream=DYN + "test_control_deps_wrapping_synchronize_event",
        fn=control_deps_wrapping_synchronize_event,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "y before record, synchronize, z = y * 2 after; upstream (wrapping patched out, stream "
            "meta set by hand, then the private pass) checks y is threaded through both control_deps. " + _EV_NOTE
        ),
    ),
    Program(
        name="external_event_synchronize_threads_inputs",
        upstream=DYN + "test_external_event_synchronize_threads_inputs",
        fn=external_event_synchronize_threads_inputs,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Same program; upstream erases the record_event node (simulating an externally recorded "
            "event) and checks synchronize threads the graph input through. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_synchronize_control_deps_e2e",
        upstream=DYN + "test_event_synchronize_control_deps_e2e",
        fn=event_synchronize_control_deps_e2e,
        inputs=lambda: (torch.ones(4, 4),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Same program, default torch.compile; upstream checks compiled == eager. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_synchronize_e2e",
        upstream=DYN + "test_event_synchronize_e2e",
        fn=event_synchronize_e2e,
        inputs=lambda: ([torch.rand(4, generator=_gen(i)).to(torch.float16) for i in range(10)],),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Loop over a list: non_blocking .to('cpu') + one event per tensor, then synchronize "
            "each, torch.cat; upstream (10 x fp16[100] cuda tensors, default torch.compile) checks "
            "compiled == eager. CPU: inputs already on cpu, so .to() is a no-op. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_record_wait_on_default_stream",
        upstream=DYN + "test_event_record_wait_on_default_stream",
        fn=event_record_wait_on_default_stream,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "A module-level event (upstream torch.cuda.Event() outside f; here CpuEvent('cpu')) "
            "recorded and waited on the default stream; upstream checks compiled == eager."
        ),
    ),
    Program(
        name="record_stream_inductor_output_code",
        upstream=DYN + "test_record_stream_inductor_output_code",
        fn=record_stream_inductor_output_code,
        inputs=lambda: (_randn(16),),
        training=False,
        since=(2, 13),  # torch 2.11's dynamo runs Tensor.record_stream on fake tensors, which have no kernel for it
        note=(
            "[eager-backend: traces, fails at run: NotImplementedError: Could not run "
            "'aten::record_stream' with arguments from the 'CPU' backend.] "
            "y.record_stream(s) between producer and consumer; upstream (inductor, fullgraph) "
            "FileChecks record_stream after the producing kernel. CPU: record_stream(y, s) (no-op eagerly)."
        ),
    ),
    Program(
        name="del_multi_stream_sync_dealloc",
        upstream=DYN + "test_del_multi_stream_sync_dealloc",
        fn=del_multi_stream_sync_dealloc,
        inputs=lambda: (torch.ones(4, 4), torch.ones(4, 4)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "`del x` after x was used on a side stream; upstream checks the graph has "
            "sync_dealloc and record_event. " + _EV_NOTE
        ),
    ),
    Program(
        name="del_same_stream_no_sync_dealloc",
        upstream=DYN + "test_del_same_stream_no_sync_dealloc",
        fn=del_same_stream_no_sync_dealloc,
        inputs=lambda: (torch.ones(4, 4), torch.ones(4, 4)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "`del x` on the same stream that used it; upstream checks no sync_dealloc. " + _EV_NOTE
        ),
    ),
    Program(
        name="del_single_stream_no_sync_dealloc",
        upstream=DYN + "test_del_single_stream_no_sync_dealloc",
        fn=del_single_stream_no_sync_dealloc,
        inputs=lambda: (torch.ones(4, 4), torch.ones(4, 4)),
        training=False,
        note=("[eager-backend: ok] No streams at all (negative control): `del x`; upstream checks no sync_dealloc."),
    ),
    Program(
        name="del_attr_multi_stream_sync_dealloc",
        upstream=DYN + "test_del_attr_multi_stream_sync_dealloc",
        fn=del_attr_multi_stream_sync_dealloc,
        inputs=lambda: (torch.ones(4, 4), torch.ones(4, 4)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "`del h.tensor` (attribute of a local object) after use on a side stream; upstream "
            "checks sync_dealloc and record_event. " + _EV_NOTE
        ),
    ),
    Program(
        name="del_subscr_multi_stream_sync_dealloc",
        upstream=DYN + "test_del_subscr_multi_stream_sync_dealloc",
        fn=del_subscr_multi_stream_sync_dealloc,
        inputs=lambda: (torch.ones(4, 4), torch.ones(4, 4)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "`del d['t']` (dict item) after use on a side stream; upstream checks sync_dealloc and "
            "record_event. " + _EV_NOTE
        ),
    ),
    Program(
        name="stream_pointer_extraction_edge_cases",
        upstream=DYN + "test_stream_pointer_extraction_edge_cases",
        fn=stream_pointer_extraction_edge_cases,
        inputs=lambda: (torch.Stream(DEVICE), torch.Stream(DEVICE), torch.Stream(DEVICE)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Returns the native handles of two streams and the default stream (no tensors); "
            "upstream (inductor) calls it inside `with torch.cuda.stream(s3)` and checks each "
            ".cuda_stream. CPU: .stream_id (all 0); default stream -> torch.Stream('cpu'); the "
            "outer `with s3` is not part of fn."
        ),
    ),
    # ---------------------------------------------------------- test/inductor/test_user_streams.py
    Program(
        name="compile_with_user_stream_context",
        upstream=IND + "TestUserStreamCompile::test_compile_with_user_stream_context",
        fn=compile_with_user_stream_context,
        inputs=lambda: (_randn(16, seed=0), _randn(16, seed=1)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Default-stream add, side-stream mul, s.synchronize(); upstream (inductor) checks "
            "compiled == eager and 'torch.cuda.stream' + 'synchronize_stream' in the wrapper."
        ),
    ),
    Program(
        name="compile_preserves_stream_semantics",
        upstream=IND + "TestUserStreamCompile::test_compile_preserves_stream_semantics",
        fn=compile_preserves_stream_semantics,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Independent work on default and side stream, synchronize, join; inductor codegen checks."
        ),
    ),
    Program(
        name="multiple_stream_contexts",
        upstream=IND + "TestUserStreamCompile::test_multiple_stream_contexts",
        fn=multiple_stream_contexts,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Default stream + two sequential side-stream contexts, both synchronized; codegen checks."
        ),
    ),
    Program(
        name="nested_stream_contexts",
        upstream=IND + "TestUserStreamCompile::test_nested_stream_contexts",
        fn=nested_stream_contexts,
        inputs=lambda: (_randn(16),),
        training=False,
        note=("[eager-backend: ok] s2 nested in s1, work resumes on s1 after the inner exit; codegen checks."),
    ),
    Program(
        name="stream_context_with_data_dependency",
        upstream=IND + "TestUserStreamCompile::test_stream_context_with_data_dependency",
        fn=stream_context_with_data_dependency,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Side stream consumes a default-stream result with no user sync before it (the pass "
            "must add one); upstream checks compiled == eager and the stream context survives."
        ),
    ),
    Program(
        name="event_record_and_wait",
        upstream=IND + "TestUserStreamCompile::test_event_record_and_wait",
        fn=event_record_and_wait,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Record on the default stream, wait inside the side stream; upstream checks "
            "record_event/wait_event survive as custom ops. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_record_on_stream",
        upstream=IND + "TestUserStreamCompile::test_event_record_on_stream",
        fn=event_record_on_stream,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "event.record(s1) / event.wait(s2) with explicit stream args; codegen checks. " + _EV_NOTE
        ),
    ),
    Program(
        name="multiple_events_multiple_streams",
        upstream=IND + "TestUserStreamCompile::test_multiple_events_multiple_streams",
        fn=multiple_events_multiple_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "s1 -> s2 via event1, s2 -> default via event2; >= 2 record/wait in code. " + _EV_NOTE
        ),
    ),
    Program(
        name="event_wait_without_record",
        upstream=IND + "TestUserStreamCompile::test_event_wait_without_record",
        fn=event_wait_without_record,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Record on the default stream first, wait on the side stream (despite the name). " + _EV_NOTE
        ),
    ),
    Program(
        name="stream_wait_event",
        upstream=IND + "TestUserStreamCompile::test_stream_wait_event",
        fn=stream_wait_event,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "s.wait_event(event) outside the context instead of event.wait(); checks wait_event. " + _EV_NOTE
        ),
    ),
    Program(
        name="bidirectional_stream_sync",
        upstream=IND + "TestUserStreamCompile::test_bidirectional_stream_sync",
        fn=bidirectional_stream_sync,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "s1 -> s2 -> back to s1 via two events (s1 re-entered); >= 2 records/waits. " + _EV_NOTE
        ),
    ),
    Program(
        name="three_streams_pipeline",
        upstream=IND + "TestUserStreamCompile::test_three_streams_pipeline",
        fn=three_streams_pipeline,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Three-stage pipeline s1 -> s2 -> s3 with explicit-stream events. " + _EV_NOTE
        ),
    ),
    Program(
        name="parallel_streams_join",
        upstream=IND + "TestUserStreamCompile::test_parallel_streams_join",
        fn=parallel_streams_join,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Three parallel side streams joined on the default stream by three waits. " + _EV_NOTE
        ),
    ),
    Program(
        name="fan_out_fan_in",
        upstream=IND + "TestUserStreamCompile::test_fan_out_fan_in",
        fn=fan_out_fan_in,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Default -> {s1, s2} via e_start, back to default; >= 3 records, >= 4 waits. " + _EV_NOTE
        ),
    ),
    Program(
        name="four_streams_diamond",
        upstream=IND + "TestUserStreamCompile::test_four_streams_diamond",
        fn=four_streams_diamond,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Diamond: default -> {s1, s2} -> s3. " + _EV_NOTE
        ),
    ),
    Program(
        name="stream_reuse_across_iterations",
        upstream=IND + "TestUserStreamCompile::test_stream_reuse_across_iterations",
        fn=stream_reuse_across_iterations,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "A Python loop (unrolled by dynamo) re-entering one stream and re-recording one event. " + _EV_NOTE
        ),
    ),
    Program(
        name="no_fusion_across_streams",
        upstream=IND + "TestUserStreamCompile::test_no_fusion_across_streams",
        fn=no_fusion_across_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Two fusible pointwise chains on two streams; upstream checks inductor generates "
            "exactly 3 kernels (no cross-stream fusion). " + _EV_NOTE
        ),
    ),
    Program(
        name="no_fusion_across_streams_with_dependency",
        upstream=IND + "TestUserStreamCompile::test_no_fusion_across_streams_with_dependency",
        fn=no_fusion_across_streams_with_dependency,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Pointwise chain on default then side stream across an event; expects 2 kernels. " + _EV_NOTE
        ),
    ),
    Program(
        name="fusion_within_same_stream",
        upstream=IND + "TestUserStreamCompile::test_fusion_within_same_stream",
        fn=fusion_within_same_stream,
        inputs=lambda: (_randn(16),),
        training=False,
        note=("[eager-backend: ok] Four pointwise ops on one side stream; upstream expects them fused into 1 kernel."),
    ),
    Program(
        name="no_fusion_simple_dependency_across_streams",
        upstream=IND + "TestUserStreamCompile::test_no_fusion_simple_dependency_across_streams",
        fn=no_fusion_simple_dependency_across_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: RuntimeError (InternalTorchDynamoError): cpu backend doesn't"
            " support events.] "
            "e = s1.record_event(); s2.wait_event(e) between contexts; expects 2 kernels. "
            "make_stream() is torch.Stream('cpu') when compiling, CpuStream eagerly (CPU "
            "Stream.record_event raises)."
        ),
    ),
    Program(
        name="no_combo_kernel_fusion_across_streams",
        upstream=IND + "TestUserStreamCompile::test_no_combo_kernel_fusion_across_streams",
        fn=no_combo_kernel_fusion_across_streams,
        inputs=lambda: tuple(_randn(16, seed=i) for i in range(4)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Independent adds on default and side stream at the same topological level; upstream "
            "(inductor combo_kernels=True) expects 2 kernels. " + _EV_NOTE
        ),
    ),
    Program(
        name="combo_kernel_fusion_within_same_stream",
        upstream=IND + "TestUserStreamCompile::test_combo_kernel_fusion_within_same_stream",
        fn=combo_kernel_fusion_within_same_stream,
        inputs=lambda: (_randn(16, seed=0), _randn(16, seed=1)),
        training=False,
        note=(
            "[eager-backend: ok] Two independent ops on one side stream (combo_kernels=True upstream); <= 2 kernels."
        ),
    ),
    Program(
        name="cross_stream_stride_copy",
        upstream=IND + "TestUserStreamCompile::test_cross_stream_stride_copy",
        fn=cross_stream_stride_copy,
        inputs=lambda: (_randn(4, 8),),
        training=False,
        note=(
            "[eager-backend: fails: RuntimeError (InternalTorchDynamoError): cpu backend doesn't"
            " support events.] "
            "Non-contiguous slice made on s1, .contiguous() on s2 after record_event/wait_event; "
            "upstream (64x64) checks 1 kernel per stream (the copy runs on the consumer's stream). "
            "make_stream(): CpuStream eagerly."
        ),
    ),
    Program(
        name="no_buffer_reuse_across_streams",
        upstream=IND + "TestUserStreamCompile::test_no_buffer_reuse_across_streams",
        fn=no_buffer_reuse_across_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: RuntimeError (InternalTorchDynamoError): cpu backend doesn't"
            " support events.] "
            "s1's buffer read on s2 after s1.record_event()/s2.wait_event(); upstream checks no "
            "in-place reuse of buf0 across streams. make_stream(): CpuStream eagerly."
        ),
    ),
    Program(
        name="stream_record_wait_event_not_dropped",
        upstream=IND + "TestUserStreamCompile::test_stream_record_wait_event_not_dropped",
        fn=stream_record_wait_event_not_dropped,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: RuntimeError (InternalTorchDynamoError): cpu backend doesn't"
            " support events.] "
            "stream.record_event()/stream.wait_event() must survive; checks record_event, "
            "wait_event, synchronize_stream in code. make_stream(): CpuStream eagerly."
        ),
    ),
    Program(
        name="stream_synchronize_not_dropped",
        upstream=IND + "TestUserStreamCompile::test_stream_synchronize_not_dropped",
        fn=stream_synchronize_not_dropped,
        inputs=lambda: (_randn(16),),
        training=False,
        note=("[eager-backend: ok] s.synchronize() then a default-stream consumer; checks synchronize_stream in code."),
    ),
    Program(
        name="stream_wait_stream_not_dropped",
        upstream=IND + "TestUserStreamCompile::test_stream_wait_stream_not_dropped",
        fn=stream_wait_stream_not_dropped,
        inputs=lambda: (_randn(16),),
        training=False,
        since=(2, 13),  # torch 2.11's AOT autograd runs Stream.wait_stream while tracing, which a CPU stream cannot do
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "s2.wait_stream(s1) between contexts; checks wait_stream and synchronize_stream in "
            "code. make_stream(): CpuStream eagerly (CPU Stream.wait_stream raises)."
        ),
    ),
    Program(
        name="codegen_structure_single_stream",
        upstream=IND + "TestUserStreamCompile::test_codegen_structure_single_stream",
        fn=codegen_structure_single_stream,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Upstream checks the exact dynamo graph (get_external_object_by_index, "
            "streams.synchronize_stream) and the exact wrapper body."
        ),
    ),
    Program(
        name="codegen_structure_pipeline",
        upstream=IND + "TestUserStreamCompile::test_codegen_structure_pipeline",
        fn=codegen_structure_pipeline,
        inputs=lambda: tuple(_randn(4, 4, seed=i) for i in range(3)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Two-stage matmul pipeline (32x32 upstream): default-stream mm, record, side-stream "
            "wait + mm; exact dynamo graph and FileCheck of the wrapper. " + _EV_NOTE
        ),
    ),
    Program(
        name="codegen_structure_three_stream_pipeline",
        upstream=IND + "TestUserStreamCompile::test_codegen_structure_three_stream_pipeline",
        fn=codegen_structure_three_stream_pipeline,
        inputs=lambda: tuple(_randn(4, 4, seed=i) for i in range(4)),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Three-stage matmul pipeline s1 -> s2 -> s3; exact graph + wrapper FileCheck. " + _EV_NOTE
        ),
    ),
    Program(
        name="codegen_structure_parallel_matmuls",
        upstream=IND + "TestUserStreamCompile::test_codegen_structure_parallel_matmuls",
        fn=codegen_structure_parallel_matmuls,
        inputs=lambda: tuple(_randn(4, 4, seed=i) for i in range(3)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Two parallel matmuls on s1/s2 joined on the default stream; exact graph + FileCheck. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_producer_consumer",
        upstream=IND + "TestStreamOrderingStress::test_race_producer_consumer",
        fn=race_producer_consumer,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Stress (4096x4096, 20 iterations upstream): 8-deep matmul chain on default, consumer "
            "on a side stream after record/wait; compiled == eager each iteration. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_ping_pong",
        upstream=IND + "TestStreamOrderingStress::test_race_ping_pong",
        fn=race_ping_pong,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Heavy work s1 -> s2 -> s1 (re-entered) via two events; stress compare. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_fan_out",
        upstream=IND + "TestStreamOrderingStress::test_race_fan_out",
        fn=race_fan_out,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Slow default-stream producer fanned out to three streams and joined; stress compare. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_diamond",
        upstream=IND + "TestStreamOrderingStress::test_race_diamond",
        fn=race_diamond,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.5),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Diamond with heavy relu/sigmoid branches on s1/s2, joined on default. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_pipeline",
        upstream=IND + "TestStreamOrderingStress::test_race_pipeline",
        fn=race_pipeline,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "4-stage pipeline over lists of 4 streams / 3 events (list comprehensions inside fn), "
            "synchronize in a loop; stress compare. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_back_to_back",
        upstream=IND + "TestStreamOrderingStress::test_race_back_to_back",
        fn=race_back_to_back,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "default -> s -> default with heavy work both ways; stress compare. " + _EV_NOTE
        ),
    ),
    Program(
        name="race_triton_on_user_stream",
        upstream=IND + "TestStreamOrderingStress::test_race_triton_on_user_stream",
        fn=race_triton_on_user_stream,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Matmul chain + pointwise relu both on the user stream, record, default waits; "
            "upstream checks the triton kernel launches on the user stream. " + _EV_NOTE
        ),
    ),
    Program(
        name="generic_stream_basic",
        upstream=IND + "TestGenericStreamCompile::test_generic_stream_basic",
        fn=generic_stream_basic,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Module-level torch.Stream re-wrapped by (stream_id, device_index, device_type) "
            "(upstream wraps into torch.cuda.Stream; here torch.Stream) used as context + synchronize."
        ),
    ),
    Program(
        name="generic_stream_with_event",
        upstream=IND + "TestGenericStreamCompile::test_generic_stream_with_event",
        fn=generic_stream_with_event,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Module-level stream and event (upstream torch.Event('cuda'); here CpuEvent('cpu')): "
            "record on default, wait inside the stream."
        ),
    ),
    Program(
        name="generic_stream_multiple",
        upstream=IND + "TestGenericStreamCompile::test_generic_stream_multiple",
        fn=generic_stream_multiple,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Two module-level re-wrapped streams and a module-level CpuEvent: record on 1, wait on 2."
        ),
    ),
    Program(
        name="generic_event_record_on_stream",
        upstream=IND + "TestGenericStreamCompile::test_generic_event_record_on_stream",
        fn=generic_event_record_on_stream,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Module-level event recorded with an explicit stream arg inside it, waited on default."
        ),
    ),
    Program(
        name="single_stream_identity",
        upstream=IND + "TestStreamIdentity::test_single_stream_identity",
        fn=single_stream_identity,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Return from inside a module-level stream's context; upstream checks the wrapper gets "
            "the user's stream via get_external_object_by_index (not a new Stream)."
        ),
    ),
    Program(
        name="multiple_stream_identity",
        upstream=IND + "TestStreamIdentity::test_multiple_stream_identity",
        fn=multiple_stream_identity,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: traces, fails at run: RuntimeError: cpu backend doesn't support "
            "events.] "
            "Two module-level streams, a local event recorded in A and waited in B; upstream "
            "checks two distinct get_external_object_by_index calls. " + _EV_NOTE
        ),
    ),
    Program(
        name="pdl_single_side_stream",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_single_side_stream",
        fn=pdl_single_side_stream,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: ok] "
            "Pointwise on one side stream + synchronize; upstream (sm90, triton.enable_pdl) checks PDL metadata."
        ),
    ),
    Program(
        name="pdl_correctness_with_multiple_streams",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_correctness_with_multiple_streams",
        fn=pdl_correctness_with_multiple_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Two independent side streams joined on default by waits (no synchronize); PDL on. " + _EV_NOTE
        ),
    ),
    Program(
        name="pdl_cross_stream_events_preserved",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_cross_stream_events_preserved",
        fn=pdl_cross_stream_events_preserved,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Record on default, wait on side stream; checks events survive with PDL on. " + _EV_NOTE
        ),
    ),
    Program(
        name="pdl_same_stream_consecutive_kernels",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_same_stream_consecutive_kernels",
        fn=pdl_same_stream_consecutive_kernels,
        inputs=lambda: (_randn(16), torch.zeros(16)),
        training=False,
        note=(
            "[eager-backend: ok] "
            "In-place y.copy_(x**2 + x) on a side stream (input mutation), y returned; upstream's "
            "y is torch.empty, here zeros for determinism."
        ),
    ),
    Program(
        name="pdl_no_fusion_across_streams",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_no_fusion_across_streams",
        fn=pdl_no_fusion_across_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Two pointwise chains on s1/s2 joined on default; expects 3 kernels with PDL on. " + _EV_NOTE
        ),
    ),
    Program(
        name="pdl_stress_multistream_correctness",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_stress_multistream_correctness",
        fn=pdl_stress_multistream_correctness,
        inputs=lambda: (_randn(4, 4), torch.eye(4) * 0.9),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "4 matmuls on default, record, relu + 1 on side stream; stress compare (4096x4096 upstream). " + _EV_NOTE
        ),
    ),
    Program(
        name="pdl_mutation_across_streams",
        upstream=IND + "TestPDLWithMultiStream::test_pdl_mutation_across_streams",
        fn=pdl_mutation_across_streams,
        inputs=lambda: (_randn(16),),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "A local buffer produced on default, mutated in place (a.add_(1)) on the side stream "
            "after record/wait, returned. " + _EV_NOTE
        ),
    ),
    Program(
        name="implicit_current_stream_with_cudagraphs",
        upstream=IND + "TestStreamCudagraphInteraction::test_implicit_current_stream_with_cudagraphs",
        fn=implicit_current_stream_with_cudagraphs,
        inputs=lambda: (_randn(4, 4, seed=0), _randn(4, 4, seed=1)),
        training=False,
        note=(
            "[eager-backend: fails: IndexError: deque index out of range] "
            "Module-level stream and two events (here CpuEvent('cpu')): ev.record() on the "
            "implicit current stream, wait/work/record in s1, ev2.wait(); upstream runs it 3x "
            "under triton.cudagraphs (100x100)."
        ),
    ),
    Program(
        name="explicit_current_stream_with_cudagraphs",
        upstream=IND + "TestStreamCudagraphInteraction::test_explicit_current_stream_with_cudagraphs",
        fn=explicit_current_stream_with_cudagraphs,
        inputs=lambda: (_randn(4, 4, seed=0), _randn(4, 4, seed=1)),
        training=False,
        note=(
            "[eager-backend: fails: Unsupported: bad device argument to "
            "torch.accelerator.current_stream] "
            "Same with cur = torch.cuda.current_stream() passed explicitly to record/wait; CPU: "
            "current_stream() (torch.accelerator.current_stream() when compiling)."
        ),
    ),
    # ------------------------------------------------------- test/dynamo/test_ctx_manager.py
    Program(
        name="ctx_stream_context_manager1",
        upstream=CTX + "test_cuda_stream_context_manager1",
        fn=ctx_stream_context_manager1,
        inputs=lambda: (_randn(4, 4),),
        training=False,
        since=(2, 12),  # torch 2.11 runs Stream.wait_stream while compiling, which a CPU stream cannot do
        note=(
            "A stream made inside: s.wait_stream(current), relu in s, current.wait_stream(s). "
            "Upstream checks one frame, 12 ops, equality with eager."
        ),
    ),
    Program(
        name="ctx_stream_across_graph_break",
        upstream=CTX + "test_cuda_stream_across_graph_break",
        fn=ctx_stream_across_graph_break,
        inputs=lambda: (_randn(4, 4), current_stream()),
        training=False,
        fullgraph=False,
        note=(
            "The same with a graph break (upstream: print) before the stream is entered; the "
            "stream is made in the first graph and used in the second. Upstream marks it "
            "expectedFailure (pytorch#118204: frame and op counts), and checks equality too. "
            "CPU: the stream is a CpuStream made outside, since dynamo runs the second graph's "
            "s.wait_stream(current) on the real stream the first graph made, which a CPU stream "
            "cannot do; and dynamo runs the part after the break eagerly (one graph compiles). " + _AFTER_BREAK
        ),
    ),
    Program(
        name="ctx_stream_context_manager2",
        upstream=CTX + "test_cuda_stream_context_manager2",
        fn=ctx_stream_context_manager2,
        inputs=lambda: (_randn(4, 4), CpuStream(DEVICE)),
        training=False,
        since=(2, 12),  # torch 2.11 runs Stream.wait_stream while compiling, which a CPU stream cannot do
        note=(
            "A stream passed in and one made inside, each fenced by wait_stream both ways, and "
            "`with current:` re-entering the current stream between them. Upstream marks it "
            "expectedFailure (pytorch#118204). CPU: the `with current:` is left out (it changes "
            "nothing): re-entering the stream the harness entered stops dynamo ('multiple exits?', "
            "with any backend and no streampass)."
        ),
    ),
    Program(
        name="ctx_stream_method",
        upstream=CTX + "test_cuda_stream_method",
        fn=ctx_stream_method,
        inputs=lambda: (_randn(4, 4),),
        training=False,
        since=(2, 12),  # torch 2.11 runs Stream.wait_stream while compiling, which a CPU stream cannot do
        note=(
            "wait_stream both ways, two blocks on one side stream, cur.query(), "
            "cur.synchronize(), new.synchronize(). Upstream checks 21 ops and equality."
        ),
    ),
    Program(
        name="ctx_stream_compared_with_none",
        upstream=CTX + "test_cuda_stream_compared_with_constant",
        fn=ctx_stream_compared_with_none,
        inputs=lambda: (_randn(4, 4),),
        training=False,
        note="`current_stream() is not None` as a branch condition (upstream's fn).",
    ),
    Program(
        name="ctx_stream_compared_with_str",
        upstream=CTX + "test_cuda_stream_compared_with_constant",
        fn=ctx_stream_compared_with_str,
        inputs=lambda: (_randn(4, 4),),
        training=False,
        note='`current_stream() != "const_str"` as a branch condition (upstream\'s fn2).',
    ),
    Program(
        name="ctx_stream_compared_with_stream",
        upstream=CTX + "test_cuda_stream_compared_with_stream",
        fn=ctx_stream_compared_with_stream,
        inputs=lambda: (_randn(4, 4), torch.Stream(DEVICE), torch.Stream(DEVICE)),
        training=False,
        note=(
            "`s0 == s1` on two streams passed in as a branch condition. CPU: every CPU stream "
            "has stream_id 0, so the two compare equal and the other branch is taken."
        ),
    ),
    Program(
        name="ctx_event_reconstruct",
        upstream=CTX + "test_cuda_event_reconstruct",
        fn=ctx_event_reconstruct,
        inputs=lambda: (_randn(4, 4),),
        training=False,
        note="An event made inside and returned (dynamo reconstructs it). " + _EV_NOTE,
    ),
    Program(
        name="ctx_event_across_graph_break",
        upstream=CTX + "test_cuda_event_across_graph_break",
        fn=ctx_event_across_graph_break,
        inputs=lambda: (_randn(4, 4), current_stream()),
        training=False,
        fullgraph=False,
        note=(
            "e.record() in the first graph, a graph break (upstream: print), "
            "current.wait_event(e) in the second: the event crosses the break and "
            "is returned. " + _EV_NOTE + " " + _AFTER_BREAK
        ),
    ),
    Program(
        name="ctx_event_created_outside_of_graph",
        upstream=CTX + "test_cuda_event_created_outside_of_graph",
        fn=ctx_event_created_outside_of_graph,
        inputs=_mm_on_user_stream,
        training=False,
        note=(
            "Module-level stream and event: the inputs run upstream's eager half (mm into foo "
            "and event.record() on the user stream); the compiled function waits on the "
            "event, reads foo and returns the event. Upstream loops 10 times at 1024x1024."
        ),
    ),
    Program(
        name="ctx_event_method_create_stream_outside_of_compile",
        upstream=CTX + "test_cuda_event_method_create_stream_outside_of_compile",
        fn=ctx_event_method_create_stream_outside_of_compile,
        inputs=lambda: (_randn(4, 4), current_stream(), CpuStream(DEVICE)),
        training=False,
        note=(
            "The current stream and a new stream passed in: cur.record_event(), query, "
            "new.wait_event, a block on new, new_event.record(new), new_event.wait(cur), "
            "new_event.synchronize(). CPU: the stream passed as current is a stand-in, not the "
            "one the harness enters; cur.record_event() as in record_event(). " + _EV_NOTE
        ),
    ),
    Program(
        name="ctx_event_method",
        upstream=CTX + "test_cuda_event_method",
        fn=ctx_event_method,
        inputs=lambda: (_randn(4, 4),),
        training=False,
        note="The same with both streams obtained inside the function. " + _EV_NOTE,
    ),
    # -------------------------------------------------------- test/inductor/test_control_deps.py
    Program(
        name="cd_orders_void_op_across_nested_calls",
        upstream=CD + "test_control_deps_orders_void_op_across_nested_calls",
        fn=cd_orders_void_op_across_nested_calls,
        inputs=lambda: (torch.ones(2, 2),),
        training=False,
        note=(
            "e.record() in s1 after y = x + 1; in s2, a = x * 3, e.wait(), z = y * a. Upstream "
            "checks that the record's void op is an additional buffer dep of the wait's "
            "operations after lowering; here, equality with eager. " + _EV_NOTE
        ),
    ),
    Program(
        name="cd_passthrough_creates_ordering_barrier",
        upstream=CD + "test_control_deps_passthrough_creates_ordering_barrier",
        fn=cd_passthrough_creates_ordering_barrier,
        inputs=lambda: (torch.ones(4),),
        training=False,
        note=(
            "y made on a side stream and recorded; e.wait() on the current stream; y * 2. "
            "Upstream checks inductor's OrderingBarrier nodes and equality with eager "
            "(test_ordering_barrier_is_nop compiles the same program). " + _EV_NOTE
        ),
    ),
    Program(
        name="cd_bidirectional_stream_sync_correctness",
        upstream=CD + "test_bidirectional_stream_sync_correctness",
        fn=bidirectional_stream_sync,  # upstream writes the same program with torch.Stream/Event
        inputs=lambda: (_randn(64),),
        training=False,
        note=(
            "s1 -> s2 -> s1 through two events, then both streams synchronized (upstream's "
            "regression for a barrier scheduled before the record it follows); equality with "
            "eager. " + _EV_NOTE
        ),
    ),
    Program(
        name="cd_host_to_device_transfer_between_sync_passthroughs",
        upstream=CD + "test_host_to_device_transfer_between_sync_passthroughs",
        fn=cd_host_to_device_transfer_between_sync_passthroughs,
        inputs=lambda: (_randn(8, 32).bfloat16(), _randn(32, 32, seed=1).bfloat16()),
        training=False,
        note=(
            "A host tensor and a device tensor both live across s.synchronize(), the host one "
            "moved to the device after it (bf16). Upstream compiles with "
            "mode='reduce-overhead' (CUDA graphs) at 8x128; here the default mode at 8x32."
        ),
    ),
]

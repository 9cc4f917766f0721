"""The GPU ("native") lowering, compiled on CPU: where inductor's schedule puts kernels and syncs.

On a GPU, StreamPass hands inductor its syncs in ``control_deps`` and inductor issues each kernel on
its node's stream. Which kernel comes before which wait is decided by inductor's scheduler, the same
on any device, so a CPU can check it: these tests compile with the GPU lowering and read the
generated code (which cannot run here: CPU codegen does not define its stream variables). The
check (:func:`unwaited_reads`) is a small race detector for that code: a kernel that reads a buffer
a kernel of another stream wrote must come after a wait on an event recorded after that write.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import re
import warnings

import pytest
import torch
from torch._inductor import config as inductor_config

import streampass as sp
import streampass.inductor as spi
from streampass import compat

from test_bodies import invoke_quant_on_sp_stream
from test_compile_use import s_branches  # issue 11's two side-stream branches

_CONTEXT = re.compile(r"^\s*with (?:torch\.cuda\.stream\()?(\w+)\)?:$")
_SYNC = re.compile(r"torch\.ops\.streams\.(record_event|wait_event)\.default\((\d+), (\d+)\)")
#: syncs that cover every write issued before them (a ``wait_stream`` records as it is issued)
_BARRIER = re.compile(r"torch\.ops\.streams\.(wait_stream|synchronize_\w+)\.default\(")
#: a kernel, an extern kernel or an op call (not a sync), maybe assigning its result to a buffer
_KERNEL = re.compile(
    r"^\s*(?:(buf\d+) = )?(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.(?!streams\.|streampass\.)[\w.]+)\((.*)\)$"
)
_IN_PLACE = re.compile(r"^torch\.ops\.\w+\.\w+_\.\w+$")  # torch.ops.ns.op_.overload writes its first argument
_NAME = re.compile(r"\b(buf\d+|arg\d+_\d+)\b")


def unwaited_reads(code: str) -> list[str]:
    """Each read, in generated code, of a buffer another stream's kernel wrote with no wait
    between them on an event recorded after the write, nor a ``wait_stream`` or host barrier:
    ``"kernel reads buf (written by kernel)"``. Streams are told apart by their ``with`` blocks;
    which stream a sync names is not checked (the scheduler's order is what this is for).

    >>> code = '''def call(self, args):
    ...     with stream1:
    ...         k0(arg0_1, buf0)
    ...     with stream2:
    ...         k1(buf0, buf1)
    ... '''.replace("k0", "cpp_fused_k0").replace("k1", "cpp_fused_k1")
    >>> unwaited_reads(code)
    ['cpp_fused_k1 reads buf0 (written by cpp_fused_k0)']

    Op calls count as kernels: a result assigned to a buffer is written by the call, and an
    in-place op (``torch.ops.ns.op_.overload``) writes its first argument again.

    >>> code = '''def call(self, args):
    ...     with default_stream:
    ...         buf0 = torch.ops.aten.sin.default(arg0_1)
    ...     with stream1:
    ...         torch.ops.c10d.all_reduce_.default(buf0, 'sum', '0')
    ...     with default_stream:
    ...         cpp_fused_k1(buf0, buf1)
    ... '''
    >>> unwaited_reads(code)  # doctest: +NORMALIZE_WHITESPACE
    ['torch.ops.c10d.all_reduce_.default reads buf0 (written by torch.ops.aten.sin.default)',
     'cpp_fused_k1 reads buf0 (written by torch.ops.c10d.all_reduce_.default)']
    """
    body = code[code.index("def call(") :]
    context, writer, found = "", {}, []
    records: dict[int, list[int]] = {}
    waits: list[tuple[int, int]] = []
    barriers: list[int] = []
    for i, line in enumerate(body.splitlines()):
        if m := _CONTEXT.match(line):
            context = m.group(1)
        elif m := _SYNC.search(line):
            kind, event = m.group(1), int(m.group(2))
            if kind == "record_event":
                records.setdefault(event, []).append(i)
            else:
                waits.append((i, event))
        elif _BARRIER.search(line):
            barriers.append(i)
        elif m := _KERNEL.match(line):
            result, kernel, names = m.group(1), m.group(2), _NAME.findall(m.group(3))
            for name in names:
                if name not in writer:
                    continue
                at, ctx, by = writer[name]
                covered = any(at < w < i and any(at < r < w for r in records.get(e, ())) for w, e in waits)
                covered = covered or any(at < b < i for b in barriers)
                if ctx != context and not covered:
                    found.append(f"{kernel} reads {name} (written by {by})")
            for name in names:  # a kernel's buffers not written before are its outputs
                if name.startswith("buf") and name not in writer:
                    writer[name] = (i, context, kernel)
            if result is not None:
                writer[result] = (i, context, kernel)
            if _IN_PLACE.match(kernel) and names and names[0].startswith("buf"):
                writer[names[0]] = (i, context, kernel)
        elif m := re.match(r"^\s*(buf\d+) = (buf\d+); del \2", line):
            writer.pop(m.group(1), None)  # a reused buffer: written anew by its next kernel
    return found


def graph_functions(code: str) -> dict[str, str]:
    """Each graph function of a generated module, as :func:`unwaited_reads` reads one: ``call``
    and the functions inductor generates for the bodies of higher-order ops (``true_graph_0``),
    whose buffers it names with the function's prefix (``true_graph_0_buf2``).

    >>> code = '''def true_graph_0(args):
    ...     true_graph_0_arg0_1, = args
    ...     with stream1:
    ...         k0(true_graph_0_arg0_1, true_graph_0_buf0)
    ...     with default_stream:
    ...         k1(true_graph_0_buf0, true_graph_0_buf1)
    ...     return (true_graph_0_buf1, )
    ... class Runner:
    ...     def call(self, args):
    ...         return true_graph_0(args)
    ... '''.replace("k0", "cpp_fused_k0").replace("k1", "cpp_fused_k1")
    >>> sorted(graph_functions(code))
    ['call', 'true_graph_0']
    >>> unwaited_reads(graph_functions(code)["true_graph_0"])
    ['cpp_fused_k1 reads buf0 (written by cpp_fused_k0)']
    """
    found = {"call": code[code.index("def call(") :]}
    for m in re.finditer(r"^def (\w+)\(args\):\n(?:(?:[ \t].*)?\n)*", code, re.MULTILINE):
        name = m.group(1)
        found[name] = "def call(args):\n" + m.group(0).split("\n", 1)[1].replace(f"{name}_", "")
    return found


def kernel_streams(code: str) -> set[str]:
    """The stream variables (``with stream1:``) the generated code issues kernels in."""
    context, found = "", set()
    for line in code[code.index("def call(") :].splitlines():
        if m := _CONTEXT.match(line):
            context = m.group(1)
        elif _KERNEL.match(line):
            found.add(context)
    return found


def native_codes(monkeypatch, fn, *args, fullgraph: bool = False, passes=None) -> list[str]:
    """The modules inductor generates for ``fn`` under StreamPass (``passes``, as for
    ``enabled``) with the GPU lowering (in this test's cache directory)."""
    monkeypatch.setattr(spi, "_gpu", lambda device: True)
    # the code cannot run on CPU (undefined stream variables, CPU streams and events); a compile
    # that fails (BackendCompilerFailed, InductorError) is a failure
    with spi.enabled(passes):
        try:
            torch.compile(fn, fullgraph=fullgraph)(*args)
        except torch._dynamo.exc.BackendCompilerFailed:
            raise
        except (NameError, RuntimeError, AssertionError):
            pass
    files = glob.glob(os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/**/*.py", recursive=True)
    return [c for c in (pathlib.Path(f).read_text() for f in files) if "def call(" in c]


def native_code(monkeypatch, fn, *args) -> str:
    """The one module inductor generates for ``fn`` (:func:`native_codes`)."""
    codes = native_codes(monkeypatch, fn, *args)
    assert len(codes) == 1, f"{len(codes)} generated modules"
    return codes[0]


AMB, SIDE = torch.Stream("cpu"), torch.Stream("cpu")


def users_wait(x, buf):
    """A user's ``e.wait()`` between two reads that inductor can fuse (``a`` before, ``b`` after)."""
    with AMB:
        e = torch.Event()
        with SIDE:
            y = x + 1
            e.record()
        a = x * 2
        e.wait()
        b = buf * 3 + y
        return a, b


def streampass_wait(x):
    """No user sync: streampass's own wait between ``a`` and ``x * y``, which share ``x``."""
    with sp.stream(1):
        y = x.sin()
    a = x * 2
    return a, x * y


PROGRAMS = {
    "users_wait": (users_wait, lambda: (torch.randn(64), torch.randn(64))),
    "streampass_wait": (streampass_wait, lambda: (torch.randn(64),)),
    "branches": (s_branches, lambda: tuple(torch.randn(16, 16) for _ in range(3))),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_no_kernel_reads_another_streams_buffer_before_its_wait(fresh_caches, monkeypatch, name):
    """Before the fix, on torch 2.12 and 2.13, ``users_wait`` and ``streampass_wait`` fused the read
    after the wait into the kernel before it (plain torch 2.13 does that with ``users_wait`` too)."""
    fn, make = PROGRAMS[name]
    code = native_code(monkeypatch, fn, *make())
    assert "wait_event" in code
    assert unwaited_reads(code) == []


#: inductor settings that change what its scheduler fuses and reorders after the post-grad passes
SCHEDULER_SETTINGS = {
    "no_reordering": {"reorder_for_locality": False, "reorder_for_peak_memory": False},
    "aggressive_fusion": {"aggressive_fusion": True},
    "combo_kernels": {"combo_kernels": True, "epilogue_fusion": False, "max_fusion_size": 2},
    "comm_overlap": {"reorder_for_compute_comm_overlap": True},
}


@pytest.mark.parametrize("setting", sorted(SCHEDULER_SETTINGS))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_inductors_fusion_and_reordering_settings_keep_every_wait_before_its_reads(
    fresh_caches, monkeypatch, name, setting
):
    """The ordering StreamPass encodes holds whatever the scheduler is told to fuse or reorder
    (the corpus under each setting found no unwaited read either: docs/inductor.md)."""
    fn, make = PROGRAMS[name]
    with inductor_config.patch(SCHEDULER_SETTINGS[setting]):
        code = native_code(monkeypatch, fn, *make())
    assert "wait_event" in code
    assert unwaited_reads(code) == []


def test_kernels_stay_on_their_streams_where_inductor_orders_them_after_syncs(fresh_caches, monkeypatch):
    """torch 2.12's ``control_deps`` lowering keeps no edge to a sync, so no graph edit orders a
    kernel after one: there StreamPass issues the kernels on one stream, and says so."""
    fn, make = PROGRAMS["branches"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = native_code(monkeypatch, fn, *make())
    one = compat.INDUCTOR_ISSUES_ON_STREAMS and not compat.LOWERING_ORDERS_AFTER_SYNCS
    assert any("issued on one stream" in str(w.message) for w in caught) == one
    if compat.INDUCTOR_ISSUES_ON_STREAMS:  # 2.11 issues every kernel on the current stream
        assert len(kernel_streams(code)) == (1 if one else 3)
    assert unwaited_reads(code) == []


def test_work_a_users_pass_wrapped_in_control_deps_keeps_its_order_and_its_waits(fresh_caches, monkeypatch):
    """A user's pass before StreamPass wraps the side stream's ``mul`` after the ambient ``add``
    (torch's ``preserve_node_ordering``). The GPU lowering also wraps that ``mul``, a first reader
    after a wait: the one wrapper takes both dependencies (before, the compile failed in
    inductor's sort: the user's dependency pointed at a node the lowering had replaced)."""
    from test_compile_use import _order_the_mul_after_the_first_add, cat_of_two_streams

    with inductor_config.patch(post_grad_custom_post_pass=_order_the_mul_after_the_first_add):
        codes = native_codes(monkeypatch, cat_of_two_streams, torch.rand(16, 8), torch.rand(16, 8), torch.rand(32, 8))
    assert len(codes) == 1 and "wait_event" in codes[0]
    assert unwaited_reads(codes[0]) == []


def _corpus():
    from test_corpus import HERE

    return [p for p in HERE if p.raises is None]


@pytest.mark.parametrize("p", _corpus(), ids=lambda p: p.name)
def test_pytorchs_user_stream_programs_read_no_buffer_before_its_wait(fresh_caches, monkeypatch, p):
    """PyTorch's user-stream programs (tests/user_stream_programs.py), forward graphs, through the
    GPU lowering: the generated code (where there is one: some programs compute nothing) has no
    unwaited cross-stream read."""
    from test_corpus import _inputs, _target

    _, fn = _target(p)
    codes = native_codes(monkeypatch, fn, *_inputs(p), fullgraph=p.fullgraph)
    assert [r for c in codes for r in unwaited_reads(c)] == []


@pytest.mark.parametrize("name", ["flex_on_sp_stream", "foreach_map_on_a_user_stream"])
def test_an_op_whose_subgraphs_inductor_inlines_is_one_kernel_on_its_stream(fresh_caches, monkeypatch, name):
    """Flex attention and foreach_map on a side stream, through the GPU lowering: the op's
    subgraphs (inlined into its kernel) are not planned, and no kernel reads its output before
    the wait (tests/test_bodies.py: before, the compile failed)."""
    from test_bodies import INLINING

    fn, make = INLINING[name]
    codes = native_codes(monkeypatch, fn, *make())
    assert len(codes) == 1 and "wait_event" in codes[0]
    assert unwaited_reads(codes[0]) == []


@torch.compiler.nested_compile_region
def _region(x):
    return x.sin() * 2


def region_on_a_side_stream(x):
    with sp.stream(1):
        a = _region(x)
    return a + _region(x.cos())


def cond_on_a_side_stream(x):
    with sp.stream(1):
        a = torch.cond(x.sum() > 0, torch.sin, torch.cos, (x,))
    return a + x.exp()


def _branch_with_a_side_stream(x):
    with sp.stream(1):
        y = x.sin()
    return y + 1


def side_stream_in_a_cond_branch(x):
    return torch.cond(x.sum() > 0, _branch_with_a_side_stream, torch.cos, (x,)) + x.exp()


def _step(i, x):
    with sp.stream(1):
        y = x.sin()
    return i + 1, y * 2


def side_stream_in_a_while_loop(x):
    with sp.stream(2):
        z = x.exp()
    return torch._higher_order_ops.while_loop(lambda i, x: i < 3, _step, (torch.tensor(0, device=x.device), x))[1] + z


def constant_read_on_a_side_stream(x):
    with sp.stream(1):
        y = x * torch.tensor(2.0)
    return y + x


#: programs whose graphs have bodies or tensor constants, and whether a body's function gets syncs
#: (a body of an op on a side stream has the op's annotation, so it is planned; invoke_quant's
#: function is lowered into the caller and never planned)
WITH_BODIES = {
    "region_on_a_side_stream": (region_on_a_side_stream, True),
    "cond_on_a_side_stream": (cond_on_a_side_stream, True),
    "side_stream_in_a_cond_branch": (side_stream_in_a_cond_branch, True),
    "side_stream_in_a_while_loop": (side_stream_in_a_while_loop, True),
    "constant_read_on_a_side_stream": (constant_read_on_a_side_stream, False),
    "invoke_quant_on_sp_stream": (invoke_quant_on_sp_stream, False),
}


@pytest.mark.parametrize("name", sorted(WITH_BODIES))
def test_graphs_with_bodies_or_constants_compile_with_every_wait_before_its_reads(fresh_caches, monkeypatch, name):
    """Before, none of these compiled through the GPU lowering (torch 2.13). A body the pass
    had planned held sync subgraphs whose placeholders had no value, and inductor's
    ``FakeTensorUpdater``, re-deriving the body once the caller's plan changed the op's inputs,
    asserted "A subgraph argument other than striding has been modified"; a sync that depended on a
    small tensor constant failed to lower ("NotImplementedError: Constant"); invoke_quant's
    function, lowered node by node into the caller, held syncs whose subgraphs the lowering
    looked up in the caller. Now each compiles, and no kernel, in ``call`` or in a body's
    function, reads another stream's buffer before its wait."""
    fn, body_syncs = WITH_BODIES[name]
    codes = native_codes(monkeypatch, fn, *[torch.randn(8) for _ in range(fn.__code__.co_argcount)])
    assert codes, "nothing compiled"
    functions = {f: text for code in codes for f, text in graph_functions(code).items()}
    assert {f: r for f, text in functions.items() if (r := unwaited_reads(text))} == {}
    synced = [f for f, text in functions.items() if "wait_event" in text]
    assert synced and any(f != "call" for f in synced) == body_syncs, synced


@pytest.mark.parametrize("name", sorted(WITH_BODIES))
def test_the_same_programs_equal_eager_through_the_cpu_lowering(fresh_caches, name):
    """:data:`WITH_BODIES` as CPU graphs: outputs equal eager, every graph the pass kept
    verifies, and syncs ran."""
    from reference import compile_and_compare

    fn = WITH_BODIES[name][0]
    # positive inputs: each cond takes its true branch, the one with a stream
    p, ran = compile_and_compare(fn, *[torch.rand(8) + 0.1 for _ in range(fn.__code__.co_argcount)])
    assert p.reports and ran > 0  # a cond runs one branch's syncs: no count to compare with


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)
def test_data_dependent_shapes_across_streams_compile(fresh_caches, monkeypatch, training):
    """``x[x > 0]`` on one stream, its ``.item()`` read on another: the getitem passing the masked
    tensor through a wait copied the tensor's ``unbacked_bindings``, and inductor's
    ``FakeTensorUpdater``, re-deriving it, renamed a symbol twice and asserted ("u4 -> u0");
    a getitem binds no symbol anew. The forward now compiles, with every wait before its reads."""
    from test_compile_use import masked_sum_on_two_streams

    args = [torch.randn(8, 16, requires_grad=training) for _ in range(2)]
    codes = native_codes(monkeypatch, masked_sum_on_two_streams, *args)
    assert codes and any("wait_event" in c for c in codes)
    assert [r for c in codes for r in unwaited_reads(c)] == []


def test_a_graph_of_syncs_alone_compiles(fresh_caches, monkeypatch):
    """torch.compile of a graph ``sp.run`` already rewrote: dynamo compiles each sync body on a
    frame of its own, a graph with one sync and no tensor, which inductor's ``control_deps``
    lowering refused (it wants a dependency); such syncs now stay plain ops."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(lambda x, w: s_branches(x, w, w))(x, w)
    assert sp.run(gm).ok
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.StreamPassWarning)  # later frames: "an index known only at run time"
        codes = native_codes(monkeypatch, gm, x, w)
    assert any("record_event" in c for c in codes)


class TwoBranches(torch.nn.Module):
    """Issue 11's two side-stream branches as a module, for ``torch.export``."""

    def forward(self, x, w1, w2):
        return s_branches(x, w1, w2)


def says_one_stream_in_cpp():
    """The warning an AOT Inductor compile with streams gives; none on torch 2.11, which issues
    every kernel on the current stream anyway: nothing to drop, nothing to say."""
    if not compat.INDUCTOR_ISSUES_ON_STREAMS:
        return contextlib.nullcontext()
    return pytest.warns(sp.StreamPassWarning, match="C\\+\\+ wrapper")


def scheduled(monkeypatch) -> list[list[tuple]]:
    """Per graph inductor generates code for from now on, what its scheduler issues, in order:
    ``("kernel",)`` or ``(stream op name, *its index arguments)`` (torch 2.14's ordering barriers,
    which issue nothing, left out)."""
    from torch._inductor.scheduler import Scheduler

    graphs: list[list[tuple]] = []
    codegen = Scheduler.codegen

    def recording(self):
        ir = [n.node for snode in self.nodes for n in snode.get_nodes() if type(n.node).__name__ != "OrderingBarrier"]
        op = [getattr(n, "op_overload", None) for n in ir]
        graphs.append([
            (str(o).split(".")[1], *n.constant_args) if str(o).startswith("streams.") else ("kernel",)
            for n, o in zip(ir, op, strict=True)
        ])  # fmt: skip
        return codegen(self)

    monkeypatch.setattr(Scheduler, "codegen", recording)
    return graphs


def around_kernels(issued: list[tuple]) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """What :func:`scheduled` says a graph issues before its first kernel, the syncs between its
    first and last kernel, and what it issues from its last kernel on."""
    kernels = [i for i, item in enumerate(issued) if item == ("kernel",)]
    first, last = kernels[0], kernels[-1]
    return issued[:first], [item for item in issued[first:last] if item != ("kernel",)], issued[last:]


def test_an_aot_inductor_package_issues_every_kernel_on_one_stream_with_its_syncs(fresh_caches, monkeypatch, tmp_path):
    """Inductor's C++ wrapper (AOT Inductor here; ``cpp_wrapper=True`` takes the same lowering)
    has no stream contexts: torch writes a Python ``with stream1:`` into the C++ of a graph whose
    kernels have streams, and the compile failed (CppCompileError). Every kernel now goes on the
    current stream, every planned sync is still called (through AOT Inductor's proxy executor),
    and where the lowering orders kernels after syncs (torch >= 2.13) the scheduler issues them
    after a join with each side stream and before a join of each side stream with them, and no
    sync naming a side stream in between (stop 51 left the syncs on their streams: a kernel meant
    for stream 1 did not wait for work left on stream 1, nor an event recorded there for it)."""
    import zipfile

    from streampass.transform.one_stream import ordered_after_syncs

    from reference import planned_syncs

    monkeypatch.setattr(spi, "_gpu", lambda device: True)
    ep = torch.export.export(TwoBranches(), tuple(torch.randn(8, 8) for _ in range(3)))
    p = spi.StreamPass(keep_graphs=True)
    order = scheduled(monkeypatch)
    with spi.enabled(p), says_one_stream_in_cpp():
        path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    (r,) = p.reports
    assert r.lowering == "native" and r.streams == [0, 1, 2] and sp.verify(r.verified_graph).ok
    package = zipfile.ZipFile(path)
    wrapper = "\n".join(package.read(n).decode() for n in package.namelist() if n.endswith("wrapper.cpp"))
    calls = "\n".join(package.read(n).decode() for n in package.namelist() if n.endswith("wrapper.json"))
    assert "with stream" not in wrapper and "proxy_executor_call_function" in wrapper
    assert calls.count('"streams::') == planned_syncs(r.verified_graph) > 0
    issued = order[-1]
    if ordered_after_syncs():
        before, between, after = around_kernels(issued)
        assert before == [("wait_stream", 0, 1), ("wait_stream", 0, 2)]
        assert {("wait_stream", 1, 0), ("wait_stream", 2, 0)} <= set(after)
        assert all(item[-1] == 0 for item in between), between
    else:  # torch 2.12 (its lowering keeps no kernel after a sync) and 2.11: the plan's own syncs
        assert ("wait_stream", 0, 1) not in issued


@pytest.mark.parametrize("cpp_wrapper", [False, True])
def test_a_body_inductor_inlines_keeps_its_streams_only_where_the_wrapper_can_switch(cpp_wrapper):
    """An ``invoke_quant`` function on a GPU (``lower_inlined``): its annotations are what puts
    its kernels on the caller's streams under the Python wrapper; the C++ wrapper cannot take
    them, so there they go, as in the calling graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from streampass.transform.lower import lower_inlined

    gm = make_fx(lambda x: s_branches(x, x, x))(torch.randn(4, 4))

    def streams():
        return {n.name: k for n, k in sp.read_streams(gm).stream.items() if n.op == "call_function"}

    before = streams()
    with inductor_config.patch(cpp_wrapper=cpp_wrapper), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower_inlined(gm, gpu=True)
    after = streams()
    assert set(before.values()) == {0, 1, 2}
    # torch 2.12 issues every kernel on one stream under either wrapper (its lowering orders no
    # kernel after a sync); 2.11 issues them on the current stream whatever the annotations say
    cpp = cpp_wrapper and compat.INDUCTOR_ISSUES_ON_STREAMS
    one = cpp or (compat.INDUCTOR_ISSUES_ON_STREAMS and not compat.LOWERING_ORDERS_AFTER_SYNCS)
    assert after == ({k: 0 for k in before} if one else before)
    assert any("C++ wrapper" in str(w.message) for w in caught) == cpp


class _Compiled(Exception):
    """Raised in place of running a graph compiled for a GPU on CPU."""


def _compile_only_with_cpp_wrapper(gm, example_inputs):
    """A dynamo backend: inductor with the C++ wrapper compiles the graph through StreamPass,
    which is what is tested; the code is for a GPU, so it is not run."""
    from torch._inductor.compile_fx import compile_fx

    with inductor_config.patch(cpp_wrapper=True):
        compile_fx(gm, example_inputs)

    def not_run(*args):
        raise _Compiled

    return not_run


CPP_WRAPPER_PROGRAMS = [
    "event_record_and_wait",
    "bidirectional_stream_sync",
    "del_multi_stream_sync_dealloc",
    "record_stream_problem_interleaved",
]


@pytest.mark.parametrize("name", CPP_WRAPPER_PROGRAMS)
def test_user_syncs_in_stream_blocks_compile_under_the_cpp_wrapper_between_the_joins(fresh_caches, monkeypatch, name):
    """Upstream's programs with a user's ``e.wait()`` / ``e.record()`` inside a ``with s:`` block:
    dynamo annotates the sync, and torch copies that annotation onto the op in its ``control_deps``
    body, which inductor then issued in ``with stream1:``, Python written into the C++ ("'with' was
    not declared in this scope"): every such program of the corpus failed so under the C++ wrapper
    once the joins were planned. Each now compiles, and its kernels are issued between the joins
    with no sync naming a side stream among them (``record_stream`` and ``sync_dealloc``, which keep
    their stream for the allocator, excepted: ``streampass/transform/one_stream.py``)."""
    from streampass.transform.one_stream import ordered_after_syncs

    from test_corpus import _target
    from user_stream_programs import PROGRAMS

    (p,) = [p for p in PROGRAMS if p.name == name]
    monkeypatch.setattr(spi, "_gpu", lambda device: True)
    order = scheduled(monkeypatch)
    _, fn = _target(p)
    with spi.enabled(), warnings.catch_warnings():
        warnings.simplefilter("ignore", sp.StreamPassWarning)
        with pytest.raises(_Compiled):
            torch.compile(fn, backend=_compile_only_with_cpp_wrapper, fullgraph=True)(*p.inputs())
    (issued,) = order
    if ordered_after_syncs():
        before, between, after = around_kernels(issued)
        entry = {item[2] for item in before if item[:2] == ("wait_stream", 0) and item[2] != 0}
        exits = {item[1] for item in after if item[0] == "wait_stream" and item[2] == 0 and item[1] != 0}
        assert entry and entry == exits, issued
        events = [item for item in between if item[0] in ("record_event", "wait_event")]
        streams = [item for item in between if item[0] in ("wait_stream", "synchronize_stream")]
        assert all(item[2] == 0 for item in events) and all(set(item[1:]) == {0} for item in streams), issued

"""``torch.compile`` integration: :class:`StreamPass` as inductor's post-grad custom pass.

Turn it on::

    import streampass.inductor
    with streampass.inductor.enabled():          # or streampass.inductor.enable() once
        y = torch.compile(fn)(x)

Every graph inductor compiles (the inference graph, or the forward and the backward graph of
a training step) goes through :func:`streampass.run` after AOT autograd and before lowering:
the syncs it inserts are verified hazard-free before inductor sees the graph.

What reaches inductor then depends on the graph's device (see docs/inductor.md, checked on
torch 2.13.0):

* **CUDA and other GPUs**: the graph keeps its ``custom.stream`` annotations, so inductor's
  native multi-stream codegen runs kernels on their streams; the syncs stay ``control_deps``
  wrapped ``torch.ops.streams`` ops (each gets its own copy of the sync subgraph and a
  non-empty dependency tuple, which inductor's ``control_deps`` lowering requires). Event
  indices streampass allocates (``>= EVENT_BASE``) are resolved at run time by a fallback on
  dynamo's object table (:func:`install_object_fallback`).
* **CPU**: inductor's CPU codegen cannot take ``custom.stream`` (``with stream1:`` without a
  definition) nor device-less extern ops (a fused kernel is emitted after ``del`` of its
  inputs). The stream of each node moves to ``node.meta["streampass_stream"]`` and each sync
  becomes ``torch.ops.streampass.sync(deps, op, int_args)``: a no-op custom op with tensor
  dependencies that counts its calls in :data:`RUNTIME_SYNCS`. CPU runs one stream in order,
  so no sync is needed for correctness; the op makes the plan observable at run time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import pathlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx

from streampass import collective_buckets, compat, compile_hook, ops, runtime
from streampass.analysis import bodies, wellformed
from streampass.analysis.reading import events_recorded_outside, read_streams
from streampass.aot_guard import aot_guard_off, aot_guard_on, cpu_safe_aot
from streampass.assign.candidates import check_max_streams, cost_model
from streampass.assign.in_compile import assign_in_place, cost_key, device_cost, serial_summary, summary
from streampass.compat import PassBase, PassChain, post_grad_config
from streampass.errors import StreamPassError, StreamPassWarning
from streampass.graph_report import GraphReport, nonzero
from streampass.kept_graphs import KeptGraphs
from streampass.ops import AMBIENT
from streampass.runtime import install_object_fallback
from streampass.transform import dynamo_indices, one_stream, snapshot, wrapped_work
from streampass.transform.lower import RUNTIME_SYNCS, lower_for_cpu, lower_for_gpu, lower_inlined
from streampass.transform.pipeline import run
from streampass.transform.plan import EVENT_BASE

log = logging.getLogger(__name__)


def _source_files() -> tuple[str, ...]:
    """Every module of the package, subpackages included: the pass may run any of them, and a
    hand-kept list goes stale silently when a module is added or renamed.

    >>> any(f.endswith("transform/plan.py") for f in _source_files())
    True
    """
    here = pathlib.Path(__file__).resolve().parent
    return tuple(str(p) for p in sorted(here.rglob("*.py")) if "__pycache__" not in p.parts)


def _hash_files(paths: tuple[str, ...], extra: str) -> bytes:
    """sha256 of ``extra`` and the files' contents (torch's ``get_hash_for_files`` is
    ``lru_cache``d by path, so it would not see a file change within one process)."""
    h = hashlib.sha256(extra.encode())
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.digest()


# ----- The pass ------------------------------------------------------------------------------
class StreamPass(PassBase):
    """:func:`streampass.run` as ``torch._inductor.config.post_grad_custom_post_pass``.

    ``uuid()`` hashes the source of every streampass module, streampass's
    version and the options, so inductor's FX graph cache reuses a compiled graph only if
    the pass that made it is the same.

    Args:
        keep_graphs: keep, in each :class:`GraphReport`, a copy of the graph as
            :func:`streampass.run` left it (before the device lowering); for tests.
        assign: ``"auto"``: choose the streams of the nodes the program left unplaced with
            :func:`streampass.assign_streams` before planning (the user's own streams and
            syncs stay as they are); None (default): only the program's streams.
        assign_cost: the cost model ``assign`` prices candidates with (a profile name, a
            ``DeviceProfile`` or a ``CostModel``); None (default): the device's own, and on a
            CPU none, so that its graphs stay on one stream (CPU streams run one after another:
            :func:`streampass.assign.in_compile.device_cost`). ``max_streams``: at most this
            many streams for the nodes it places, the ambient one included.

    Usage: ``with streampass.inductor.enabled(): torch.compile(fn)(x)`` (see docs/inductor.md).

    >>> import torch
    >>> mine = lambda graph: None  # a user's own post-grad pass
    >>> passes = with_streampass(mine)
    >>> passes[0] is mine, isinstance(passes[1], StreamPass), StreamPass().uuid() == StreamPass().uuid()
    (True, True, True)
    """

    def __init__(self, keep_graphs: bool = False, assign: str | None = None, assign_cost=None, max_streams: int = 4):
        if assign not in (None, "auto"):
            raise StreamPassError(f'StreamPass(assign=...) takes "auto" or None, not {assign!r}')
        if assign is not None:  # refused here, not at the first compile inside an InductorError
            check_max_streams(max_streams)
            if assign_cost is not None:
                cost_model(assign_cost)
        self.keep_graphs, self._kept = keep_graphs, KeptGraphs()
        self.assign, self.assign_cost, self.max_streams = assign, assign_cost, max_streams
        self.reports: list[GraphReport] = []
        # Wherever this pass is installed (enable(), enabled(), torch.compile(options=...)), the
        # graphs it compiles must carry their streams into torch's cache keys.
        compile_hook.install(_holds_streampass)

    def uuid(self) -> bytes:
        """sha256 of streampass's version, the options that change what it compiles, and the
        source of the modules the pass runs."""
        from streampass import __version__

        options = "" if self.assign is None else f"assign={self.assign},{cost_key(self.assign_cost)},{self.max_streams}"
        return _hash_files(_source_files(), f"streampass-{__version__};{options}")

    def __call__(self, graph: torch.fx.Graph, is_inference: bool | None = None) -> None:
        if ops.is_sync_subgraph(graph):
            # The body of a control_deps sync, handed over before the graph that calls it: it
            # is planned, verified and lowered as part of that graph.
            return
        if bodies.is_inlined(graph.owning_module):  # lowered into its op, which the caller's plan orders
            lower_inlined(graph.owning_module, _gpu(dynamo_indices.compiled_graph_device(graph.owning_module)))
            return
        if (late := wellformed.runtime_index(graph)) is not None:  # nothing here to read or plan
            warnings.warn(StreamPassWarning(f"node {late.name!r}: {wellformed.RUNTIME_INDEX}"), stacklevel=2)
            return
        gm, kind = graph.owning_module, compat.graph_kind(graph, is_inference)
        device = dynamo_indices.compiled_graph_device(gm)
        backward = kind == "backward"
        if not backward and compile_hook.compiling_frame():
            _check_shared_indices(gm)
        offset, indices = dynamo_indices.index_offset(backward)
        # A pass before this one may leave the graph unsorted, and work wrapped in control_deps.
        with snapshot.all_or_nothing(gm), wrapped_work.as_plain_ops(gm):
            report = self._rewrite(gm, kind, device, offset, indices)
        self.reports.append(report)
        _emit(report)

    def _rewrite(self, gm, kind: str, device: torch.device, offset: int, indices: str) -> GraphReport:
        dynamo_indices.shift_indices(gm, offset)
        # An event waited before the graph records it was recorded by an earlier graph or by
        # eager code: under torch.compile events are objects of dynamo's table.
        external = events_recorded_outside(gm)
        cost = device_cost(self.assign_cost, device) if self.assign is not None else None
        choice = assign_in_place(gm, cost, self.max_streams, external) if cost is not None else None
        # One reading, before the pass: run reuses it, and its region check hands the lowering
        # the edit's kept reading of the result (docs/benchmarks.md, "One reading per compile").
        a = read_streams(gm, external)
        a = one_stream.as_compiled(gm, a, external) if _gpu(device) else a  # C++ wrapper: kernels on one stream
        assigned = summary(choice) if cost is not None or self.assign is None else serial_summary(len(a.streams) - 1)
        cross = sum(1 for n in a.nodes for i in n.all_input_nodes if a.stream[i] != a.stream[n])
        if a.streams == [AMBIENT] and not a.syncs:
            # Nothing to plan. On CPU an explicit ``custom.stream = 0`` must still not reach
            # inductor's CPU codegen. Kept, unreported, for the graphs that call it (a body).
            if self.keep_graphs:
                self._kept.keep(gm)
            runtime.state(gm)["streams"] = sorted({AMBIENT, *bodies.streams_below(gm, a)})  # what its callers read
            lowered = not _gpu(device) and lower_for_cpu(gm, a)
            return GraphReport(
                kind, str(device), [AMBIENT], 0, 0, 0, {}, {}, lowered, "cpu" if lowered else "none",
                indices=indices, assigned=assigned,
            )  # fmt: skip
        if _gpu(device):  # on CPU streams are one thread: nothing a merge moves can race
            collective_buckets.refuse_across_streams(a)
        # inductor hands each body of a higher-order op to this pass on its own: not planned here
        result = run(gm, external, bind_runtime=False, recompile=False, assignment=a, with_bodies=False)
        kept = self._kept.keep(gm) if self.keep_graphs else None
        lowering = "native" if _gpu(device) else "cpu"
        (lower_for_gpu if lowering == "native" else lower_for_cpu)(gm, result.assignment)
        return GraphReport(
            kind, str(device), result.after.streams, cross, result.records_added, result.waits_added,
            nonzero(result.before.by_kind()), nonzero(result.after.by_kind()), result.changed or offset != 0,
            lowering, result, kept, indices, assigned, list(external),
        )  # fmt: skip

    def __deepcopy__(self, memo: dict) -> StreamPass:
        # torch deep-copies inductor's config (which holds the pass) on every torch.compile
        # call; a copy would drop the reports of the compile, and kept graphs hold fake
        # tensors that cannot be copied. The pass is shared, as a function would be.
        return self

    def __repr__(self) -> str:
        return "StreamPass()" if self.assign is None else f"StreamPass(assign={self.assign!r})"


def _check_shared_indices(gm: torch.fx.GraphModule) -> None:
    """``sp.stream(k)`` where dynamo's table holds one of the function's own objects at ``k``:
    with a stream, one stream for both (a warning: correct, less overlap); with an event, kernels
    launched on an event (refused before any edit, on every device)."""
    first: dict[int, tuple[torch.fx.Node, object]] = {}
    for node, k, obj in dynamo_indices.shared_indices(gm):
        first.setdefault(k, (node, obj))
    for k, (node, obj) in first.items():
        where = (
            f"sp.stream({k}) is index {k} of dynamo's object table, which holds this function's {type(obj).__name__}"
        )
        advice = "use one kind of stream in a function: torch.Stream objects or sp.stream(k) (docs/inductor.md, Known limits)"
        if not isinstance(obj, torch.Stream):
            raise StreamPassError(f"{where}: its kernels would be launched on an event; {advice}", node=node.name)
        warnings.warn(
            StreamPassWarning(
                f"node {node.name!r}: {where}: the two run as one stream (no race, less overlap); {advice}"
            ),
            stacklevel=2,
        )


def _gpu(device: torch.device) -> bool:
    return device.type not in ("cpu", "meta")


def _emit(report: GraphReport) -> None:
    log.info("%s", report.line())
    torch._logging.trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": "streampass_report", "encoding": "json"},
        payload_fn=lambda: json.dumps(report.to_json()),
    )


# ----- Installing it ------------------------------------------------------------------------
def _as_list(p: Any) -> list:
    if isinstance(p, PassChain):
        return list(p.passes)
    return [] if p is None else list(p) if isinstance(p, (list, tuple)) else [p]


def with_streampass(current: Any, pass_: StreamPass | None = None) -> list:
    """``current`` (the user's post-grad pass or passes) followed by a StreamPass.

    StreamPass goes last so that its syncs cover whatever the other passes did; an existing
    StreamPass is kept, not doubled.
    """
    passes = _as_list(current)
    if _holds_streampass(passes):
        return passes
    return [*passes, pass_ if pass_ is not None else StreamPass()]


def _the_pass(pass_: StreamPass | None, assign: str | None, active: Any) -> StreamPass | None:
    """The pass asked for; refused if another StreamPass is ``active`` (it would be dropped)."""
    if assign is not None:
        if pass_ is not None:
            raise StreamPassError("give either a StreamPass or assign=..., not both (StreamPass(assign=...) takes it)")
        pass_ = StreamPass(assign=assign)
    held = next((p for p in _as_list(active) if isinstance(p, StreamPass)), pass_)
    if held is not pass_ and pass_ is not None:
        raise StreamPassError("another StreamPass is enabled (enable(), or an enclosing enabled() block), and would "
                              "be used instead: use the one it returned, or disable it first")  # fmt: skip
    return pass_


#: what enable() did, for disable(): (the pass, the config value before, the value it set)
_enabled: tuple[StreamPass, Any, Any] | None = None


def enable(pass_: StreamPass | None = None, *, assign: str | None = None) -> StreamPass:
    """Install StreamPass for every compile of the rest of the process (next to any post-grad
    pass already set), until :func:`disable`. A compile whose ``torch.compile(options=...)``
    replaces the post-grad passes gets StreamPass after them too. ``assign="auto"``: streampass
    also chooses streams for the nodes the program left on the ambient stream
    (``StreamPass(assign="auto")``). Returns the installed pass; a second call returns the
    one already installed.

    Also installs the CPU guard for torch's AOT stream passes (:func:`cpu_safe_aot_stream_passes`)
    and the object-table fallback.

    >>> from torch._inductor import config
    >>> saved = config.post_grad_custom_post_pass
    >>> mine = lambda graph: None  # a user's own post-grad pass
    >>> config.post_grad_custom_post_pass = mine
    >>> p = enable()
    >>> config.post_grad_custom_post_pass == post_grad_config([mine, p]), isinstance(p, StreamPass)
    (True, True)
    >>> enable() is p
    True
    >>> disable(); config.post_grad_custom_post_pass is mine
    True
    >>> config.post_grad_custom_post_pass = saved
    """
    from torch._inductor import config

    global _enabled
    before = config.post_grad_custom_post_pass
    if _enabled is None:
        aot_guard_on()
    else:
        _the_pass(pass_, assign, _enabled[0])
    if _enabled is None or not _holds_streampass(before):  # else: nothing to change
        passes = with_streampass(before, _enabled[0] if _enabled else _the_pass(pass_, assign, before))
        config.post_grad_custom_post_pass = post_grad_config(passes)
        mine = next(p for p in passes if isinstance(p, StreamPass))
        _enabled = (mine, before, config.post_grad_custom_post_pass)
    compile_hook.everywhere(functools.partial(_adding, _enabled[0]))
    install_object_fallback()
    return _enabled[0]


def disable() -> None:
    """Undo :func:`enable`: functions first compiled after it get StreamPass only from an
    ``enabled()`` block or their own config; a function compiled while enabled keeps StreamPass
    for its backward and its recompiles (a smaller last batch), as one compiled in a block does.
    The post-grad config goes back to what it was before ``enable()`` if nothing changed it
    since; otherwise only the pass is taken out of it. Code already compiled keeps its syncs.
    Does nothing when StreamPass is not enabled."""
    from torch._inductor import config

    global _enabled
    if _enabled is None:
        return
    mine, before, set_to = _enabled
    if config.post_grad_custom_post_pass is set_to:
        config.post_grad_custom_post_pass = before
    else:
        rest = [p for p in _as_list(config.post_grad_custom_post_pass) if p is not mine]
        config.post_grad_custom_post_pass = post_grad_config(rest) if rest else None
    compile_hook.everywhere(None)
    aot_guard_off()
    _enabled = None


@contextlib.contextmanager
def enabled(pass_: StreamPass | None = None, *, assign: str | None = None) -> Iterator[StreamPass]:
    """StreamPass (and the AOT CPU guard) for every compile that starts in the block, and for
    every later compile of the functions compiled in it: their backward, and their recompiles
    when a guard fails (a new batch size, ``eval()``), after the block too. Functions first
    compiled after the block get nothing. Yields the pass; ``assign="auto"`` as for :func:`enable`.

    The compile happens at the first call of a compiled function, so call it (the first
    forward of a training step included) inside the block.

    >>> from torch._inductor import config
    >>> saved = config.post_grad_custom_post_pass
    >>> with enabled() as p:
    ...     p in _as_list(config.post_grad_custom_post_pass), p.reports
    (True, [])
    >>> config.post_grad_custom_post_pass is saved
    True
    """
    from torch._inductor import config

    passes = with_streampass(
        config.post_grad_custom_post_pass, _the_pass(pass_, assign, config.post_grad_custom_post_pass)
    )
    mine = next(p for p in passes if isinstance(p, StreamPass))
    install_object_fallback()
    with (
        config.patch(post_grad_custom_post_pass=post_grad_config(passes)),
        cpu_safe_aot_stream_passes(),
        compile_hook.scope(functools.partial(_adding, mine)),
    ):
        yield mine


def _holds_streampass(config_value: Any) -> bool:
    return any(isinstance(p, StreamPass) for p in _as_list(config_value))


def _adding(pass_: StreamPass, config_value: Any):
    return post_grad_config(with_streampass(config_value, pass_))


cpu_safe_aot_stream_passes = cpu_safe_aot  # the guards of streampass.aot_guard, by the name docs use


__all__ = [
    "EVENT_BASE",
    "RUNTIME_SYNCS",
    "GraphReport",
    "StreamPass",
    "cpu_safe_aot_stream_passes",
    "disable",
    "enable",
    "enabled",
    "install_object_fallback",
    "lower_for_cpu",
    "lower_for_gpu",
    "with_streampass",
]

"""What differs between the torch releases streampass runs on, in one place (docs/versions.md).

* :data:`PassBase`, :func:`post_grad_config`: inductor takes a list of post-grad custom passes,
  and calls ``CustomInferenceAwareGraphPass`` ones with ``is_inference``, from torch 2.13 on;
  torch 2.11 and 2.12 take one pass and call it with the graph alone.
* :func:`registered_object`: dynamo's object table is a dict up to 2.14 and a list from 2.15;
  ``_object_table_stays_one_list`` keeps 2.15's list one object (its AOT backward reads a stale one).
* ``streampass.ops``, :data:`STREAM_METHODS_ARE_OPS`: torch 2.11 has no ``synchronize_*`` stream
  ops, and its dynamo does not turn ``Stream.synchronize`` / ``wait_stream`` into stream ops.
* :func:`graph_kind`: torch 2.11 and 2.12 do not tell a post-grad pass whether a graph is inference.
* ``control_deps`` (inductor's ordering wrapper, which streampass puts syncs in): torch 2.11
  can neither call it eagerly nor keeps it through dead-code elimination; both are given here.
* :data:`INDUCTOR_ISSUES_ON_STREAMS`, :data:`LOWERING_ORDERS_AFTER_SYNCS`,
  :data:`LOWERING_ORDERS_PASSTHROUGH_READERS`: inductor issues kernels on their streams from torch
  2.12, orders work after a sync in ``control_deps`` from 2.13, and the readers of its passthrough
  outputs after it from 2.14 (2.13: ``wait_stream``'s only); :mod:`streampass.transform.inductor_order`.
* ``streampass.aot_guard``: torch's own AOT stream passes, guarded where they break training graphs
  (triton on CPU; a forward ``wait_stream`` on 2.13, a buffer updated after one on 2.13 and 2.14).

Checked on torch 2.11.0, 2.12.0, 2.13.0, 2.14.1 and 2.15.0 (tests/test_compat.py).
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch._dynamo.variables.streams
import torch._inductor.ir
import torch._inductor.lowering
import torch._inductor.scheduler
from torch._inductor import custom_graph_pass as _cgp

#: whether dynamo traces ``Stream.synchronize`` / ``Stream.wait_stream`` to stream ops (torch >=
#: 2.12). torch 2.11 records them as method calls that AOT autograd runs while tracing, so no
#: post-grad pass sees them (and on CPU, ``wait_stream`` fails in torch itself).
STREAM_METHODS_ARE_OPS = hasattr(torch.ops.streams, "synchronize_stream")
#: whether inductor issues each kernel on its node's ``custom.stream`` (torch >= 2.12; 2.11 issues
#: every kernel on the current stream)
INDUCTOR_ISSUES_ON_STREAMS = hasattr(torch._inductor.scheduler.Scheduler, "_populate_stream_assignments")
#: whether inductor's ``control_deps`` lowering orders what follows a sync after it (torch >= 2.13
#: tracks the sync, which has no output, by name; 2.12 drops it, and hoists the syncs past kernels)
LOWERING_ORDERS_AFTER_SYNCS = "_void_ctrl_dep_op_names" in inspect.getsource(
    torch._inductor.lowering.control_deps_op_lowering
)
#: whether inductor's ``control_deps`` lowering orders the readers of a sync's passthrough
#: outputs after the sync (its ``OrderingBarrier``, torch >= 2.14); before, a reader's kernel could
#: be fused into one issued before the wait (:mod:`streampass.transform.inductor_order`)
LOWERING_ORDERS_PASSTHROUGH_READERS = hasattr(torch._inductor.ir, "OrderingBarrier")
#: whether inductor takes a list of post-grad custom passes (torch >= 2.13)
POST_GRAD_TAKES_LISTS = hasattr(_cgp, "get_custom_graph_passes")
#: the base class of StreamPass: inductor passes ``is_inference`` to it where it can
PassBase = getattr(_cgp, "CustomInferenceAwareGraphPass", _cgp.CustomGraphPass)


class PassChain(_cgp.CustomGraphPass):
    """Several post-grad passes as the one pass an inductor without list support takes."""

    def __init__(self, passes: list):
        self.passes = list(passes)

    def __call__(self, graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self):
        import hashlib

        h = hashlib.sha256()
        for p in self.passes:
            u = p.uuid() if hasattr(p, "uuid") else None
            if u is None:
                return None  # one pass without a uuid: inductor bypasses its cache, as for a list
            h.update(u if isinstance(u, bytes) else str(u).encode())
        return h.digest()

    def __deepcopy__(self, memo):
        return self  # like the passes it holds (StreamPass shares itself too)

    def __eq__(self, other) -> bool:
        return isinstance(other, PassChain) and self.passes == other.passes

    __hash__ = None  # mutable, like the list it stands for


def _control_deps_runs_eagerly() -> None:
    """torch 2.11's ``control_deps`` has only a fake kernel, so a graph with it cannot be called
    eagerly; 2.13 runs the subgraph (``CompositeExplicitAutograd`` and ``Autograd``). Give 2.11
    the same kernels, where they are missing."""
    from torch._C import DispatchKey
    from torch._inductor.fx_passes.control_dependencies import control_deps

    def run_subgraph(additional_deps, subgraph, *args, **kwargs):
        return subgraph(*args, **kwargs)

    for key in (DispatchKey.CompositeExplicitAutograd, DispatchKey.Autograd):
        if key not in control_deps.py_kernels:
            control_deps.py_impl(key)(run_subgraph)


_control_deps_runs_eagerly()


def _control_deps_survives_dce() -> None:
    """torch 2.13 marks ``control_deps`` side-effectful and FX's purity check honours that for
    higher-order ops; 2.11 does neither, so ``eliminate_dead_code`` drops a wrapped wait whose
    result nothing reads (the free-point waits at a graph's end). Give 2.11 the same rule."""
    import torch._library.utils as library_utils
    from torch._inductor.fx_passes.control_dependencies import control_deps
    from torch.fx.node import _side_effectful_functions, has_side_effect

    if control_deps not in _side_effectful_functions:
        has_side_effect(control_deps)
    if library_utils.is_impure(control_deps):
        return
    original = library_utils.is_impure

    @functools.wraps(original)
    def is_impure(op, *args, **kwargs):
        # the 2.13 rule, for higher-order ops only (torch.fx.Node.is_impure imports this name
        # from the module at each call)
        if isinstance(op, torch._ops.HigherOrderOperator) and op in _side_effectful_functions:
            return True
        return original(op, *args, **kwargs)

    library_utils.is_impure = is_impure


_control_deps_survives_dce()


def _object_table_stays_one_list() -> None:
    """torch 2.15's ``store_user_object_weakrefs`` (dynamo's per-call prologue) rebinds the object
    table to a new list, but AOT autograd's runtime wrappers imported the list by name and
    snapshot *that* one for the backward (``_snapshot_external_objects``). After a few compiles
    in one process, a backward restores stale entries past the end of the live table
    ("AssertionError: Index past the end of index_to_user_object_weakref"). Refill the one list
    in place instead, so every name for it sees the same entries. Up to 2.14 the table is a
    dict, refilled in place: nothing to do."""
    import weakref

    from torch._dynamo import graph_bytecode_inputs as table

    try:
        from torch._functorch._aot_autograd import runtime_wrappers
    except ImportError:  # pragma: no cover  (a torch without the module has nothing to fix)
        return
    if not isinstance(table.index_to_external_object_weakref, list):
        return
    if not hasattr(runtime_wrappers, "index_to_external_object_weakref"):
        return
    if getattr(table.store_user_object_weakrefs, "__streampass__", False):
        return
    runtime_wrappers.index_to_external_object_weakref = table.index_to_external_object_weakref

    def store_user_object_weakrefs(*args: object) -> None:
        table.index_to_external_object_weakref[:] = [weakref.ref(a) for a in args]

    store_user_object_weakrefs.__streampass__ = True
    store_user_object_weakrefs.__wrapped__ = table.store_user_object_weakrefs
    table.store_user_object_weakrefs = store_user_object_weakrefs


_object_table_stays_one_list()


def graph_kind(graph: torch.fx.Graph, is_inference: bool | None) -> str:
    """ "inference", "forward" or "backward": which graph of a compile inductor hands a post-grad
    pass. torch >= 2.13 says whether it is an inference graph (``is_inference``); torch 2.11
    and 2.12 do not (None), and AOT autograd's placeholder names tell: ``primals_*`` for a training
    forward, ``tangents_*`` in a backward, ``arg*`` in an inference graph.

    >>> g = torch.fx.Graph(); _ = g.placeholder("primals_1")
    >>> graph_kind(g, None), graph_kind(g, True), graph_kind(g, False)
    ('forward', 'inference', 'forward')
    """
    names = [p.name for p in graph.find_nodes(op="placeholder")]
    if any(n.startswith("tangents") for n in names):
        return "inference" if is_inference else "backward"
    if is_inference is None:
        is_inference = not any(n.startswith("primals") for n in names)
    return "inference" if is_inference else "forward"


def post_grad_config(passes: list):
    """``passes`` as ``torch._inductor.config.post_grad_custom_post_pass`` takes them here.

    >>> post_grad_config([print]) == ([print] if POST_GRAD_TAKES_LISTS else print)
    True
    """
    if POST_GRAD_TAKES_LISTS:
        return passes
    return passes[0] if len(passes) == 1 else PassChain(passes)


def inlined_only(fn):
    """Let dynamo trace ``fn`` only inlined into the frame that calls it, never as a frame of its
    own (its callees are unaffected). Returns ``fn``.

    ``streampass.stream`` needs this: it returns ``torch.fx.traceback.annotate(...)`` while dynamo
    traces. dynamo cannot resume a frame inside ``annotate``, so a graph break in the block makes
    it run the whole frame eagerly, and then compiles the call ``stream(k)`` on its own, whose
    result it rebuilds as the function ``annotate`` instead of a context manager.
    """
    from torch._dynamo.eval_frame import skip_code

    skip_code(fn.__code__)
    return fn


def registered_object(index: int):
    """The live object dynamo's table holds at ``index``, or None.

    The table (``torch._dynamo.graph_bytecode_inputs.index_to_external_object_weakref``) is a
    dict of weakrefs up to torch 2.14 and a list of them from 2.15 on.

    >>> registered_object(10**9) is None
    True
    """
    from torch._dynamo import graph_bytecode_inputs as table

    entries = table.index_to_external_object_weakref
    if isinstance(entries, dict):
        ref = dict.get(entries, index)
    else:
        ref = entries[index] if 0 <= index < len(entries) else None
    return ref() if ref is not None else None

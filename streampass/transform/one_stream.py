"""One stream for a GPU graph whose kernels inductor cannot issue on their streams.

Two backends cannot: inductor's C++ wrapper (``cpp_wrapper``, and so every AOT Inductor
package) has no stream contexts, and torch 2.12's lowering orders no kernel after a sync.
:func:`why_one_stream` says which applies to the compile running now.

Dropping the annotations alone (:func:`one_stream`) puts the kernels on the current stream
but leaves each sync on the stream the program named, so what the program means towards work
outside the call is lost: a kernel meant for side stream ``s`` no longer follows the work the
caller left on ``s``, and an event the program records on ``s`` no longer covers it.
:func:`onto_current_stream` rewrites the graph, before StreamPass plans it, into the one-stream
program it will run:

* at entry the current stream waits for each side stream (``wait_stream(0, s)``): the caller's
  work there comes first, as it would before the kernels on ``s``;
* every sync that orders kernels names the current stream instead of ``s``: an event recorded
  there covers the kernels meant for ``s``, and a wait holds the kernels that now follow it;
* at exit each side stream waits for the current one (``wait_stream(s, 0)``): work the caller
  puts on ``s`` after the call comes after the kernels, as it would after them on ``s``.

StreamPass then plans, encodes and verifies the joins like any user's syncs. That needs a
lowering that orders kernels after syncs (torch >= 2.13); on 2.12 only :func:`one_stream` is
done, and docs/inductor.md lists what is left open there.
"""

from __future__ import annotations

import warnings

import torch
import torch._inductor.config as inductor_config
import torch.fx

from streampass import compat, ops
from streampass.analysis.reading import StreamAssignment, annotated_stream, read_streams
from streampass.errors import StreamPassWarning
from streampass.ops import AMBIENT
from streampass.transform.annotations import drop_stream
from streampass.transform.dynamo_indices import rewrite_index_args
from streampass.transform.subgraphs import own_sync_body

#: the stream arguments of the syncs that order kernels. ``record_stream`` names a stream for the
#: allocator, and ``sync_dealloc`` makes the stream that frees a tensor wait for an event: both
#: keep their stream, since the graph's tensors are now all allocated, used and freed on the
#: current stream (and the event a ``sync_dealloc`` waits for is recorded there)
_ORDERING_STREAM_ARGS = {
    ops.RECORD_EVENT: (1,),
    ops.WAIT_EVENT: (1,),
    ops.WAIT_STREAM: (0, 1),
    ops.SYNC_STREAM: (0,),
    ops.FORK: (0, 1),
    ops.JOIN: (0, 1),
}

_SYNCS_NOT_ORDERED = (
    f"torch {torch.__version__}: inductor orders no kernel after a stream sync (its control_deps lowering "
    "drops the dependency), so this graph's kernels are issued on one stream; torch >= 2.13 issues them "
    "on their streams"
)
_NO_STREAMS_IN_CPP = (
    "inductor's C++ wrapper (cpp_wrapper, AOT Inductor) has no stream contexts (torch writes a Python "
    "`with stream1:` into the C++ and its compile fails), so this graph's kernels are issued on the current "
    "stream{}. For kernels on their streams, compile with the Python wrapper"
)
_JOINED = ", after the work left on its side streams before the call and before any put there after it"
_NOT_JOINED = f"; its syncs stay (torch {torch.__version__} orders no kernel after a sync)"


def why_one_stream() -> str | None:
    """Why this compile's GPU graphs must issue every kernel on one stream, if they must: a C++
    wrapper, or torch 2.12's lowering.

    >>> with inductor_config.patch(cpp_wrapper=True):
    ...     why = why_one_stream()
    >>> why is None or "C++ wrapper" in why  # None on torch 2.11, which issues them on one anyway
    True
    """
    if not compat.INDUCTOR_ISSUES_ON_STREAMS:  # torch 2.11 issues them on one anyway
        return None
    if inductor_config.cpp_wrapper:
        return _NO_STREAMS_IN_CPP.format(_JOINED if compat.LOWERING_ORDERS_AFTER_SYNCS else _NOT_JOINED)
    return None if compat.LOWERING_ORDERS_AFTER_SYNCS else _SYNCS_NOT_ORDERED  # torch 2.12


def ordered_after_syncs() -> bool:
    """Whether inductor's GPU lowering keeps each kernel after the syncs it depends on (torch >=
    2.13; 2.12's drops the dependency, and 2.11 issues every kernel on the current stream)."""
    return compat.INDUCTOR_ISSUES_ON_STREAMS and compat.LOWERING_ORDERS_AFTER_SYNCS


def one_stream(gm: torch.fx.GraphModule, why: str) -> None:
    """Drop every node's ``custom.stream``, so that inductor issues all of ``gm``'s kernels on the
    current stream, in their data order (the syncs stay and do what they say), with a warning
    that says ``why`` if a kernel had one (after :func:`onto_current_stream`, only the syncs the
    plan added do, and that warned already)."""
    if _drop_streams(gm):
        warnings.warn(StreamPassWarning(why), stacklevel=2)


def _drop_streams(gm: torch.fx.GraphModule) -> bool:
    """Drop the ``custom.stream`` of every node of ``gm`` and of its ``control_deps`` bodies;
    returns whether a node other than a sync had one. dynamo annotates a sync in a stream block
    and torch copies that onto the op in its body, which inductor then issues in ``with
    stream1:``. A body so annotated gets a copy of its own (bodies may be shared, and a failed
    pass puts back the graph's own nodes, not a body's)."""
    kernels = False
    for node in gm.graph.nodes:
        kernels |= drop_stream(node) is not None and ops.as_sync_call(node) is None
    for node in list(gm.graph.find_nodes(op="call_function", target=ops.CONTROL_DEPS)):
        if any(annotated_stream(n) is not None for n in ops.subgraph_module(node).graph.nodes):
            getter = own_sync_body(gm, node, "streampass_one_stream", _drop_body_streams)
            node.args = (node.args[0], getter, *node.args[2:])
    return kernels


def _drop_body_streams(body: torch.fx.Graph) -> None:
    for node in body.nodes:
        drop_stream(node)


def onto_current_stream(gm: torch.fx.GraphModule, a: StreamAssignment, why: str) -> bool:
    """Rewrite ``gm`` (read as ``a``) into the program that runs every kernel on the current
    stream, joined with each side stream at entry and exit (module docstring), with a warning
    that says ``why``; returns whether it had side streams to rewrite.

    >>> import streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x
    >>> gm = make_fx(f)(torch.ones(4))
    >>> with warnings.catch_warnings(record=True):
    ...     onto_current_stream(gm, sp.read_streams(gm), "one stream")
    True
    >>> [(n.target.__name__, n.args) for n in gm.graph.nodes if n.op == "call_function"]
    [('wait_stream.default', (0, 1)), ('sin.default', (x_1,)), ('add.Tensor', (sin, x_1)), ('wait_stream.default', (1, 0))]
    >>> sorted(sp.read_streams(gm).stream[n] for n in gm.graph.nodes if n.op == "call_function")
    [0, 0, 0, 1]
    """
    sides = [s for s in a.streams if s != AMBIENT]
    if not sides:
        return False
    graph = gm.graph
    _drop_streams(gm)
    rewrite_index_args(
        gm,
        lambda target, position, k: AMBIENT if position in _ORDERING_STREAM_ARGS.get(target, ()) else k,
        "streampass_one_stream",
    )
    first = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))
    with graph.inserting_before(first):
        for s in sides:
            graph.call_function(ops.WAIT_STREAM, (AMBIENT, s))
    with graph.inserting_before(graph.output_node()):
        for s in sides:
            graph.call_function(ops.WAIT_STREAM, (s, AMBIENT))
    warnings.warn(StreamPassWarning(why), stacklevel=2)
    return True


def as_compiled(gm: torch.fx.GraphModule, a: StreamAssignment, external) -> StreamAssignment:
    """The reading of the GPU graph ``gm`` (read as ``a``, with the ``external`` events) that
    StreamPass plans: ``a``, or where this compile plans on one stream, the reading of the
    one-stream program :func:`onto_current_stream` makes of it: where the lowering keeps the joins
    before and after the kernels."""
    why = why_one_stream() if ordered_after_syncs() else None
    if why is None or not onto_current_stream(gm, a, why):
        return a
    return read_streams(gm, external)

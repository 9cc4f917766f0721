"""``streampass.stream(k)``: say, in traced code, which stream a block runs on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.fx import traceback as fx_traceback

from streampass.compat import inlined_only
from streampass.errors import StreamIndexError
from streampass.ops import SP_STREAM_KEY as MARK
from streampass.ops import stream_index_problem
from streampass.transform.plan import EVENT_BASE

#: ``sp.stream(k)`` takes ``k`` below this: the indices above are streampass's own (the streams
#: ``assign="auto"`` adds from ``EVENT_BASE // 2``, the events it allocates from ``EVENT_BASE``),
#: and on an accelerator the run-time fallback answers an index from ``EVENT_BASE`` with an event.
MAX_USER_STREAM = EVENT_BASE // 2 - 1


@inlined_only
def stream(k: int):
    """Annotate the nodes traced inside the block with ``meta["custom"]["stream"] = k``.

    Works under ``make_fx``, ``aot_function`` and ``torch.compile`` (dynamo traces
    ``torch.fx.traceback.annotate``); blocks nest, the innermost wins; ``k = 0`` is the
    ambient stream. Outside tracing it does nothing but set the annotation (around a
    call of a compiled function dynamo copies that onto the graph it compiles, with no guard;
    StreamPass warns: put the block inside the function). A graph break inside
    the block makes dynamo run the whole function eagerly (it cannot resume inside
    ``annotate``), as it does for a ``with torch.Stream(...)`` block. Under ``torch.compile`` ``k``
    is an index of dynamo's object table: in a function that also uses ``torch.Stream``/``Event``
    objects, an index one of them holds is that object's stream (StreamPass warns).

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with stream(1):
    ...         y = x.cos()
    ...     return y + 1
    >>> gm = make_fx(f)(torch.ones(2))
    >>> [n.meta.get("custom", {}).get("stream") for n in gm.graph.nodes if n.op == "call_function"]
    [1, None]
    >>> stream(2**20)
    Traceback (most recent call last):
      ...
    streampass.errors.StreamIndexError: sp.stream(1048576): indices above 524287 are streampass's own streams and events
    """
    if torch.compiler.is_dynamo_compiling():
        k = _specialized(k)
    problem = stream_index_problem(k)
    if problem is None and k > MAX_USER_STREAM:
        problem = f"sp.stream({k}): indices above {MAX_USER_STREAM} are streampass's own streams and events"
    if problem is not None:
        raise StreamIndexError(problem)
    k = int(k)  # a plain int, as the graph keeps it
    if torch.compiler.is_dynamo_compiling():
        # dynamo understands annotate() itself; a generator context manager would be inlined.
        # MARK tells this block's nodes from those of a torch.Stream block, whose index dynamo
        # writes under the same key (dynamo_indices.shared_indices).
        return fx_traceback.annotate({"stream": k, MARK: k})
    # make_fx, AOT autograd and torch.export's non-strict tracer run this code as Python
    return _stream_eager(k)


def _specialized(k):
    """``k``'s value as a plain int while dynamo traces. dynamo turns an int argument that
    changed between calls (or every int, with ``dynamic=True``) into a symbolic int, which the
    annotation cannot hold. Each comparison below makes dynamo guard on ``k``, so the value
    found holds for this compile and another ``k`` recompiles; a constant ``k`` costs nothing.
    Bit by bit: 19 comparisons pin any index ``sp.stream`` accepts."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k > MAX_USER_STREAM:
        return k  # refused below, with its value
    value = 0
    for bit in reversed(range(MAX_USER_STREAM.bit_length())):
        if k >= value + (1 << bit):
            value += 1 << bit
    return value


@contextlib.contextmanager
def _stream_eager(k: int) -> Iterator[None]:
    # make_fx copies current_meta into nodes only while node meta is preserved. Enter that mode
    # only if nobody did: preserve_node_meta restores a shallow copy on exit, which would undo
    # an outer block's annotation.
    preserve = contextlib.nullcontext() if fx_traceback.has_preserved_node_meta() else fx_traceback.preserve_node_meta()
    with preserve, fx_traceback.annotate({"stream": k}):
        yield

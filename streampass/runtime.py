"""Calling a rewritten graph eagerly: the stream/event object table, per graph, per call.

``torch.ops.streams`` ops look their int arguments up in dynamo's object table
(``torch._dynamo.graph_bytecode_inputs``). Under ``torch.compile`` dynamo fills it. For a graph
streampass rewrote and that you call yourself, :func:`bind` fills it for the duration of
one call: index 0 is the stream current at call time, every other stream index gets one
``torch.Stream`` owned by the graph, every event index one ``torch.Event``, one set for each
calling thread (two threads calling a graph at once must not record and wait on one event).
Entries that were there before are put back afterwards, so nothing leaks from one graph to
another.

A copy of the graph (``copy.deepcopy``, pickling) loses those hooks, and a compiled graph
looks up indices streampass allocated that dynamo never registered: for both,
:func:`install_object_fallback` routes the ops' lookups through :func:`lookup`, which answers
an index dynamo has no entry for with an object of the calling thread's own (index 0 the current
stream, an index ``>= EVENT_BASE`` an event, any other a side stream). :func:`install` turns it on.

On CPU, torch's events cannot be recorded, so CPU graphs get the no-op objects of
:mod:`streampass.cpu_objects`: every sync is then a no-op and results equal the original graph's
bit for bit.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import torch
import torch.fx
from torch._dynamo import graph_bytecode_inputs as table

from streampass import values
from streampass.analysis.reading import read_streams
from streampass.cpu_objects import NoOpEvent, NoOpStream
from streampass.ops import AMBIENT
from streampass.transform import saved_streams
from streampass.transform.plan import EVENT_BASE


# --------------------------------------------------------------------------------------------
# Objects for indices nobody registered (compiled graphs, and copies that lost their hooks)
# --------------------------------------------------------------------------------------------
class _ThreadState(threading.local):
    """What one thread's graph calls use: a call's ops all run in its thread, and two threads
    calling at once (request threads, each on a stream of its own) must not share an event: a
    wait would see the other's record."""

    def __init__(self):
        self.objects: dict = {}  # (device, index) -> fallback object
        self.tables: list = []  # index -> object of each graph being called, innermost last
        self.opened = weakref.WeakKeyDictionary()  # module -> its open binds (forward hooks), innermost last


_thread = _ThreadState()


def _fallback_object(index: int):
    objects = _thread.objects
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    device = (
        torch.device(acc.type, torch.accelerator.current_device_index()) if acc is not None else torch.device("cpu")
    )
    if device.type == "cpu":
        key = ("cpu", index)
        if key not in objects:
            objects[key] = NoOpEvent("cpu") if index >= EVENT_BASE else NoOpStream("cpu")
        return objects[key]
    if index == AMBIENT:
        return torch.accelerator.current_stream(device)
    key = (str(device), index)
    if key not in objects:
        objects[key] = torch.Event(device) if index >= EVENT_BASE else torch.Stream(device)
    return objects[key]


# dynamo's own lookup, kept before install_object_fallback replaces the names it is known by
_DYNAMO_LOOKUP = getattr(table.get_external_object_by_index, "__wrapped_dynamo__", table.get_external_object_by_index)


def lookup(index: int):
    """The object a stream op's index stands for at run time.

    In order: the table of the innermost graph :func:`bind` is calling; dynamo's object table
    (``graph_bytecode_inputs``, a dict in torch 2.13 and a list in 2.15); for an index nobody
    registered, an object of the current accelerator (no-op objects on CPU), one per thread, so
    that graphs called from two threads at once never share an event: index 0 the current
    stream, an index ``>= EVENT_BASE`` an event, any other a side stream.

    >>> type(lookup(EVENT_BASE + 7)).__name__, lookup(EVENT_BASE + 7) is lookup(EVENT_BASE + 7)
    ('NoOpEvent', True)
    """
    for entries in reversed(_thread.tables):
        obj = entries.get(index)
        if obj is not None:
            return obj
    # Compiled code calls this under dynamo's frame hook, which skips this frame only while it sees
    # nothing tensor-related here; a frame it compiles resets dynamo's object table under the running
    # one. So no reading of that table here (docs/benchmarks.md, sync lookup): ask dynamo's lookup.
    try:
        return _DYNAMO_LOOKUP(index)
    except AssertionError as e:
        if "not registered" not in str(e) or not isinstance(index, int) or index < 0:
            raise
    return _fallback_object(index)


def install_object_fallback() -> None:
    """Route the stream ops' index lookups through :func:`lookup` (idempotent, process-wide).

    The ops resolve an index with ``_get_stream_by_index``/``_get_event_by_index`` of
    ``torch._dynamo.variables.streams``, inductor's generated code with the first (torch 2.15) or
    with ``graph_bytecode_inputs.get_external_object_by_index`` (2.13): those three are replaced.
    ``streams.get_external_object_by_index`` stays dynamo's: dynamo knows the event a traced
    ``s.record_event()`` returns by that function's identity. Dynamo's own entries and prologue
    work as before; only lookups that would fail (``AssertionError: Index not registered``) or
    that a bound graph answers change.

    >>> from torch._dynamo import graph_bytecode_inputs
    >>> from torch._dynamo.variables import streams
    >>> install_object_fallback(); install_object_fallback()  # a second call changes nothing
    >>> graph_bytecode_inputs.get_external_object_by_index is lookup, streams.get_external_object_by_index is lookup
    (True, False)
    >>> type(streams._get_event_by_index(EVENT_BASE + 7)).__name__
    'NoOpEvent'
    """
    from torch._dynamo.variables import streams

    lookup.__wrapped_dynamo__ = _DYNAMO_LOOKUP
    table.get_external_object_by_index = lookup
    streams._get_stream_by_index, streams._get_event_by_index = _stream_by_index, _event_by_index


def _checked(kind: type, what: str):
    def by_index(index: int):  # dynamo's own helpers' check and message
        obj = lookup(index)
        if not isinstance(obj, kind):
            raise AssertionError(f"{what} expected a {kind.__name__.lower()} object at index {index}")
        return obj

    return by_index


_stream_by_index = _checked(torch.Stream, "Fork/join stream")
_event_by_index = _checked(torch.Event, "Record/wait event")


class StreamTable:
    """The objects one graph's stream and event indices stand for.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + 1
    >>> gm = make_fx(f)(torch.ones(2)); _ = sp.run(gm)
    >>> t = StreamTable.for_graph(gm)
    >>> sorted(t.streams), type(t.streams[1]).__name__
    ([0, 1], 'NoOpStream')
    """

    def __init__(self, streams: dict[int, torch.Stream], events: dict[int, torch.Event], device: torch.device):
        self.streams, self.events, self.device = streams, events, device

    def __reduce__(self):
        # A copied or pickled graph gets its own objects, made at its first call: streams and
        # events cannot be pickled, and sharing them between copies would share their events.
        return (_no_table, ())

    @classmethod
    def for_graph(cls, gm: torch.fx.GraphModule, device: torch.device | str | None = None) -> StreamTable:
        device = torch.device(device) if device is not None else values.graph_device(gm)
        a = read_streams(gm, external_events=_external(gm))
        if device.type == "cpu" or device.type == "meta":
            streams = {s: NoOpStream("cpu") for s in a.streams}
            events = {e: NoOpEvent("cpu") for e in a.events()}
        else:
            streams = {s: torch.Stream(device) for s in a.streams if s != 0}
            events = {e: torch.Event(device) for e in a.events()}
        return cls(streams, events, device)

    def entries(self) -> dict[int, object]:
        out: dict[int, object] = dict(self.events)
        out.update(self.streams)
        if 0 not in self.streams:
            out[0] = torch.accelerator.current_stream(self.device)
        return out


def _no_table() -> None:
    return None


class _TablePerThread(threading.local):
    """What ``state(gm)["table"]`` holds: the graph's :class:`StreamTable`, one per calling
    thread, so two threads calling one graph at once never record and wait on one event."""

    table: StreamTable | None = None

    def __reduce__(self):
        return (_no_table, ())


def table_of(gm: torch.fx.GraphModule) -> StreamTable | None:
    """The table ``gm``'s calls from this thread bind (None before the first call).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4)); _ = sp.run(gm)
    >>> table_of(gm) is None, torch.equal(gm(torch.ones(4)), f(torch.ones(4))), sorted(table_of(gm).streams)
    (True, True, [0, 1])
    """
    per_thread = state(gm)["table"]
    return per_thread.table if per_thread is not None else None


def state(gm: torch.fx.GraphModule) -> dict:
    """streampass's record on ``gm`` (``gm.meta["streampass"]``): the external events it was
    run with, the cached :class:`StreamTable` of each calling thread (:func:`table_of`) and,
    once :func:`streampass.run` planned it, the streams it read (``"streams"``: a body's, for
    the graph that calls it). It travels with ``copy.deepcopy`` and pickling, tables left out.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> state(gm)
    {'external_events': (), 'table': None}
    """
    return gm.meta.setdefault("streampass", {"external_events": (), "table": None})


def _external(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    return tuple(state(gm)["external_events"])


@contextlib.contextmanager
def bind(gm: torch.fx.GraphModule, device: torch.device | str | None = None) -> Iterator[StreamTable]:
    """Make ``gm``'s stream and event indices stand for its own objects while the block runs.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> _ = sp.run(gm)
    >>> with bind(gm) as t:
    ...     inside = all(lookup(i) is o for i, o in t.entries().items())
    >>> inside, all(lookup(i) is not o for i, o in t.entries().items() if i)
    (True, True)
    """
    install_object_fallback()
    record = state(gm)
    per_thread = record["table"]  # read once: run() may reset it in another thread
    if per_thread is None:
        per_thread = record["table"] = _TablePerThread()
    t = per_thread.table
    if t is None or (device is not None and torch.device(device) != t.device):
        t = per_thread.table = StreamTable.for_graph(gm, device)
    tables, entries = _thread.tables, t.entries()
    tables.append(entries)
    try:
        yield t
    finally:
        tables.remove(entries)


def install(gm: torch.fx.GraphModule) -> None:
    """Make ``gm(*args)`` bind its table around every call (forward hooks; idempotent).
    :func:`streampass.run` calls this; ``gm.forward(...)`` bypasses the hooks.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> _ = sp.run(gm, bind_runtime=False)
    >>> install(gm); install(gm)
    >>> len(gm._forward_pre_hooks), torch.equal(gm(torch.ones(4)), f(torch.ones(4)))
    (1, True)
    """
    install_object_fallback()
    if _bind_before_call in gm._forward_pre_hooks.values():
        return
    gm.register_forward_pre_hook(_bind_before_call)
    gm.register_forward_hook(_unbind_after_call, always_call=True)
    # Copies get the hooks too. GraphModule.__deepcopy__ drops forward hooks but runs (and
    # keeps) its deepcopy hooks; unpickling rebuilds the module from its code, without hooks or
    # meta, so the class of this one instance (GraphModule makes one per instance) reduces to
    # a call that puts them back, with the nodes' streams.
    if install not in getattr(gm, "_deepcopy_hooks", ()) and hasattr(gm, "_register_deepcopy_hook"):
        gm._register_deepcopy_hook(install)
    cls = type(gm)
    if cls.__qualname__.endswith("GraphModuleImpl") and "__reduce__" not in cls.__dict__:
        cls.__reduce__ = _reduce_installed


def _reduce_installed(gm: torch.fx.GraphModule):
    rebuild, args = super(type(gm), gm).__reduce__()[:2]
    return _rebuild_installed, (rebuild, args, state(gm)["external_events"], saved_streams.side_streams(gm))


def _rebuild_installed(rebuild, args, external_events, streams=None) -> torch.fx.GraphModule:
    gm = rebuild(*args)
    state(gm)["external_events"] = tuple(external_events)
    saved_streams.restore_side_streams(gm, streams or {})  # None: pickled before streams were kept
    install(gm)
    return gm


# Module-level hooks (not closures), so a graph with them can be deep-copied and pickled.
def _bind_before_call(module, args) -> None:
    es = contextlib.ExitStack()
    es.enter_context(bind(module))
    _thread.opened.setdefault(module, []).append(es)


def _unbind_after_call(module, args, output) -> None:
    stack = _thread.opened.get(module)
    if stack:
        stack.pop().close()


class StreamInterpreter(torch.fx.Interpreter):
    """Runs each node on the stream it is assigned to (on CPU: same as calling the graph)."""

    def __init__(self, gm: torch.fx.GraphModule, table: StreamTable):
        super().__init__(gm)
        self.table = table
        self.stream_of = read_streams(gm, external_events=_external(gm)).stream

    def run_node(self, n: torch.fx.Node):
        s = self.stream_of.get(n, 0)
        obj = self.table.streams.get(s)
        if s == 0 or obj is None or isinstance(obj, NoOpStream):
            return super().run_node(n)
        with obj:
            return super().run_node(n)


def execute(gm: torch.fx.GraphModule, *args, device: torch.device | str | None = None):
    """Call ``gm`` with every node on its own stream (CUDA), the syncs doing their job.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> x = torch.randn(4); gm = make_fx(f)(x); _ = sp.run(gm)
    >>> torch.equal(execute(gm, x), f(x))
    True
    """
    with bind(gm, device) as t:
        return StreamInterpreter(gm, t).run(*args)

"""Read every way a graph says where its nodes run into one :class:`StreamAssignment`.

Rules, in order of precedence for a node's stream (see docs/design.md):

1. a stream op's own stream argument (``record_event(e, s)`` runs on ``s``, ``wait_stream(w, x)``
   on ``w``, ``fork(a, b)`` on ``a``, ``join(b, a)`` on ``a``), plain or inside ``control_deps``;
2. ``node.meta["custom"]["stream"]``;
3. the innermost open ``fork(from, to)`` … ``join(to, from)`` region before it in graph order;
4. otherwise the ambient stream 0.

Reading is pure: it never edits the graph.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch.fx

from streampass import modules, ops, values
from streampass.analysis import wellformed
from streampass.errors import StreamPassError
from streampass.ops import AMBIENT, MAX_INDEX, check_stream_index


@dataclass
class StreamAssignment:
    """Where each node of a graph runs, and the stream ops it already has.

    Attributes:
        graph: the graph read (not copied).
        nodes: the graph's nodes in graph (issue) order.
        stream: node -> stream index (0 = ambient).
        syncs: node -> :class:`~streampass.ops.SyncCall` for every stream op (fork/join included).
        root: node -> the node that made the storage its value lives in (views, in-place
            results and ``control_deps`` passthroughs resolve to their source; a ``get_attr`` to
            the first ``get_attr`` of the same tensor storage).
        external_events: event indices the caller declared as recorded outside the graph.
        position: node -> its index in ``nodes``.
        compute: the nodes that do work on a stream (see :meth:`is_compute`): not views
            (``t``, ``view``, ``expand``, ``detach``, ...) nor the getitems of multi-output
            ops, which launch nothing.
        producer: a getitem of a multi-output op -> the op, whose kernel writes it.
        hidden: a ``call_module`` -> the storage roots it reads and those it writes without
            taking them as arguments (:func:`streampass.modules.module_state`). A tensor no
            ``get_attr`` of the graph names has a root of its own outside the graph (a
            ``get_attr`` node of another graph): an input that no node of this one stands for.
        named: streams that stream ops name without running on them (the stream
            ``wait_stream`` waits for, the one ``synchronize_stream`` syncs, fork/join's other
            end); they may have no node of their own.
    """

    graph: torch.fx.Graph
    nodes: list[torch.fx.Node]
    stream: dict[torch.fx.Node, int]
    syncs: dict[torch.fx.Node, ops.SyncCall]
    root: dict[torch.fx.Node, torch.fx.Node]
    external_events: frozenset[int] = frozenset()
    position: dict[torch.fx.Node, int] = field(default_factory=dict)
    compute: frozenset[torch.fx.Node] = frozenset()
    producer: dict[torch.fx.Node, torch.fx.Node] = field(default_factory=dict)
    named: frozenset[int] = frozenset()
    hidden: dict[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], tuple[torch.fx.Node, ...]]] = field(
        default_factory=dict
    )

    @property
    def streams(self) -> list[int]:
        """All stream indices used or named by a stream op, ambient (0) always first."""
        return sorted(set(self.stream.values()) | self.named | {AMBIENT})

    def events(self) -> set[int]:
        """Event indices that stream ops in the graph refer to."""
        out = set()
        for call in self.syncs.values():
            if call.target in (ops.RECORD_EVENT, ops.WAIT_EVENT, ops.SYNC_EVENT, ops.SYNC_DEALLOC):
                out.add(call.args[0])
        return out

    def node_named(self, name: str) -> torch.fx.Node | None:
        """The node called ``name``, or None (the map is built on first use)."""
        by_name = self.__dict__.get("_by_name")
        if by_name is None:
            by_name = self.__dict__["_by_name"] = {n.name: n for n in self.nodes}
        return by_name.get(name)

    def is_compute(self, node: torch.fx.Node) -> bool:
        """A node that launches work on a stream: a call that is not a stream op, a getitem or a view."""
        return node in self.compute


def _graph_of(g: torch.fx.GraphModule | torch.fx.Graph) -> torch.fx.Graph:
    if isinstance(g, torch.fx.GraphModule):
        return g.graph
    if isinstance(g, torch.fx.Graph):
        return g
    raise StreamPassError(f"expected a torch.fx.GraphModule or Graph, got {type(g).__name__}")


def annotated_stream(node: torch.fx.Node) -> int | None:
    """``node.meta["custom"]["stream"]`` if set (validated), else None.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> x.meta["custom"] = {"stream": 3}
    >>> annotated_stream(x), annotated_stream(g.placeholder("y"))
    (3, None)
    """
    custom = node.meta.get("custom")
    if not isinstance(custom, dict):
        if custom is None:
            return None
        raise StreamPassError(f'meta["custom"] is a {type(custom).__name__}: annotations are a dict', node.name)
    s = custom.get("stream")
    if s is None or (type(s) is int and 0 <= s <= MAX_INDEX):
        return s
    return check_stream_index(s, node.name)


# The stream argument of the ops that name a stream other than the one they run on.
_OTHER_STREAM_ARG = {ops.WAIT_STREAM: 1, ops.SYNC_STREAM: 0, ops.FORK: 1, ops.JOIN: 0}


def named_stream(call: ops.SyncCall) -> int | None:
    """The stream a stream op names without running on it (see ``StreamAssignment.named``), or None.

    >>> g = torch.fx.Graph()
    >>> named_stream(ops.as_sync_call(g.call_function(ops.WAIT_STREAM, (0, 2))))  # stream 0 waits for 2
    2
    >>> named_stream(ops.as_sync_call(g.call_function(ops.RECORD_EVENT, (7, 1)))) is None
    True
    """
    i = _OTHER_STREAM_ARG.get(call.target)
    return None if i is None else call.args[i]


def _op_stream(call: ops.SyncCall) -> int:
    """The stream a stream op is issued on, from its own arguments (validated)."""
    t, a = call.target, call.args
    problem = wellformed.argument_problem(call)
    if problem is not None:
        raise StreamPassError(f"{call.name} {problem}", call.node.name)
    for i in ops.INDEX_ARGS[t]:
        check_stream_index(a[i], call.node.name)
    if t in (ops.RECORD_EVENT, ops.WAIT_EVENT, ops.SYNC_DEALLOC, ops.RECORD_STREAM, ops.JOIN):
        return a[1]
    if t in (ops.WAIT_STREAM, ops.FORK):
        return a[0]
    return AMBIENT  # synchronize_*: host-side barriers, issued from the ambient stream's thread


def event_indices(external_events: Iterable[int]) -> frozenset[int]:
    """``external_events`` checked: an iterable of event indices (None: none).

    >>> sorted(event_indices([3, 2])), event_indices(None)
    ([2, 3], frozenset())
    >>> event_indices(5)
    Traceback (most recent call last):
    ...
    streampass.errors.StreamPassError: external_events must be an iterable of event indices, got 5
    """
    if external_events is None:
        return frozenset()
    if isinstance(external_events, (str, bytes)) or not isinstance(external_events, Iterable):
        raise StreamPassError(f"external_events must be an iterable of event indices, got {external_events!r}")
    return frozenset(check_stream_index(e) for e in external_events)


def read_streams(g: torch.fx.GraphModule | torch.fx.Graph, external_events: Iterable[int] = ()) -> StreamAssignment:
    """Read the stream of every node of ``g``.

    Raises :class:`StreamPassError` (naming the node) for a join without its fork, a fork
    never joined, a stream index that is not a non-negative int, a wait on an event that no
    earlier node records and that is not in ``external_events``, a ``get_attr`` of an attribute
    the graph's module lacks, and the malformed graphs ``analysis.wellformed`` describes.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(2):
    ...         y = x * 2
    ...     return y + x
    >>> a = read_streams(make_fx(f)(torch.ones(2)))
    >>> a.streams, sorted((n.name, s) for n, s in a.stream.items() if s)
    ([0, 2], [('mul', 2)])
    """
    graph = _graph_of(g)
    external = event_indices(external_events)
    nodes = list(graph.nodes)
    stream: dict[torch.fx.Node, int] = {}
    syncs: dict[torch.fx.Node, ops.SyncCall] = {}
    regions: list[tuple[int, torch.fx.Node]] = []  # open fork regions: (stream, fork node)
    recorded: set[int] = set()

    root: dict[torch.fx.Node, torch.fx.Node] = {}
    named: set[int] = set()
    compute: list[torch.fx.Node] = []
    producer: dict[torch.fx.Node, torch.fx.Node] = {}
    passthroughs: list[torch.fx.Node] = []
    maybe_sync = ops.STREAM_OP_IDS  # plus control_deps, tested below
    getitem, control_deps = operator.getitem, ops.CONTROL_DEPS
    returned: torch.fx.Node | None = None  # the output, once passed: FX's code ends there
    owner = graph.owning_module
    attributes, attribute_root = modules.attribute_roots(nodes, owner)  # one root per storage
    hidden: dict[torch.fx.Node, tuple[tuple[torch.fx.Node, ...], tuple[torch.fx.Node, ...]]] = {}
    unseen: list[tuple[torch.fx.Node, str]] = []  # control_deps wrapping work: its accesses unread

    # One pass: per node its stream, sync call, storage root and whether it does work.
    for node in nodes:
        for inp in ops.input_nodes(node):
            if inp not in root:
                raise StreamPassError(
                    f"uses {inp.name!r} before it is defined (the graph is not in topological order)", node.name
                )
        op = node.op
        target = node.target
        if op == "call_function" and (id(target) in maybe_sync or target is control_deps):
            if target is control_deps:
                problem = wellformed.control_deps_problem(node)
                if problem is not None:
                    raise StreamPassError(problem, node.name)
                if (work := wellformed.control_deps_work(node)) is not None:
                    unseen.append((node, work))  # refused below if the graph uses streams
            call = ops.as_sync_call(node)
            if call is not None:
                if returned is not None:
                    raise StreamPassError(
                        f"comes after the graph's output {returned.name!r}, so it never runs (a pass sorted "
                        "the output before it)", node.name
                    )  # fmt: skip
                syncs[node] = call
                root[node] = node
                stream[node] = _sync_stream(call, regions, recorded, external)
                other = named_stream(call)
                if other is not None:
                    named.add(other)
                continue
        if returned is not None:
            # FX's code returns at the output: a node after it never runs (dead code a sort left
            # there, which DCE removes), so it reads, writes and orders nothing.
            root[node], stream[node] = node, AMBIENT
            continue
        src = values.aliases_input(node) if op in ops.CALL_OPS else None
        root[node] = root.get(src, src) if src is not None else node
        annotated = annotated_stream(node)
        if op == "output":
            returned = node
        if op == "get_attr":
            if node not in attribute_root:  # (a get_attr after the output was passed above)
                raise StreamPassError(f"get_attr of {target!r}, which the graph's module does not have", node.name)
            root[node] = attribute_root[node]
        elif op == "call_module":
            state = modules.module_state_roots(node, attributes)
            if state != ((), ()):
                hidden[node] = state
        if op in ("placeholder", "get_attr", "output"):
            stream[node] = AMBIENT  # inputs are ready on the ambient stream; outputs are returned there
            continue
        if annotated is not None:
            stream[node] = annotated
        else:
            stream[node] = regions[-1][0] if regions else AMBIENT
        if target is getitem and isinstance(node.args[0], torch.fx.Node) and node.args[0].target is control_deps:
            passthroughs.append(node)  # an alias that only carries ordering: runs where its wrapper runs
        elif target is getitem and isinstance(node.args[0], torch.fx.Node) and not values.indexes_a_tensor(node):
            # One result of a multi-output op (or a chunk of a list of views): it launches
            # nothing, and the op's kernel is what writes it, on the op's stream (an exported
            # higher-order op can leave the annotation on its getitems alone).
            if src is None:
                producer[node] = made_by = producer.get(node.args[0], node.args[0])
                stream[node] = stream[made_by]
        elif values.is_view(node):
            pass  # metadata only: its readers read the source's storage (root), nothing runs
        elif target is not control_deps:
            compute.append(node)

    if nodes and returned is None:
        raise StreamPassError("the graph has no output node: FX's code would return nothing", nodes[-1].name)
    if unseen and (syncs or named or any(stream.values())):
        raise StreamPassError(unseen[0][1], unseen[0][0].name)
    if regions:
        s, fork_node = regions[-1]
        raise StreamPassError(f"fork to stream {s} is never joined", fork_node.name)
    for node in passthroughs:
        stream[node] = stream[node.args[0]]
    _merge_rebound(nodes, root)

    assignment = StreamAssignment(
        graph=graph,
        nodes=nodes,
        stream=stream,
        syncs=syncs,
        root=root,
        external_events=external,
        position={n: i for i, n in enumerate(nodes)},
        compute=frozenset(compute),
        producer=producer,
        named=frozenset(named),
        hidden=hidden,
    )
    # Streams and events are looked up in one object table: one index cannot be both.
    clash = assignment.events() & (set(stream.values()) | named)
    if clash:
        index = min(clash)
        node = next((n for n, s in stream.items() if s == index), None) or next(
            n for n, c in syncs.items() if named_stream(c) == index
        )
        raise StreamPassError(f"index {index} is used both as a stream and as an event", node.name)
    return assignment


_WAITS_ON_EVENT = (ops.WAIT_EVENT, ops.SYNC_EVENT, ops.SYNC_DEALLOC)


def events_recorded_outside(g: torch.fx.GraphModule | torch.fx.Graph) -> tuple[int, ...]:
    """The events ``g`` waits on before any of its own nodes records them, in order of first wait.

    Under ``torch.compile`` every event is an object of dynamo's table, so such an event was
    recorded by code outside the graph: an earlier graph (a graph break between ``e.record()``
    and ``e.wait()``, another compiled function) or eager code; or never, and the wait does
    nothing. :class:`streampass.inductor.StreamPass` passes them to ``run`` as
    ``external_events``.

    >>> g = torch.fx.Graph()
    >>> _ = g.call_function(ops.WAIT_EVENT, (5, 1)), g.call_function(ops.RECORD_EVENT, (6, 1))
    >>> _ = g.call_function(ops.WAIT_EVENT, (6, 0)), g.call_function(ops.WAIT_EVENT, (7, 0))
    >>> events_recorded_outside(g)
    (5, 7)
    """
    recorded: set[int] = set()
    outside: dict[int, None] = {}
    for node in _graph_of(g).nodes:
        call = ops.as_sync_call(node)
        if call is None or not call.args or not isinstance(call.args[0], int):
            continue  # not an event op, or one read_streams refuses with the node's name
        if call.target is ops.RECORD_EVENT:
            recorded.add(call.args[0])
        elif call.target in _WAITS_ON_EVENT and call.args[0] not in recorded:
            outside.setdefault(call.args[0])
    return tuple(outside)


def _sync_stream(call: ops.SyncCall, regions: list, recorded: set[int], external: frozenset[int]) -> int:
    """The stream of a stream op; checks fork/join nesting and that waited events are recorded."""
    node = call.node
    s = _op_stream(call)
    if call.target is ops.FORK:
        src, dst = call.args
        current = regions[-1][0] if regions else AMBIENT
        if src != current:
            raise StreamPassError(f"fork from stream {src}, but the current stream here is {current}", node.name)
        regions.append((dst, node))
    elif call.target is ops.JOIN:
        src, dst = call.args
        if not regions:
            raise StreamPassError(f"join({src}, {dst}) without a matching fork", node.name)
        top, fork_node = regions[-1]
        if src != top:
            raise StreamPassError(
                f"join({src}, {dst}) does not close the innermost fork {fork_node.name!r} to stream {top}",
                node.name,
            )
        outer = regions[-2][0] if len(regions) > 1 else AMBIENT
        if dst != outer:
            raise StreamPassError(
                f"join({src}, {dst}) returns to stream {dst}, but {fork_node.name!r} forked from {outer}",
                node.name,
            )
        regions.pop()
    elif call.target is ops.RECORD_EVENT:
        recorded.add(call.args[0])
    elif call.target in _WAITS_ON_EVENT:
        ev = call.args[0]
        if ev not in recorded and ev not in external:
            raise StreamPassError(
                f"{call.name} waits on event {ev}, which no earlier node records; "
                f"pass external_events=[{ev}] if it is recorded outside the graph",
                node.name,
            )
    return s


def _merge_rebound(nodes: list[torch.fx.Node], root: dict[torch.fx.Node, torch.fx.Node]) -> None:
    """``z.set_(x)`` makes ``z`` share ``x``'s storage from then on. make_fx's later uses read the
    ``set_`` node, whose root is ``x``'s; symbolic_trace's read ``z``'s own node, whose root names
    its old storage. Then every node of ``z``'s storage takes ``x``'s, before the ``set_`` too: a
    conflict taken where there is none costs a wait, a missed one a race."""
    for i, node in enumerate(nodes):
        source = values.rebound_to(node) if node.op in ops.CALL_OPS else None
        if source is None or not isinstance(values.first_argument(node), torch.fx.Node):
            continue
        old, new = root[values.first_argument(node)], root[source]
        used_later = any(root.get(x) is old for later in nodes[i + 1 :] for x in ops.input_nodes(later))
        if old is not new and used_later:
            for n, r in root.items():
                if r is old:
                    root[n] = new

"""The cross-stream dependency DAG of a graph, with happens-before from vector clocks."""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx
import torch.fx

from streampass import ops
from streampass.analysis.hazards import find_hazards
from streampass.analysis.reading import StreamAssignment, read_streams

NodeRef = "torch.fx.Node | str"


def vector_clocks(a: StreamAssignment) -> tuple[dict[int, int], dict[torch.fx.Node, tuple[int, ...]]]:
    """Per-node vector clocks in graph (CPU issue) order.

    Returns ``(slot, clock)``: ``slot[s]`` is stream ``s``'s position in the vectors, and
    ``clock[n][slot[t]]`` counts the nodes of stream ``t`` that are known to complete before
    ``n`` runs (for ``t = stream(n)``: ``n``'s own position on its stream). Records copy their
    stream's vector into the event; waits join it; ``synchronize_*`` join into every stream.
    """
    streams = a.streams
    slot = {s: i for i, s in enumerate(streams)}
    width = len(streams)
    vc = [[0] * width for _ in streams]
    event_clock: dict[int, list[int]] = {}
    clock: dict[torch.fx.Node, tuple[int, ...]] = {}

    def join(into: list[int], other: list[int]) -> None:
        for i, v in enumerate(other):
            if v > into[i]:
                into[i] = v

    for node in a.nodes:
        i = slot[a.stream[node]]
        mine = vc[i]
        mine[i] += 1
        call = a.syncs.get(node)
        if call is not None:
            t = call.target
            if t is ops.RECORD_EVENT:
                event_clock[call.args[0]] = list(mine)
            elif t in (ops.WAIT_EVENT, ops.SYNC_DEALLOC):
                if call.args[0] in event_clock:
                    join(mine, event_clock[call.args[0]])
            elif t is ops.WAIT_STREAM:
                join(mine, vc[slot[call.args[1]]])
            elif t in (ops.SYNC_EVENT, ops.SYNC_STREAM, ops.SYNC_DEVICE):
                if t is ops.SYNC_EVENT:
                    done = event_clock.get(call.args[0], [0] * width)
                elif t is ops.SYNC_STREAM:
                    done = list(vc[slot[call.args[0]]])
                else:
                    done = [max(col) for col in zip(*vc)]
                for other in vc:
                    join(other, done)
        clock[node] = tuple(mine)
    return slot, clock


class StreamDAG:
    """A graph's nodes, streams and dependencies as a ``networkx.DiGraph`` (``.nx``).

    Nodes are keyed by FX node name with attributes ``stream``, ``target``, ``op`` and
    ``index`` (graph position). Edges carry ``kind``: ``"data"`` (an argument), ``"order"``
    (consecutive nodes of one stream) or ``"sync"`` (record -> wait, or the waited stream's
    last node -> ``wait_stream``); ``kinds`` lists every reason when an edge has several.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     y = x * 2
    ...     with sp.stream(1):
    ...         z = y + 1
    ...     return z
    >>> dag = StreamDAG.from_graph(make_fx(f)(torch.ones(2)))
    >>> dag.streams, dag.cross_stream_edges()
    ([0, 1], [('mul', 'add'), ('add', 'output')])
    >>> dag.happens_before("x_1", "mul"), dag.happens_before("mul", "add")
    (True, False)
    """

    def __init__(self, assignment: StreamAssignment):
        self.assignment = assignment
        self.slot, self.clock = vector_clocks(assignment)
        self._by_name = {n.name: n for n in assignment.nodes}
        self._nx: nx.DiGraph | None = None
        self._hazards = None

    @property
    def nx(self) -> nx.DiGraph:
        """The networkx view, built on first use (verification needs only the clocks)."""
        if self._nx is None:
            self._nx = self._build()
        return self._nx

    @classmethod
    def from_graph(cls, g: torch.fx.GraphModule | torch.fx.Graph, external_events: Iterable[int] = ()) -> StreamDAG:
        """Read ``g``'s streams (see :func:`streampass.analysis.reading.read_streams`) and build the DAG."""
        return cls(read_streams(g, external_events))

    def __repr__(self) -> str:
        """One line, like networkx's: size, streams, cross-stream edges.

        >>> import torch, streampass as sp
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> def f(x):
        ...     with sp.stream(1):
        ...         y = x.sin()
        ...     return y + 1
        >>> sp.StreamDAG.from_graph(make_fx(f)(torch.ones(2)))
        <StreamDAG: 4 nodes on streams [0, 1], 2 cross-stream data edges>
        """
        return (
            f"<StreamDAG: {self.nx.number_of_nodes()} nodes on streams {self.streams}, "
            f"{len(self.cross_stream_edges())} cross-stream data edges>"
        )

    # -- queries --------------------------------------------------------------------------
    @property
    def streams(self) -> list[int]:
        return self.assignment.streams

    def node(self, ref: NodeRef) -> torch.fx.Node:
        return self._by_name[ref] if isinstance(ref, str) else ref

    def stream_of(self, ref: NodeRef) -> int:
        return self.assignment.stream[self.node(ref)]

    def nodes_on(self, stream: int) -> list[str]:
        """Names of the nodes issued on ``stream``, in issue order."""
        return [n.name for n in self.assignment.nodes if self.assignment.stream[n] == stream]

    def happens_before(self, a: NodeRef, b: NodeRef) -> bool:
        """True if ``a`` is guaranteed to complete before ``b`` starts on the device. O(1)."""
        a, b = self.node(a), self.node(b)
        if a is b:
            return False
        i = self.slot[self.assignment.stream[a]]
        return self.clock[b][i] >= self.clock[a][i]

    def cross_stream_edges(self) -> list[tuple[str, str]]:
        """Data edges whose ends run on different streams, in graph order of the consumer."""
        return [
            (u, v)
            for u, v, d in self.nx.edges(data=True)
            if "data" in d["kinds"] and self.nx.nodes[u]["stream"] != self.nx.nodes[v]["stream"]
        ]

    def hazards(self):
        """The races of this graph (see :func:`streampass.analysis.verify.verify`), computed once."""
        if self._hazards is None:
            self._hazards = find_hazards(self)
        return self._hazards

    def _repr_html_(self) -> str:
        """Jupyter's hook: the DAG drawn by :mod:`streampass.view` (the one place a DAG knows of views)."""
        from streampass import view

        return view.repr_html(self)

    # -- construction ---------------------------------------------------------------------
    def _build(self) -> nx.DiGraph:
        a = self.assignment
        g = nx.DiGraph()
        for i, n in enumerate(a.nodes):
            g.add_node(n.name, stream=a.stream[n], target=ops.target_name(n), op=n.op, index=i)

        def edge(u: torch.fx.Node, v: torch.fx.Node, kind: str) -> None:
            if g.has_edge(u.name, v.name):
                kinds = g.edges[u.name, v.name]["kinds"]
                if kind not in kinds:
                    kinds.append(kind)
            else:
                g.add_edge(u.name, v.name, kind=kind, kinds=[kind])

        last_on: dict[int, torch.fx.Node] = {}
        last_record: dict[int, torch.fx.Node] = {}
        for n in a.nodes:
            body = n.args[1] if n.target is ops.CONTROL_DEPS else None  # a module, not data
            for inp in n.all_input_nodes:
                if inp is not body:
                    edge(inp, n, "data")
            s = a.stream[n]
            if s in last_on:
                edge(last_on[s], n, "order")
            call = a.syncs.get(n)
            if call is not None:
                t = call.target
                if t is ops.RECORD_EVENT:
                    last_record[call.args[0]] = n
                elif t in (ops.WAIT_EVENT, ops.SYNC_DEALLOC, ops.SYNC_EVENT) and call.args[0] in last_record:
                    edge(last_record[call.args[0]], n, "sync")
                elif t in (ops.WAIT_STREAM, ops.SYNC_STREAM):
                    waited = call.args[1] if t is ops.WAIT_STREAM else call.args[0]
                    if waited in last_on and last_on[waited] is not n:
                        edge(last_on[waited], n, "sync")
            last_on[s] = n
        return g

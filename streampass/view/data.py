"""The plain, JSON-able snapshot of a stream DAG that every view draws from, and its JSON round trip."""

from __future__ import annotations

import json
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from streampass import ops
from streampass.analysis.dag import StreamDAG
from streampass.view.style import JSON_FORMAT


@dataclass
class StreamDAGData:
    """A plain, JSON-able snapshot of a stream DAG; what :func:`from_json` returns.

    ``nodes``: one dict per node in issue order, keys ``name``, ``stream``, ``target``, ``op``,
    ``index`` (graph position), ``role`` (``input``, ``output``, ``compute``, ``sync``,
    ``alias`` = a ``control_deps`` passthrough getitem, ``subgraph`` = a ``control_deps`` body,
    ``other``), ``sync`` (the stream op's name or None), ``sync_args`` and ``alias_of``.
    ``edges``: dicts ``src``, ``dst``, ``kind``, ``kinds`` (as on ``StreamDAG.nx``).
    ``streams``: stream indices, ambient (0) first. ``hazards``: :class:`streampass.Hazard`.

    Every view takes it where it takes a live DAG, a notebook displays it the same way, and it
    compares equal to ``data(dag)`` of the DAG it was written from.
    """

    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    streams: list[int]
    hazards: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_name = {n["name"]: n for n in self.nodes}
        self._nx: nx.DiGraph | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamDAGData):
            return NotImplemented
        return (self.nodes, self.edges, self.streams, list(self.hazards)) == (
            other.nodes,
            other.edges,
            other.streams,
            list(other.hazards),
        )

    # the same query names as StreamDAG, where they make sense on a snapshot
    @property
    def nx(self) -> nx.DiGraph:
        """The snapshot as a ``networkx.DiGraph`` (node and edge attributes as on ``StreamDAG.nx``)."""
        if self._nx is None:
            g = nx.DiGraph()
            for n in self.nodes:
                g.add_node(n["name"], **{k: n[k] for k in ("stream", "target", "op", "index")})
            for e in self.edges:
                g.add_edge(e["src"], e["dst"], kind=e["kind"], kinds=list(e["kinds"]))
            self._nx = g
        return self._nx

    def stream_of(self, name: str) -> int:
        """The stream node ``name`` runs on."""
        return self._by_name[name]["stream"]

    def nodes_on(self, stream: int) -> list[str]:
        """Names of the nodes on ``stream``, in issue order."""
        return [n["name"] for n in self.nodes if n["stream"] == stream]

    def cross_stream_edges(self) -> list[tuple[str, str]]:
        """``(src, dst)`` of every data edge whose ends run on different streams."""
        return [
            (e["src"], e["dst"])
            for e in self.edges
            if "data" in e["kinds"] and self.stream_of(e["src"]) != self.stream_of(e["dst"])
        ]

    def _repr_html_(self) -> str:
        """Jupyter's hook, as on a live DAG (:func:`streampass.view.notebook.repr_html`)."""
        from streampass.view.notebook import repr_html

        return repr_html(self)

    def __repr__(self) -> str:
        return (
            f"StreamDAGData({len(self.nodes)} nodes, {len(self.edges)} edges, streams {self.streams}, "
            f"{len(self.hazards)} hazard(s))"
        )


#: StreamDAG -> its snapshot, kept while the DAG lives (several views of one DAG read it once)
_SNAPSHOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def data(dag) -> StreamDAGData:
    """The snapshot of ``dag`` (a StreamDAG, a GraphModule/Graph, or already a snapshot).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> d = data(gm)
    >>> d
    StreamDAGData(5 nodes, 5 edges, streams [0, 1], 4 hazard(s))
    >>> d.nodes_on(1), d.cross_stream_edges()
    (['sin'], [('x_1', 'sin'), ('sin', 'add')])
    >>> sorted(h.kind for h in d.hazards)
    ['dealloc', 'entry', 'exit', 'raw']
    >>> data(d) is d
    True
    """
    if isinstance(dag, StreamDAGData):
        return dag
    if isinstance(getattr(dag, "data", None), StreamDAGData):  # a drawn region (notebook.DAGView)
        return dag.data
    if not isinstance(dag, StreamDAG):
        dag = StreamDAG.from_graph(dag)
    cached = _SNAPSHOTS.get(dag)
    if cached is not None:
        return cached
    a = dag.assignment
    g = dag.nx
    nodes = []
    for n in a.nodes:
        attrs = g.nodes[n.name]
        call = a.syncs.get(n)
        role, alias_of = _role(n, a, call, ops)
        nodes.append(
            {
                "name": n.name,
                "stream": int(attrs["stream"]),
                "target": str(attrs["target"]),
                "op": attrs["op"],
                "index": int(attrs["index"]),
                "role": role,
                "sync": call.name if call is not None else None,
                "sync_args": [_jsonable(x) for x in call.args] if call is not None else None,
                "alias_of": alias_of,
            }
        )
    edges = [
        {"src": u, "dst": v, "kind": d["kind"], "kinds": list(d["kinds"])}
        for u, v, d in sorted(
            g.edges(data=True),
            key=lambda e: (g.nodes[e[1]]["index"], g.nodes[e[0]]["index"]),
        )
    ]
    out = StreamDAGData(nodes, edges, list(dag.streams), list(dag.hazards()))
    _SNAPSHOTS[dag] = out  # a StreamDAG never changes once built
    return out


def _role(n, a, call, ops) -> tuple[str, str | None]:
    if n.op == "placeholder":
        return "input", None
    if n.op == "output":
        return "output", None
    if call is not None:
        return "sync", None
    if n.op == "get_attr" and n.users and all(u.target is ops.CONTROL_DEPS and u.args[1] is n for u in n.users):
        return "subgraph", None
    if (
        n.op == "call_function"
        and n.target is operator.getitem
        and getattr(n.args[0], "target", None) is ops.CONTROL_DEPS
    ):
        return "alias", n.args[0].name
    if a.is_compute(n):
        return "compute", None
    return "other", None


def _jsonable(x):
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return [_jsonable(y) for y in x]
    return str(x)


def to_json(dag, indent: int | None = None) -> str:
    """Nodes, edges, streams and hazards as JSON (format ``streampass.dag/1``).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> import json
    >>> doc = json.loads(to_json(gm))
    >>> doc["format"], doc["streams"], [n["name"] for n in doc["nodes"]]
    ('streampass.dag/1', [0, 1], ['x_1', 'sin', 'cos', 'add', 'output'])
    >>> [(e["src"], e["dst"]) for e in doc["edges"] if e["src"] == "sin"]
    [('sin', 'add')]
    """
    d = data(dag)
    return json.dumps(
        {
            "format": JSON_FORMAT,
            "streams": d.streams,
            "nodes": d.nodes,
            "edges": d.edges,
            "hazards": [{"kind": h.kind, "nodes": list(h.nodes), "message": h.message} for h in d.hazards],
        },
        indent=indent,
    )


def from_json(text: str) -> StreamDAGData:
    """Read :func:`to_json` output back as a :class:`StreamDAGData` (views work on it too).

    It is a snapshot, not a live :class:`~streampass.analysis.dag.StreamDAG`: there is no graph, so no
    vector clocks or ``happens_before``; ``.nx`` has the same nodes, edges and attributes.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> back = from_json(to_json(gm))
    >>> back == data(gm), back.stream_of("sin"), len(back.hazards)
    (True, 1, 4)
    >>> sorted(back.nx.successors("sin"))
    ['add']
    >>> from_json('{"format": "other"}')
    Traceback (most recent call last):
    ...
    ValueError: not a streampass DAG JSON document (format 'other', expected 'streampass.dag/1')
    """
    from streampass.analysis.hazards import Hazard

    obj = json.loads(text)
    fmt = obj.get("format")
    if fmt != JSON_FORMAT:
        raise ValueError(f"not a streampass DAG JSON document (format {fmt!r}, expected {JSON_FORMAT!r})")
    hazards = [Hazard(h["kind"], tuple(h["nodes"]), h["message"]) for h in obj["hazards"]]
    return StreamDAGData(obj["nodes"], obj["edges"], list(obj["streams"]), hazards)

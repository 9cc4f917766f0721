"""Views of a :class:`~streampass.analysis.dag.StreamDAG` that a person reads: lanes, tables, pictures.

Everything here reads a DAG and never edits a graph. All views work on a plain snapshot of
the DAG, :class:`StreamDAGData` (nodes, edges, streams, hazards), so a DAG read back from
JSON (:func:`from_json`) displays exactly like the live one.

- :func:`to_dot` — Graphviz source built with pydot: one cluster (lane) per stream, nodes in
  issue order, cross-stream data edges in blue, record -> wait edges dashed purple, hazards red
  with their message as tooltip.
- :func:`view` — a displayable region: ``around=node, depth=k`` or ``stream=s`` (plus the
  cross-stream neighbours of that stream). Every drawing is capped at ``max_nodes`` (250)
  and says what it left out.
- :func:`summary_table` — per stream: nodes, cross-stream in/out, records, waits, hazards.
- :func:`draw` / :func:`render_svg` — a picture: Graphviz ``dot`` when the binary is on PATH,
  else a matplotlib swimlane layout (``engine="matplotlib"`` forces it).
- :func:`to_json` / :func:`from_json` — a lossless round trip of the snapshot.
"""

from __future__ import annotations

import html
import io
import json
import operator
import re
import shutil
import subprocess
import tempfile
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

MAX_NODES = 250
"""Default cap on the nodes one drawing shows (a bigger graph gets a region and a note)."""

MAX_HAZARD_EDGES = 60
"""Hazard edges without a data edge under them drawn per picture (the nodes stay red)."""
MAX_LABELLED_HAZARDS = 40
DOT_TIMEOUT_S = 30.0
JSON_FORMAT = "streampass.dag/1"

# colours: lane fills per stream (0 = ambient, grey), edge kinds, hazards
_LANE_FILLS = ["#f3f3f3", "#e8f1fb", "#eaf6ea", "#fbf0e4", "#f3eafa", "#e6f5f5", "#fbeaf0", "#f5f5e0"]
_LANE_EDGES = ["#9a9a9a", "#5b8fd0", "#5aa55a", "#d08a3c", "#9a6fc4", "#3fa0a0", "#c9607f", "#a0a040"]
_DATA = "#555555"
_CROSS = "#1f6fd0"
_SYNC = "#8a3ab9"
_HAZARD = "#d62728"
_HAZARD_FILL = "#fde0e0"
_RECORD_FILL = "#dff3df"
_WAIT_FILL = "#ffe9c7"


# ----------------------------------------------------------------------------------------
# the snapshot
# ----------------------------------------------------------------------------------------
@dataclass
class StreamDAGData:
    """A plain, JSON-able snapshot of a stream DAG; what :func:`from_json` returns.

    ``nodes``: one dict per node in issue order, keys ``name``, ``stream``, ``target``, ``op``,
    ``index`` (graph position), ``role`` (``input``, ``output``, ``compute``, ``sync``,
    ``alias`` = a ``control_deps`` passthrough getitem, ``subgraph`` = a ``control_deps`` body,
    ``other``), ``sync`` (the stream op's name or None), ``sync_args`` and ``alias_of``.
    ``edges``: dicts ``src``, ``dst``, ``kind``, ``kinds`` (as on ``StreamDAG.nx``).
    ``streams``: stream indices, ambient (0) first. ``hazards``: :class:`streampass.Hazard`.

    It has the same views as a live DAG (``to_dot``, ``view``, ``draw``, ``_repr_html_``) and
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

    def to_json(self) -> str:
        """See :func:`to_json`."""
        return to_json(self)

    def to_dot(self, **kwargs) -> str:
        """See :func:`to_dot`."""
        return to_dot(self, **kwargs)

    def view(self, around=None, depth: int = 2, stream: int | None = None, **kwargs) -> DAGView:
        """See :func:`view`."""
        return view(self, around=around, depth=depth, stream=stream, **kwargs)

    def draw(self, path, **kwargs) -> Path:
        """See :func:`draw`."""
        return draw(self, path, **kwargs)

    def summary(self) -> list[dict[str, int]]:
        """See :func:`summary`."""
        return summary(self)

    def _repr_html_(self) -> str:
        return repr_html(self)

    def __repr__(self) -> str:
        return (
            f"StreamDAGData({len(self.nodes)} nodes, {len(self.edges)} edges, streams {self.streams}, "
            f"{len(self.hazards)} hazard(s))"
        )


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
    if isinstance(dag, DAGView):
        return dag.data
    from streampass.analysis.dag import StreamDAG

    if not isinstance(dag, StreamDAG):
        dag = StreamDAG.from_graph(dag)
    cached = getattr(dag, "_view_data", None)
    if cached is not None:
        return cached
    from streampass import ops

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
        for u, v, d in sorted(g.edges(data=True), key=lambda e: (g.nodes[e[1]]["index"], g.nodes[e[0]]["index"]))
    ]
    out = StreamDAGData(nodes, edges, list(dag.streams), list(dag.hazards()))
    try:
        dag._view_data = out  # a StreamDAG never changes once built
    except AttributeError:  # pragma: no cover - slots or frozen objects
        pass
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


# ----------------------------------------------------------------------------------------
# JSON
# ----------------------------------------------------------------------------------------
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
    from streampass.analysis.verify import Hazard

    obj = json.loads(text)
    fmt = obj.get("format")
    if fmt != JSON_FORMAT:
        raise ValueError(f"not a streampass DAG JSON document (format {fmt!r}, expected {JSON_FORMAT!r})")
    hazards = [Hazard(h["kind"], tuple(h["nodes"]), h["message"]) for h in obj["hazards"]]
    return StreamDAGData(obj["nodes"], obj["edges"], list(obj["streams"]), hazards)


# ----------------------------------------------------------------------------------------
# summary
# ----------------------------------------------------------------------------------------
_WAIT_OPS = {"wait_event", "wait_stream", "sync_dealloc"}
_RECORD_OPS = {"record_event"}


def summary(dag) -> list[dict[str, int]]:
    """One row per stream: nodes, compute nodes, cross-stream data in/out, records, waits, hazards.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> summary(gm)[1]
    {'stream': 1, 'nodes': 1, 'compute': 1, 'cross_in': 1, 'cross_out': 1, 'records': 0, 'waits': 0, 'hazards': 1}
    """
    d = data(dag)
    rows = {
        s: {"stream": s, "nodes": 0, "compute": 0, "cross_in": 0, "cross_out": 0, "records": 0, "waits": 0, "hazards": 0}
        for s in d.streams
    }
    for n in d.nodes:
        r = rows[n["stream"]]
        r["nodes"] += 1
        r["compute"] += n["role"] == "compute"
        r["records"] += n["sync"] in _RECORD_OPS
        r["waits"] += n["sync"] in _WAIT_OPS
    for u, v in d.cross_stream_edges():
        rows[d.stream_of(u)]["cross_out"] += 1
        rows[d.stream_of(v)]["cross_in"] += 1
    for h in d.hazards:
        rows[d.stream_of(h.nodes[-1])]["hazards"] += 1
    return [rows[s] for s in d.streams]


_SUMMARY_COLS = [
    ("stream", "stream"),
    ("nodes", "nodes"),
    ("compute", "compute"),
    ("cross_in", "cross-stream in"),
    ("cross_out", "cross-stream out"),
    ("records", "records"),
    ("waits", "waits"),
    ("hazards", "hazards"),
]


def summary_text(dag) -> str:
    """The per-stream summary (:func:`summary`) as an aligned plain-text table.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> print(summary_text(gm))
         stream  nodes  compute  cross-stream in  cross-stream out  records  waits  hazards
    0 (ambient)      4        2                1                 1        0      0        3
              1      1        1                1                 1        0      0        1
    """
    rows = summary(dag)
    head = [h for _, h in _SUMMARY_COLS]
    cells = [[str(r[k]) + (" (ambient)" if k == "stream" and r[k] == 0 else "") for k, _ in _SUMMARY_COLS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    fmt = "  ".join("{:>%d}" % w for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*c) for c in cells])


def summary_table(dag) -> str:
    """The per-stream summary as an HTML table.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> html_ = summary_table(gm)
    >>> html_.startswith('<table class="sp-table">'), html_.count("<tr>")  # header + 2 streams
    (True, 3)
    >>> "<td>0 (ambient)</td>" in html_, '<td class="sp-bad">3</td>' in html_
    (True, True)
    """
    rows = summary(dag)
    out = ['<table class="sp-table"><thead><tr>']
    out += [f"<th>{html.escape(h)}</th>" for _, h in _SUMMARY_COLS]
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>")
        for k, _ in _SUMMARY_COLS:
            v = r[k]
            text = f"{v} (ambient)" if k == "stream" and v == 0 else str(v)
            cls = ' class="sp-bad"' if k == "hazards" and v else ""
            out.append(f"<td{cls}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def hazard_table(hazards, limit: int = 50) -> str:
    """Hazards as an HTML table (kind, nodes, message).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> hazards = sp.verify(gm).hazards
    >>> table = hazard_table(hazards)
    >>> table.count('<td class="sp-bad">'), "<code>sin → add</code>" in table
    (4, True)
    >>> hazard_table(hazards, limit=1).endswith("<p>… 3 more</p>")
    True
    >>> hazard_table([])
    '<p class="sp-ok">no hazards</p>'
    """
    hazards = list(hazards)
    if not hazards:
        return '<p class="sp-ok">no hazards</p>'
    out = ['<table class="sp-table sp-hazards"><thead><tr><th>kind</th><th>nodes</th><th>what can go wrong</th></tr></thead><tbody>']
    for h in hazards[:limit]:
        out.append(
            f'<tr><td class="sp-bad">{html.escape(h.kind)}</td><td><code>{html.escape(" → ".join(h.nodes))}</code></td>'
            f"<td>{html.escape(h.message)}</td></tr>"
        )
    out.append("</tbody></table>")
    if len(hazards) > limit:
        out.append(f"<p>… {len(hazards) - limit} more</p>")
    return "".join(out)


# ----------------------------------------------------------------------------------------
# choosing what to draw
# ----------------------------------------------------------------------------------------
@dataclass
class _Drawn:
    """What one drawing shows, after collapsing plumbing and choosing a region."""

    nodes: list[dict]  # in issue order
    edges: list[dict]  # src, dst, kinds (drawn nodes only)
    context: set[str]  # drawn for context only (outside the chosen stream), shown faded
    hazards_by_node: dict[str, list]
    hazard_edges: list  # (src, dst, hazard)
    left_out: int
    left_out_by_stream: dict[int, int]
    total: int
    note: str


def _collapsed(d: StreamDAGData, collapse: bool) -> tuple[list[dict], list[dict], dict[str, str]]:
    """Nodes and edges with ``control_deps`` plumbing folded away (aliases into their wrapper)."""
    if not collapse:
        return list(d.nodes), [dict(e) for e in d.edges], {}
    rename: dict[str, str | None] = {}
    for n in d.nodes:
        if n["role"] == "subgraph":
            rename[n["name"]] = None
        elif n["role"] == "alias" and n["alias_of"]:
            rename[n["name"]] = n["alias_of"]
    nodes = [n for n in d.nodes if n["name"] not in rename]
    merged: dict[tuple[str, str], list[str]] = {}
    for e in d.edges:
        u, v = rename.get(e["src"], e["src"]), rename.get(e["dst"], e["dst"])
        if u is None or v is None or u == v:
            continue
        kinds = merged.setdefault((u, v), [])
        for k in e["kinds"]:
            if k not in kinds:
                kinds.append(k)
    edges = [{"src": u, "dst": v, "kinds": k} for (u, v), k in merged.items()]
    return nodes, edges, {k: v for k, v in rename.items() if v is not None}


def _select(
    d: StreamDAGData,
    around=None,
    depth: int = 2,
    stream: int | None = None,
    nodes=None,
    max_nodes: int = MAX_NODES,
    collapse: bool = True,
) -> _Drawn:
    all_nodes, all_edges, alias = _collapsed(d, collapse)
    by_name = {n["name"]: n for n in all_nodes}
    adj: dict[str, set[str]] = {n: set() for n in by_name}
    for e in all_edges:
        if "data" in e["kinds"] or "sync" in e["kinds"]:
            adj[e["src"]].add(e["dst"])
            adj[e["dst"]].add(e["src"])

    priority: list[str] | None = None  # names in the order to keep them when over the cap
    chosen: set[str] | None = None
    context: set[str] = set()
    parts = []
    if nodes is not None:
        names = [alias.get(_name(x), _name(x)) for x in nodes]
        for x in names:
            if x not in by_name:
                raise KeyError(f"no node named {x!r} in this DAG")
        chosen = set(names)
        priority = names
        parts.append(f"{len(chosen)} chosen node(s)")
    if around is not None:
        root = alias.get(_name(around), _name(around))
        if root not in by_name:
            raise KeyError(f"no node named {root!r} in this DAG")
        dist = {root: 0}
        q = deque([root])
        while q:
            x = q.popleft()
            if dist[x] >= depth:
                continue
            for y in sorted(adj[x], key=lambda y: by_name[y]["index"]):
                if y not in dist:
                    dist[y] = dist[x] + 1
                    q.append(y)
        region = set(dist)
        chosen = region if chosen is None else chosen & region
        priority = sorted(chosen, key=lambda x: (dist.get(x, 0), by_name[x]["index"]))
        parts.append(f"within {depth} dependency step(s) of {root}")
    if stream is not None:
        if stream not in d.streams:
            raise KeyError(f"no stream {stream} in this DAG (streams: {d.streams})")
        on = {n for n, a in by_name.items() if a["stream"] == stream}
        chosen = on if chosen is None else chosen & on
        for x in list(chosen):
            context |= {y for y in adj[x] if by_name[y]["stream"] != stream}
        parts.append(f"stream {stream} and its cross-stream neighbours")
    if chosen is None:
        chosen = set(by_name)

    hazards_by_node: dict[str, list] = {}
    for h in d.hazards:
        for x in dict.fromkeys(alias.get(x, x) for x in h.nodes):
            hazards_by_node.setdefault(x, []).append(h)

    want = chosen | context
    total = len(want)
    if len(want) > max_nodes:
        if priority is None:
            # whole graph or one stream: keep hazards, syncs and cross-stream ends first, then issue order
            cross = {x for e in all_edges for x in (e["src"], e["dst"]) if by_name[e["src"]]["stream"] != by_name[e["dst"]]["stream"]}

            def rank(x):
                a = by_name[x]
                interesting = x in hazards_by_node or a["role"] == "sync" or x in cross
                return (x in context, not interesting, a["index"])

            priority = sorted(want, key=rank)
        else:
            priority = [x for x in priority if x in want] + sorted(context - set(priority), key=lambda x: by_name[x]["index"])
        want = set(priority[:max_nodes])
    drawn = [n for n in all_nodes if n["name"] in want]
    left = [n for n in all_nodes if n["name"] in (chosen | context) and n["name"] not in want]
    left_by_stream = dict(sorted(Counter(n["stream"] for n in left).items()))
    edges = [e for e in all_edges if e["src"] in want and e["dst"] in want and ("data" in e["kinds"] or "sync" in e["kinds"])]
    hazard_edges = []
    for h in d.hazards:
        ends = [alias.get(x, x) for x in h.nodes]
        if len(ends) >= 2 and ends[0] in want and ends[-1] in want and ends[0] != ends[-1]:
            hazard_edges.append((ends[0], ends[-1], h))

    note = "whole graph" if not parts else "; ".join(parts)
    folded = len(d.nodes) - len(by_name)
    note = f"{len(drawn)} of {len(d.nodes)} node(s) drawn ({note}"
    note += f"; {folded} control_deps subgraph and passthrough node(s) folded into their syncs)" if folded else ")"
    if left:
        where = ", ".join(f"stream {s}: {k}" for s, k in left_by_stream.items())
        note += (
            f"; {len(left)} left out to stay readable ({where}) — narrow the region with "
            f"view(around=NODE, depth=K) or view(stream=S), or raise max_nodes"
        )
    return _Drawn(
        drawn, edges, context & want, hazards_by_node, hazard_edges, len(left), left_by_stream, total, note
    )


def _name(x) -> str:
    return x if isinstance(x, str) else getattr(x, "name", str(x))


def _short_target(n: dict) -> str:
    t = n["target"]
    if n["role"] == "sync":
        args = n.get("sync_args") or []
        if n["sync"] in ("record_event", "wait_event") and args:
            return f"{n['sync']} e{args[0]}"
        if n["sync"] == "wait_stream" and len(args) > 1:
            return f"wait_stream s{args[1]}"
        return n["sync"]
    if n["role"] in ("input", "output"):
        return n["role"]
    return t.split("::", 1)[-1]


def _tooltip(n: dict, hazards: list) -> str:
    lines = [f"{n['name']}: {n['target']} on stream {n['stream']} (#{n['index']} in issue order)"]
    lines += [f"[{h.kind}] {h.message}" for h in hazards]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# DOT (pydot)
# ----------------------------------------------------------------------------------------
def to_pydot(dag, around=None, depth: int = 2, stream: int | None = None, nodes=None, max_nodes: int = MAX_NODES, collapse: bool = True, title: str | None = None):
    """A ``pydot.Dot`` of the DAG (or a region): see :func:`to_dot`."""
    d = data(dag)
    return _pydot(d, _select(d, around, depth, stream, nodes, max_nodes, collapse), title)


def to_dot(dag, **kwargs) -> str:
    """Graphviz DOT source: a cluster (lane) per stream, nodes chained in issue order.

    Data edges are grey, cross-stream data edges blue and bold, record -> wait (``sync``)
    edges dashed purple; nodes and edges of a hazard are red with the hazard's message as
    tooltip. Takes the region arguments of :func:`view` (``around``, ``depth``, ``stream``,
    ``nodes``, ``max_nodes``, ``collapse``).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> dot = to_dot(gm)
    >>> dot.startswith("digraph streampass {"), "subgraph cluster_stream_1 {" in dot
    (True, True)
    >>> 'id="sp-sin"' in dot, 'label="raw, dealloc"' in dot  # the node sin, a red hazard edge
    (True, True)
    >>> 'label="3 of 5 node(s) drawn (stream 1 and its cross-stream neighbours)"' in to_dot(gm, stream=1)
    True
    """
    return to_pydot(dag, **kwargs).to_string()


def _pydot(d: StreamDAGData, sel: _Drawn, title: str | None):
    import pydot

    g = pydot.Dot(
        "streampass",
        graph_type="digraph",
        rankdir="LR",
        newrank="true",
        nodesep="0.15",
        ranksep="0.3",
        fontname="Helvetica",
        fontsize="11",
        label=_dot_str(title or sel.note),
        labelloc="t",
        labeljust="l",
        tooltip=_dot_str(sel.note),
    )
    g.set_node_defaults(shape="box", style="rounded,filled", fillcolor="white", fontname="Helvetica", fontsize="10", height="0.3")
    g.set_edge_defaults(arrowsize="0.6", color=_DATA)
    ids = {n["name"]: f"n{n['index']}" for n in sel.nodes}
    lanes = {s: [] for s in d.streams}
    for n in sel.nodes:
        lanes[n["stream"]].append(n)
    for s in d.streams:
        if not lanes[s]:
            continue
        c = pydot.Cluster(
            f"stream_{s}",
            label=_dot_str(f"stream {s}" + (" (ambient)" if s == 0 else "")),
            style="filled,rounded",
            fillcolor=_LANE_FILLS[s % len(_LANE_FILLS)],
            color=_LANE_EDGES[s % len(_LANE_EDGES)],
            fontname="Helvetica",
            fontsize="11",
            labeljust="l",
        )
        for n in lanes[s]:
            hz = sel.hazards_by_node.get(n["name"], [])
            attrs = {
                "label": _dot_str(f"{n['name']}\n{_short_target(n)}"),
                "tooltip": _dot_str(_tooltip(n, hz)),
                "id": _dot_str(f"sp-{n['name']}"),
            }
            if n["role"] == "sync":
                attrs["fillcolor"] = _RECORD_FILL if n["sync"] in _RECORD_OPS else _WAIT_FILL
                attrs["shape"] = "cds" if n["sync"] in _RECORD_OPS else "box"
            elif n["role"] in ("input", "output"):
                attrs["shape"] = "ellipse"
                attrs["style"] = "filled"
            if hz:
                attrs["color"] = _HAZARD
                attrs["penwidth"] = "2"
                attrs["fontcolor"] = _HAZARD
                attrs["fillcolor"] = _HAZARD_FILL
            if n["name"] in sel.context:
                attrs["style"] = "rounded,filled,dashed"
                attrs["fillcolor"] = "#ffffff"
                attrs["fontcolor"] = attrs.get("fontcolor", "#777777")
            c.add_node(pydot.Node(ids[n["name"]], **attrs))
        # issue order: an invisible, heavy chain keeps each lane left to right
        chain = [n for n in lanes[s] if n["role"] != "input"]
        for a, b in zip(chain, chain[1:]):
            c.add_edge(pydot.Edge(ids[a["name"]], ids[b["name"]], style="invis", weight="20"))
        g.add_subgraph(c)

    haz_pairs = _hazard_pairs(sel)
    labels = len(haz_pairs) <= MAX_LABELLED_HAZARDS  # edge labels cost dot a virtual node each
    by_name = {n["name"]: n for n in sel.nodes}
    for e in sel.edges:
        u, v = e["src"], e["dst"]
        cross = by_name[u]["stream"] != by_name[v]["stream"]
        attrs: dict[str, str] = {"tooltip": _dot_str(f"{u} -> {v}: {', '.join(e['kinds'])}")}
        if "sync" in e["kinds"]:
            attrs.update(color=_SYNC, style="dashed", penwidth="1.6", label="sync", fontcolor=_SYNC, fontsize="8")
        elif cross:
            attrs.update(color=_CROSS, penwidth="1.8")
        if cross:
            attrs["constraint"] = "true"
        hs = haz_pairs.pop((u, v), None)
        if hs:
            attrs.update(color=_HAZARD, fontcolor=_HAZARD, penwidth="2", fontsize="8", tooltip=_dot_str(_messages(hs)))
            attrs.pop("label", None)
            if labels:
                attrs["label"] = _dot_str(_kinds(hs))
        g.add_edge(pydot.Edge(ids[u], ids[v], **attrs))
    # hazards between nodes with no drawn edge (exit, war, ...); past a cap only the red nodes
    # (whose tooltips list every message) show them: each extra edge slows dot's layout down
    for (u, v), hs in list(haz_pairs.items())[:MAX_HAZARD_EDGES]:
        extra = {"label": _dot_str(_kinds(hs))} if labels else {}
        g.add_edge(
            pydot.Edge(
                ids[u],
                ids[v],
                color=_HAZARD,
                fontcolor=_HAZARD,
                style="dotted",
                penwidth="2",
                constraint="false",
                fontsize="8",
                tooltip=_dot_str(_messages(hs)),
                **extra,
            )
        )
    return g


def _hazard_pairs(sel: _Drawn) -> dict[tuple[str, str], list]:
    out: dict[tuple[str, str], list] = {}
    for u, v, h in sel.hazard_edges:
        out.setdefault((u, v), []).append(h)
    return out


def _kinds(hs) -> str:
    return ", ".join(dict.fromkeys(h.kind for h in hs))


def _messages(hs) -> str:
    return "\n".join(f"[{h.kind}] {h.message}" for h in hs)


def _dot_str(s: str) -> str:
    """A DOT double-quoted string (pydot does not quote attribute values that need it)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# ----------------------------------------------------------------------------------------
# rendering
# ----------------------------------------------------------------------------------------
def have_dot() -> bool:
    """Whether the Graphviz ``dot`` binary is on PATH."""
    return shutil.which("dot") is not None


def _engine(engine: str) -> str:
    if engine not in ("auto", "dot", "matplotlib"):
        raise ValueError(f"engine must be 'auto', 'dot' or 'matplotlib', got {engine!r}")
    if engine == "auto":
        return "dot" if have_dot() else "matplotlib"
    if engine == "dot" and not have_dot():
        raise RuntimeError("engine='dot' needs the Graphviz `dot` binary on PATH (apt-get install graphviz)")
    return engine


def _run_dot(src: str, fmt: str, program: tuple[str, ...] = ("dot",)) -> bytes:
    exe = shutil.which(program[0]) or program[0]
    proc = subprocess.run([exe, *program[1:], f"-T{fmt}"], input=src.encode(), capture_output=True, timeout=DOT_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{program[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


LANE_GAP = 10.0  # points between two lanes moved into stream order
REROUTE_NODES = 80  # drawings up to this many nodes get their cross-lane edges routed again


def _lanes_in_stream_order(g, fmt: str) -> bytes:
    """Render ``g`` (from :func:`_pydot`) with its lanes top to bottom in stream order.

    dot's crossing minimisation puts clusters in whatever vertical order has fewest crossings
    (stream 2, 0, 1 for the demo), and no attribute pins it: ``rank=same`` anchors and a small
    ``mclimit`` held on 2 or 3 of 24 random graphs. So one dot run writes both its layout
    (``-Tjson``) and its picture; a layout already in order is that picture. Otherwise each lane
    moves as a whole, its inside untouched, into the stack the stream order gives, and
    ``neato -n2`` draws the graph at those positions (edges as below).
    """
    with tempfile.TemporaryDirectory() as tmp:  # one dot run: the layout to a file, the picture out
        laid_out = Path(tmp) / "layout.json"
        picture = _run_dot(g.to_string(), fmt, ("dot", "-Tjson", "-o", str(laid_out)))
        layout = json.loads(laid_out.read_text())
    objects = layout.get("objects", [])
    lanes = [o for o in objects if str(o.get("name", "")).startswith("cluster_stream_") and "bb" in o]

    def box(o) -> list[float]:
        return [float(v) for v in o["bb"].split(",")]

    ordered = sorted(lanes, key=lambda o: int(o["name"].rsplit("_", 1)[1]))
    if [o["name"] for o in sorted(lanes, key=lambda o: -box(o)[3])] == [o["name"] for o in ordered]:
        return picture
    top = max(box(o)[3] for o in lanes)
    shift: dict[str, float] = {}
    for o in ordered:
        x0, y0, x1, y1 = box(o)
        shift[o["name"]] = top - y1
        top -= (y1 - y0) + LANE_GAP
    gx0, gy0, gx1, gy1 = [float(v) for v in layout["bb"].split(",")]
    bottom = top + LANE_GAP - (min(box(o)[1] for o in lanes) - gy0)  # keep the margin below
    lift = gy0 - bottom  # everything moves up so that nothing is drawn below y = gy0
    pos = {o["name"]: [float(v) for v in o["pos"].split(",")] for o in objects if "pos" in o}
    lane_of = {objects[i]["name"]: o["name"] for o in lanes for i in o.get("nodes", [])}
    # dot's edge splines move with their lanes: one inside a lane as it is. One between two lanes
    # is routed again by neato in a small drawing, and in a large one bent from its tail's move to
    # its head's (neato routing took 13 s where dot took 2 s on 120 nodes). Two edges between the
    # same nodes may swap splines: both join those nodes.
    reroute = len(pos) <= REROUTE_NODES  # small drawings: neato routes the edges between lanes
    splines: dict[tuple[str, str], list] = {}
    for e in layout.get("edges", []):
        u, v = objects[e["tail"]]["name"], objects[e["head"]]["name"]
        if u in lane_of and v in lane_of and "pos" in e and not (reroute and lane_of[u] != lane_of[v]):
            splines.setdefault((u, v), []).append(e)
    for e in g.get_edges() + [e for c in g.get_subgraphs() for e in c.get_edges()]:
        u, v = e.get_source().strip('"'), e.get_destination().strip('"')
        found = splines.get((u, v))
        if not found:
            continue
        laid = found.pop(0)
        du, dv = shift[lane_of[u]] + lift, shift[lane_of[v]] + lift
        e.set("pos", '"' + _moved(laid["pos"], du, dv) + '"')
        if "lp" in laid:
            e.set("lp", '"' + _moved(laid["lp"], (du + dv) / 2) + '"')
    for c in g.get_subgraphs():
        name = c.get_name().strip('"')
        if name not in shift:
            continue
        o = next(o for o in lanes if o["name"] == name)
        dy = shift[name] + lift
        x0, y0, x1, y1 = box(o)
        c.set("bb", f'"{x0},{y0 + dy},{x1},{y1 + dy}"')
        if "lp" in o:
            lx, ly = (float(v) for v in o["lp"].split(","))
            c.set("lp", f'"{lx},{ly + dy}"')
        for n in c.get_nodes():
            x, y = pos[n.get_name().strip('"')]
            n.set("pos", f'"{x},{y + dy}"')
    g.set("bb", f'"{gx0},{gy0},{gx1},{gy1 + lift}"')
    if "lp" in layout:
        lx, ly = (float(v) for v in layout["lp"].split(","))
        g.set("lp", f'"{lx},{ly + lift}"')
    g.set("splines", "true")  # for an edge dot drew no spline for (none expected)
    return _run_dot(g.to_string(), fmt, ("neato", "-n2"))


def _moved(points: str, d0: float, d1: float | None = None) -> str:
    """A Graphviz point list (an edge's ``"e,x,y s,x,y x,y ..."``, or a label's ``"x,y"``) moved
    up by ``d0`` at its start and ``d1`` (default ``d0``) at its end, linearly in between; the
    ``s``/``e`` arrow points move with the start/end."""
    d1 = d0 if d1 is None else d1
    plain = [p for p in points.split() if p[:2] not in ("s,", "e,")]
    out, k = [], 0
    for p in points.split():
        parts = p.split(",")
        head, (x, y) = parts[:-2], parts[-2:]
        if head == ["s"]:
            dy = d0
        elif head == ["e"]:
            dy = d1
        else:
            dy = d0 + (d1 - d0) * (k / max(1, len(plain) - 1))
            k += 1
        out.append(",".join([*head, x, f"{float(y) + dy:.2f}"]))
    return " ".join(out)


def _render(d: StreamDAGData, sel: _Drawn, fmt: str, engine: str, title: str | None = None) -> bytes:
    eng = _engine(engine)
    if eng == "dot":
        try:
            return _lanes_in_stream_order(_pydot(d, sel, title), fmt)
        except (subprocess.TimeoutExpired, RuntimeError, OSError):
            if engine == "dot":
                raise
    return _matplotlib(d, sel, fmt, title)


def render_svg(dag, engine: str = "auto", title: str | None = None, **region) -> str:
    """The DAG (or a region, see :func:`view`) as an SVG document string.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> svg = render_svg(gm, around="sin", depth=1)
    >>> "<svg" in svg, "sin" in svg, "cos" in svg  # cos is two steps from sin: left out
    (True, True, False)
    """
    d = data(dag)
    return _render(d, _select(d, **region), "svg", engine, title).decode()


def draw(dag, path, engine: str = "auto", title: str | None = None, **region) -> Path:
    """Write a picture of the DAG (or a region) to ``path``; the format comes from the suffix.

    ``.svg``, ``.png`` (and ``.pdf``) are supported. ``engine``: ``"auto"`` uses Graphviz
    ``dot`` when the binary is installed and a matplotlib swimlane layout otherwise;
    ``"dot"`` or ``"matplotlib"`` force one. Returns the path written.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> import os, shutil, tempfile
    >>> tmp = tempfile.mkdtemp()
    >>> path = draw(gm, os.path.join(tmp, "dag.svg"))
    >>> path.name, path.stat().st_size > 0, "<svg" in path.read_text()
    ('dag.svg', True, True)
    >>> draw(gm, os.path.join(tmp, "dag.txt"))
    Traceback (most recent call last):
    ...
    ValueError: draw() writes .svg, .png or .pdf, not 'dag.txt'
    >>> shutil.rmtree(tmp)
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(f"draw() writes .svg, .png or .pdf, not {path.name!r}")
    d = data(dag)
    path.write_bytes(_render(d, _select(d, **region), fmt, engine, title))
    return path


def _layout(sel: _Drawn) -> tuple[dict[str, tuple[float, int]], dict[int, int]]:
    """Swimlane positions: column = earliest slot after the node's lane predecessor and its
    drawn dependencies (an ASAP layering in issue order); an input sits just before its first
    consumer; row = stack within a lane cell."""
    col: dict[str, int] = {}
    preds: dict[str, list[str]] = {}
    succs: dict[str, list[str]] = {}
    for e in sel.edges:
        preds.setdefault(e["dst"], []).append(e["src"])
        succs.setdefault(e["src"], []).append(e["dst"])
    last: dict[int, int] = {}
    for n in sel.nodes:
        name, s = n["name"], n["stream"]
        if n["role"] == "input":
            continue
        c = max([last.get(s, 0) + 1] + [col[p] + 1 for p in preds.get(name, []) if p in col])
        last[s] = col[name] = c
    for n in sel.nodes:
        if n["role"] == "input":
            used = [col[x] for x in succs.get(n["name"], []) if x in col]
            col[n["name"]] = max(0, min(used) - 1) if used else 0
    cell: Counter = Counter()
    row: dict[str, int] = {}
    for n in sorted(sel.nodes, key=lambda n: n["role"] == "input"):  # work first, inputs under it
        key = (n["stream"], col[n["name"]])
        row[n["name"]] = cell[key]
        cell[key] += 1
    height: dict[int, int] = {}
    for (s, _c), k in cell.items():
        height[s] = max(height.get(s, 1), k)
    return {n: (col[n], row[n]) for n in col}, height


def _matplotlib(d: StreamDAGData, sel: _Drawn, fmt: str, title: str | None) -> bytes:
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    import matplotlib

    pos, height = _layout(sel)
    lanes = [s for s in d.streams if any(n["stream"] == s for n in sel.nodes)] or list(d.streams)
    lane_top: dict[int, float] = {}
    y = 0.0
    for s in lanes:
        lane_top[s] = y
        y += height.get(s, 1) + 0.75
    total_h = max(y, 1.0)
    ncol = max([c for c, _ in pos.values()] + [0]) + 1
    dx, box_w, box_h = 1.6, 1.35, 0.62
    xy = {}
    for n in sel.nodes:
        c, r = pos[n["name"]]
        xy[n["name"]] = (0.9 + c * dx, lane_top[n["stream"]] + 0.75 + r)

    width_in = min(max(4.0, 1.0 + ncol * dx * 0.75), 180.0)
    height_in = min(max(1.6, 0.9 + total_h * 0.55), 60.0)
    dpi = max(30, min(110, int(12000 / width_in)))
    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "DejaVu Sans", "svg.hashsalt": "streampass"}):
        fig = Figure(figsize=(width_in, height_in), dpi=dpi)
        ax = fig.add_axes([0.005, 0.005, 0.99, 0.94 if total_h > 2 else 0.88])
        ax.set_xlim(-0.1, 0.9 + ncol * dx)
        ax.set_ylim(total_h, -0.1)
        ax.axis("off")
        fig.suptitle(title or sel.note, x=0.005, ha="left", fontsize=9)
        gids: dict[str, str] = {}
        for s in lanes:
            top, h = lane_top[s], height.get(s, 1) + 0.65
            ax.add_patch(
                FancyBboxPatch(
                    (-0.05, top + 0.05),
                    0.9 + ncol * dx,
                    h - 0.05,
                    boxstyle="round,pad=0,rounding_size=0.1",
                    fc=_LANE_FILLS[s % len(_LANE_FILLS)],
                    ec=_LANE_EDGES[s % len(_LANE_EDGES)],
                    lw=1,
                    zorder=0,
                )
            )
            ax.text(0.0, top + 0.22, f"stream {s}" + (" (ambient)" if s == 0 else ""), fontsize=8, va="center", color="#333333", zorder=1)
        by_name = {n["name"]: n for n in sel.nodes}
        haz_pairs = _hazard_pairs(sel)
        k = 0
        for e in sel.edges + [{"src": u, "dst": v, "kinds": ["hazard"]} for (u, v) in haz_pairs if not any(x["src"] == u and x["dst"] == v for x in sel.edges)]:
            u, v = e["src"], e["dst"]
            cross = by_name[u]["stream"] != by_name[v]["stream"]
            color, ls, lw = _DATA, "-", 0.8
            if "sync" in e["kinds"]:
                color, ls, lw = _SYNC, "--", 1.4
            elif cross:
                color, lw = _CROSS, 1.4
            hs = haz_pairs.get((u, v))
            if hs:
                color, lw = _HAZARD, 1.8
                if e["kinds"] == ["hazard"]:
                    ls = ":"
            (x0, y0), (x1, y1) = xy[u], xy[v]
            dist = max(abs(x1 - x0), 1e-6)
            rad = 0.0 if y0 == y1 and dist <= dx * 1.01 else (min(0.3, 0.5 / dist) if y0 == y1 else 0.06)
            arrow = FancyArrowPatch(
                (x0 + box_w / 2, y0),
                (x1 - box_w / 2, y1),
                arrowstyle="-|>",
                mutation_scale=7,
                color=color,
                lw=lw,
                ls=ls,
                connectionstyle=f"arc3,rad={rad}",
                zorder=2,
            )
            if hs:
                gid = f"sp-tip-{k}"
                k += 1
                arrow.set_gid(gid)
                gids[gid] = _messages(hs)
            ax.add_patch(arrow)
        for n in sel.nodes:
            x, yy = xy[n["name"]]
            hz = sel.hazards_by_node.get(n["name"], [])
            fc, ec, tc, lw = "white", "#666666", "#111111", 0.8
            if n["role"] == "sync":
                fc = _RECORD_FILL if n["sync"] in _RECORD_OPS else _WAIT_FILL
            elif n["role"] in ("input", "output"):
                fc = "#f7f7f7"
            if hz:
                fc, ec, tc, lw = _HAZARD_FILL, _HAZARD, _HAZARD, 1.8
            if n["name"] in sel.context:
                ec, tc = "#aaaaaa", "#888888"
            box = FancyBboxPatch(
                (x - box_w / 2, yy - box_h / 2),
                box_w,
                box_h,
                boxstyle="round,pad=0,rounding_size=0.12",
                fc=fc,
                ec=ec,
                lw=lw,
                ls="--" if n["name"] in sel.context else "-",
                zorder=3,
            )
            gid = f"sp-tip-{k}"
            k += 1
            box.set_gid(gid)
            gids[gid] = _tooltip(n, hz)
            ax.add_patch(box)
            ax.text(x, yy - 0.1, n["name"], ha="center", va="center", fontsize=6.5, color=tc, zorder=4, clip_on=True)
            ax.text(x, yy + 0.15, _short_target(n)[:22], ha="center", va="center", fontsize=5.5, color="#555555", zorder=4)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=dpi, facecolor="white")
    out = buf.getvalue()
    if fmt == "svg":
        text = out.decode()
        for gid, tip in gids.items():
            text = text.replace(f'<g id="{gid}">', f'<g id="{gid}"><title>{html.escape(tip, quote=False)}</title>', 1)
        out = text.encode()
    return out


# ----------------------------------------------------------------------------------------
# displayable views
# ----------------------------------------------------------------------------------------
class DAGView:
    """A region of a DAG, ready to display: ``_repr_html_`` (note + SVG), ``_repr_svg_``,
    ``to_dot()``, ``draw(path)``; ``.nodes`` lists the names drawn, ``.left_out`` how many
    nodes of the region did not fit under ``max_nodes``."""

    def __init__(self, dag, around=None, depth: int = 2, stream: int | None = None, nodes=None, max_nodes: int = MAX_NODES, collapse: bool = True, engine: str = "auto", title: str | None = None):
        self.data = data(dag)
        self.region = dict(around=around, depth=depth, stream=stream, nodes=nodes, max_nodes=max_nodes, collapse=collapse)
        self.engine = engine
        self.title = title
        self._sel = _select(self.data, **self.region)
        self._svg: str | None = None

    @property
    def nodes(self) -> list[str]:
        """Names of the nodes drawn, in issue order."""
        return [n["name"] for n in self._sel.nodes]

    @property
    def left_out(self) -> int:
        """How many nodes of the region did not fit under ``max_nodes``."""
        return self._sel.left_out

    @property
    def note(self) -> str:
        """One line saying what was drawn and what was left out."""
        return self._sel.note

    def to_dot(self) -> str:
        """The region's Graphviz DOT source (see :func:`to_dot`)."""
        return _pydot(self.data, self._sel, self.title).to_string()

    def svg(self) -> str:
        """The region as an SVG document string (rendered once, then cached)."""
        if self._svg is None:
            self._svg = _render(self.data, self._sel, "svg", self.engine, self.title).decode()
        return self._svg

    def draw(self, path) -> Path:
        """Write the region's picture to ``path`` (format from the suffix); returns the path."""
        path = Path(path)
        fmt = path.suffix.lower().lstrip(".")
        path.write_bytes(_render(self.data, self._sel, fmt, self.engine, self.title))
        return path

    def _repr_svg_(self) -> str:
        return self.svg()

    def _repr_html_(self) -> str:
        return _wrap(
            f'<p class="sp-note">{html.escape(self.note)}</p>{legend_html()}<div class="sp-svg">{inline_svg(self.svg())}</div>'
        )

    def __repr__(self) -> str:
        return f"DAGView({self.note})"


def view(dag, around=None, depth: int = 2, stream: int | None = None, **kwargs) -> DAGView:
    """A displayable region of ``dag``.

    ``around``: a node (name or fx.Node) — draw the nodes within ``depth`` data/sync steps of
    it, both directions. ``stream``: draw that stream's nodes plus, faded, the nodes on other
    streams they exchange data or syncs with. Both: the intersection. Neither: the whole
    graph. ``nodes=[...]`` picks nodes by name. Drawings stop at ``max_nodes`` (250) and say
    how many nodes they left out; ``collapse=False`` also shows ``control_deps`` plumbing.
    ``engine``: ``"auto"``, ``"dot"`` or ``"matplotlib"``.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> v = view(gm, around="sin", depth=1)
    >>> v.nodes, v.left_out
    (['x_1', 'sin', 'add'], 0)
    >>> v
    DAGView(3 of 5 node(s) drawn (within 1 dependency step(s) of sin))
    >>> small = view(gm, max_nodes=2)
    >>> len(small.nodes), small.left_out
    (2, 3)
    >>> "sin" in v.to_dot(), "cos" in v.to_dot()
    (True, False)
    """
    return DAGView(dag, around=around, depth=depth, stream=stream, **kwargs)


def repr_svg(dag) -> str:
    """The whole DAG as SVG, capped at :data:`MAX_NODES` nodes.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> svg = repr_svg(gm)
    >>> "<svg" in svg, all(name in svg for name in ("x_1", "sin", "cos", "add"))
    (True, True)
    """
    return view(dag).svg()


def repr_html(dag, max_nodes: int = MAX_NODES) -> str:
    """Notebook display: per-stream summary table, hazards, and a (capped) drawing.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> page = repr_html(gm)
    >>> page.startswith('<div class="sp-root">'), "4 hazard(s)</span>" in page, "<svg" in page
    (True, True, True)
    >>> _ = sp.run(gm)  # adds the syncs in place
    >>> '<span class="sp-ok">no hazards</span>' in repr_html(gm)
    True
    """
    d = data(dag)
    v = view(d, max_nodes=max_nodes)
    hz = d.hazards
    kinds = Counter(h.kind for h in hz)
    head = (
        f"<b>StreamDAG</b>: {len(d.nodes)} nodes, {len(d.edges)} edges, streams {d.streams}, "
        + (
            f'<span class="sp-bad">{len(hz)} hazard(s)</span> ({", ".join(f"{k}: {n}" for k, n in sorted(kinds.items()))})'
            if hz
            else '<span class="sp-ok">no hazards</span>'
        )
    )
    parts = [f"<p>{head}</p>", summary_table(d)]
    if hz:
        parts.append(f"<details><summary>{len(hz)} hazard(s)</summary>{hazard_table(hz)}</details>")
    parts.append(legend_html())  # the drawing carries its own caption (v.note)
    parts.append(f'<div class="sp-svg">{inline_svg(v.svg())}</div>')
    return _wrap("".join(parts))


# ----------------------------------------------------------------------------------------
# HTML helpers (shared with streampass.view.report and streampass.view.compare)
# ----------------------------------------------------------------------------------------
CSS = """
.sp-root{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;font-size:13px;color:#222}
.sp-root table.sp-table{border-collapse:collapse;margin:6px 0}
.sp-root .sp-table th,.sp-root .sp-table td{border:1px solid #ccc;padding:2px 8px;text-align:left !important;vertical-align:top}
.sp-root .sp-table th{background:#f0f0f0}
.sp-root .sp-bad{color:#d62728;font-weight:600}
.sp-root .sp-ok{color:#2a8a2a;font-weight:600}
.sp-root .sp-note{color:#555;font-size:12px;margin:4px 0}
.sp-root .sp-svg{overflow:auto;max-height:720px;border:1px solid #e4e4e4;background:#fff}
.sp-root .sp-svg svg{max-width:100%;height:auto}
.sp-root .sp-legend span{display:inline-block;margin-right:14px;font-size:12px}
.sp-root .sp-sw{display:inline-block;width:22px;height:0;vertical-align:middle;margin-right:4px;border-top:2px solid}
"""


def legend_html() -> str:
    """The HTML legend of the drawings' edge styles (data, cross-stream, sync, hazard).

    >>> legend = legend_html()
    >>> legend.startswith('<div class="sp-legend">'), legend.count("<span>")
    (True, 4)
    >>> "record → wait (sync)" in legend, "border-top:2px dashed #8a3ab9" in legend
    (True, True)
    """
    items = [
        (f"border-top:2px solid {_DATA}", "data"),
        (f"border-top:2px solid {_CROSS}", "cross-stream data"),
        (f"border-top:2px dashed {_SYNC}", "record → wait (sync)"),
        (f"border-top:2px solid {_HAZARD}", "hazard (hover for why)"),
    ]
    return '<div class="sp-legend">' + "".join(f'<span><i class="sp-sw" style="{s}"></i>{t}</span>' for s, t in items) + "</div>"


def _wrap(body: str) -> str:
    return f'<div class="sp-root"><style>{CSS}</style>{body}</div>'


_SVG_PROLOGUE = re.compile(r"^\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?(<!--.*?-->\s*)*", re.S)


def inline_svg(svg: str) -> str:
    """An SVG document with its XML prologue stripped, to embed in HTML.

    >>> inline_svg('<?xml version="1.0"?><!DOCTYPE svg><!-- made by dot --><svg/>')
    '<svg/>'
    """
    return _SVG_PROLOGUE.sub("", svg, count=1)


# ----------------------------------------------------------------------------------------
# the schedule (streampass.sim.simulate.Schedule) as swimlanes over time
# ----------------------------------------------------------------------------------------
MAX_SLOTS = 4000


def schedule_svg(schedule, max_slots: int = MAX_SLOTS, title: str | None = None, caption: bool = True) -> str:
    """A Gantt chart of a simulated schedule: one row per stream (and the CPU if it did work),
    kernels coloured by stream, records green, waits orange, each bar's node as tooltip.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> svg = schedule_svg(sp.simulate(gm))
    >>> svg.count("<title>"), "<title>sin (sin) on stream 1: kernel, 0.00-5.00 us</title>" in svg
    (3, True)
    >>> "stream 0" in svg, "stream 1" in svg
    (True, True)
    """
    from matplotlib.figure import Figure
    import matplotlib

    slots = sorted(schedule.slots.values(), key=lambda s: (s.start, s.end))
    dropped = max(0, len(slots) - max_slots)
    slots = slots[:max_slots]
    rows = list(schedule.streams) + (["cpu"] if any(s.stream is None for s in slots) else [])
    y = {r: i for i, r in enumerate(rows)}
    scale = 1e6  # seconds -> microseconds
    end = max([schedule.makespan] + [s.end for s in slots]) * scale or 1.0
    gids: dict[str, str] = {}
    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "DejaVu Sans", "svg.hashsalt": "streampass"}):
        fig = Figure(figsize=(11, 0.9 + 0.45 * len(rows)), dpi=100)
        ax = fig.add_axes([0.1, 0.28 if len(rows) < 4 else 0.18, 0.88, 0.6 if len(rows) < 4 else 0.7])
        for k, s in enumerate(slots):
            r = s.stream if s.stream is not None else "cpu"
            if s.kind == "record":
                color = _RECORD_FILL
                ec = "#3a8a3a"
            elif s.kind in ("wait", "sync"):
                color = _WAIT_FILL
                ec = "#c07a20"
            else:
                color = _LANE_EDGES[(s.stream or 0) % len(_LANE_EDGES)] if s.stream is not None else "#bbbbbb"
                ec = "white"
            width = max((s.end - s.start) * scale, end * 0.0015)
            bars = ax.broken_barh([(s.start * scale, width)], (y[r] - 0.35, 0.7), facecolors=color, edgecolors=ec, linewidth=0.5)
            gid = f"sp-slot-{k}"
            bars.set_gid(gid)
            tip = f"{s.node} ({s.target}) on {'stream ' + str(s.stream) if s.stream is not None else 'CPU'}: {s.kind}, {s.start * scale:.2f}-{s.end * scale:.2f} us"
            if s.waited_on:
                tip += f", waited on {', '.join(s.waited_on)}"
            gids[gid] = tip
        ax.axvline(schedule.critical_path_time * scale, color=_HAZARD, ls=":", lw=1)
        ax.set_yticks(range(len(rows)), [f"stream {r}" if r != "cpu" else "CPU" for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(0, end * 1.02)
        ax.set_xlabel("time (us); dotted red line: critical path (lower bound)", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        legend = [Patch(facecolor=_LANE_EDGES[s % len(_LANE_EDGES)], label=f"kernel on stream {s}") for s in schedule.streams]
        legend += [
            Patch(facecolor=_RECORD_FILL, edgecolor="#3a8a3a", label="record"),
            Patch(facecolor=_WAIT_FILL, edgecolor="#c07a20", label="wait / sync"),
            Line2D([0], [0], color=_HAZARD, ls=":", label="critical path"),
        ]
        ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(0, -0.32 if len(rows) < 4 else -0.2),
                  ncol=min(len(legend), 6), fontsize=7, frameon=False)
        head = title or (schedule.summary() if caption else "")
        if dropped:
            head += f" — first {max_slots} slots drawn, {dropped} left out"
        if head:
            fig.suptitle(head, x=0.01, ha="left", fontsize=8.5, wrap=True)
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", facecolor="white")
    text = buf.getvalue().decode()
    for gid, tip in gids.items():
        text = text.replace(f'<g id="{gid}">', f'<g id="{gid}"><title>{html.escape(tip, quote=False)}</title>', 1)
    return text


def schedule_html(schedule, **kwargs) -> str:
    """The schedule's summary line and Gantt chart as an HTML fragment (for notebooks/reports).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> schedule = sp.simulate(gm)
    >>> page = schedule_html(schedule)
    >>> page.startswith('<div class="sp-root">'), schedule.summary() in page
    (True, True)
    >>> "<?xml" in page, "<svg" in page  # the SVG is inlined without its prologue
    (False, True)
    """
    return _wrap(
        f'<p class="sp-note">{html.escape(schedule.summary())}</p>'
        f'<div class="sp-svg">{inline_svg(schedule_svg(schedule, caption=False, **kwargs))}</div>'
    )

"""Graphviz DOT source of a DAG region, built with pydot: one lane (cluster) per stream."""

from __future__ import annotations

import itertools

from streampass.view.data import StreamDAGData, data
from streampass.view.select import Drawn, select_region, short_target, tooltip
from streampass.view.style import (
    CROSS_COLOUR,
    DATA_COLOUR,
    HAZARD_COLOUR,
    HAZARD_FILL,
    LANE_EDGES,
    LANE_FILLS,
    MAX_HAZARD_EDGES,
    MAX_LABELLED_HAZARDS,
    MAX_NODES,
    RECORD_FILL,
    SYNC_COLOUR,
    WAIT_FILL,
)
from streampass.view.tables import RECORD_OPS


def to_pydot(
    dag,
    around=None,
    depth: int = 2,
    stream: int | None = None,
    nodes=None,
    max_nodes: int = MAX_NODES,
    collapse: bool = True,
    title: str | None = None,
):
    """A ``pydot.Dot`` of the DAG (or a region): see :func:`to_dot`."""
    d = data(dag)
    return pydot_graph(d, select_region(d, around, depth, stream, nodes, max_nodes, collapse), title)


def to_dot(dag, **kwargs) -> str:
    """Graphviz DOT source: a cluster (lane) per stream, nodes chained in issue order.

    Data edges are grey, cross-stream data edges blue and bold, record -> wait (``sync``)
    edges dashed purple; nodes and edges of a hazard are red with the hazard's message as
    tooltip. Takes the region arguments of :func:`~streampass.view.notebook.region` (``around``, ``depth``, ``stream``,
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


def pydot_graph(d: StreamDAGData, sel: Drawn, title: str | None):
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
    g.set_node_defaults(
        shape="box",
        style="rounded,filled",
        fillcolor="white",
        fontname="Helvetica",
        fontsize="10",
        height="0.3",
    )
    g.set_edge_defaults(arrowsize="0.6", color=DATA_COLOUR)
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
            fillcolor=LANE_FILLS[s % len(LANE_FILLS)],
            color=LANE_EDGES[s % len(LANE_EDGES)],
            fontname="Helvetica",
            fontsize="11",
            labeljust="l",
        )
        for n in lanes[s]:
            hz = sel.hazards_by_node.get(n["name"], [])
            attrs = {
                "label": _dot_str(f"{n['name']}\n{short_target(n)}"),
                "tooltip": _dot_str(tooltip(n, hz)),
                "id": _dot_str(f"sp-{n['name']}"),
            }
            if n["role"] == "sync":
                attrs["fillcolor"] = RECORD_FILL if n["sync"] in RECORD_OPS else WAIT_FILL
                attrs["shape"] = "cds" if n["sync"] in RECORD_OPS else "box"
            elif n["role"] in ("input", "output"):
                attrs["shape"] = "ellipse"
                attrs["style"] = "filled"
            if hz:
                attrs["color"] = HAZARD_COLOUR
                attrs["penwidth"] = "2"
                attrs["fontcolor"] = HAZARD_COLOUR
                attrs["fillcolor"] = HAZARD_FILL
            if n["name"] in sel.context:
                attrs["style"] = "rounded,filled,dashed"
                attrs["fillcolor"] = "#ffffff"
                attrs["fontcolor"] = attrs.get("fontcolor", "#777777")
            c.add_node(pydot.Node(ids[n["name"]], **attrs))
        # issue order: an invisible, heavy chain keeps each lane left to right
        chain = [n for n in lanes[s] if n["role"] != "input"]
        for a, b in itertools.pairwise(chain):
            c.add_edge(pydot.Edge(ids[a["name"]], ids[b["name"]], style="invis", weight="20"))
        g.add_subgraph(c)

    haz_pairs = hazard_pairs(sel)
    labels = len(haz_pairs) <= MAX_LABELLED_HAZARDS  # edge labels cost dot a virtual node each
    by_name = {n["name"]: n for n in sel.nodes}
    for e in sel.edges:
        u, v = e["src"], e["dst"]
        cross = by_name[u]["stream"] != by_name[v]["stream"]
        attrs: dict[str, str] = {"tooltip": _dot_str(f"{u} -> {v}: {', '.join(e['kinds'])}")}
        if "sync" in e["kinds"]:
            attrs.update(
                color=SYNC_COLOUR,
                style="dashed",
                penwidth="1.6",
                label="sync",
                fontcolor=SYNC_COLOUR,
                fontsize="8",
            )
        elif cross:
            attrs.update(color=CROSS_COLOUR, penwidth="1.8")
        if cross:
            attrs["constraint"] = "true"
        hs = haz_pairs.pop((u, v), None)
        if hs:
            attrs.update(
                color=HAZARD_COLOUR,
                fontcolor=HAZARD_COLOUR,
                penwidth="2",
                fontsize="8",
                tooltip=_dot_str(hazard_messages(hs)),
            )
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
                color=HAZARD_COLOUR,
                fontcolor=HAZARD_COLOUR,
                style="dotted",
                penwidth="2",
                constraint="false",
                fontsize="8",
                tooltip=_dot_str(hazard_messages(hs)),
                **extra,
            )
        )
    return g


def hazard_pairs(sel: Drawn) -> dict[tuple[str, str], list]:
    out: dict[tuple[str, str], list] = {}
    for u, v, h in sel.hazard_edges:
        out.setdefault((u, v), []).append(h)
    return out


def _kinds(hs) -> str:
    return ", ".join(dict.fromkeys(h.kind for h in hs))


def hazard_messages(hs) -> str:
    return "\n".join(f"[{h.kind}] {h.message}" for h in hs)


def _dot_str(s: str) -> str:
    """A DOT double-quoted string (pydot does not quote attribute values that need it)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

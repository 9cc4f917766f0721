"""Choosing what to draw: a region of the DAG (a neighbourhood, a stream), capped, with what was left out."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from streampass import ops
from streampass.view.data import StreamDAGData
from streampass.view.style import MAX_NODES


@dataclass
class Drawn:
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


def select_region(
    d: StreamDAGData,
    around=None,
    depth: int = 2,
    stream: int | None = None,
    nodes=None,
    max_nodes: int = MAX_NODES,
    collapse: bool = True,
) -> Drawn:
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)):
        raise TypeError(f"stream must be a stream index (an int), got {stream!r} ({type(stream).__name__})")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0 (dependency steps), got {depth!r}")
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
            cross = {
                x
                for e in all_edges
                for x in (e["src"], e["dst"])
                if by_name[e["src"]]["stream"] != by_name[e["dst"]]["stream"]
            }

            def rank(x):
                a = by_name[x]
                interesting = x in hazards_by_node or a["role"] == "sync" or x in cross
                return (x in context, not interesting, a["index"])

            priority = sorted(want, key=rank)
        else:
            priority = [x for x in priority if x in want] + sorted(
                context - set(priority), key=lambda x: by_name[x]["index"]
            )
        want = set(priority[:max_nodes])
    drawn = [n for n in all_nodes if n["name"] in want]
    left = [n for n in all_nodes if n["name"] in (chosen | context) and n["name"] not in want]
    left_by_stream = dict(sorted(Counter(n["stream"] for n in left).items()))
    edges = [
        e for e in all_edges if e["src"] in want and e["dst"] in want and ("data" in e["kinds"] or "sync" in e["kinds"])
    ]
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
            f"view.region(dag, around=NODE, depth=K) or view.region(dag, stream=S), or raise max_nodes"
        )
    return Drawn(
        drawn,
        edges,
        context & want,
        hazards_by_node,
        hazard_edges,
        len(left),
        left_by_stream,
        total,
        note,
    )


def _name(x) -> str:
    return x if isinstance(x, str) else getattr(x, "name", str(x))


def short_target(n: dict) -> str:
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
    return ops.short_name(t)


def tooltip(n: dict, hazards: list) -> str:
    lines = [f"{n['name']}: {n['target']} on stream {n['stream']} (#{n['index']} in issue order)"]
    lines += [f"[{h.kind}] {h.message}" for h in hazards]
    return "\n".join(lines)

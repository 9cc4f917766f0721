"""Pictures: Graphviz `dot` (lanes moved into stream order), or matplotlib when `dot` is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from streampass.view.data import StreamDAGData, data
from streampass.view.dot import pydot_graph
from streampass.view.mpl import matplotlib_picture
from streampass.view.select import Drawn, select_region
from streampass.view.style import DOT_TIMEOUT_S


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
    proc = subprocess.run(
        [exe, *program[1:], f"-T{fmt}"],
        input=src.encode(),
        capture_output=True,
        timeout=DOT_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{program[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


LANE_GAP = 10.0  # points between two lanes moved into stream order
REROUTE_NODES = 80  # drawings up to this many nodes get their cross-lane edges routed again


def _lanes_in_stream_order(g, fmt: str) -> bytes:
    """Render ``g`` (from :func:`pydot_graph`) with its lanes top to bottom in stream order.

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


def render_picture(d: StreamDAGData, sel: Drawn, fmt: str, engine: str, title: str | None = None) -> bytes:
    eng = _engine(engine)
    if eng == "dot":
        try:
            return _lanes_in_stream_order(pydot_graph(d, sel, title), fmt)
        except (subprocess.TimeoutExpired, RuntimeError, OSError):
            if engine == "dot":
                raise
    return matplotlib_picture(d, sel, fmt, title)


def render_svg(dag, engine: str = "auto", title: str | None = None, **region) -> str:
    """The DAG (or a region, see :func:`~streampass.view.notebook.region`) as an SVG document string.

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
    return render_picture(d, select_region(d, **region), "svg", engine, title).decode()


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
    path.write_bytes(render_picture(d, select_region(d, **region), fmt, engine, title))
    return path

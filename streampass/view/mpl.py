"""The matplotlib swimlane picture, for machines without Graphviz."""

from __future__ import annotations

import html
import io
from collections import Counter

from streampass.view.data import StreamDAGData
from streampass.view.dot import hazard_messages, hazard_pairs
from streampass.view.select import Drawn, short_target, tooltip
from streampass.view.style import (
    CROSS_COLOUR,
    DATA_COLOUR,
    HAZARD_COLOUR,
    HAZARD_FILL,
    LANE_EDGES,
    LANE_FILLS,
    RECORD_FILL,
    SYNC_COLOUR,
    WAIT_FILL,
)
from streampass.view.tables import RECORD_OPS


def _layout(sel: Drawn) -> tuple[dict[str, tuple[float, int]], dict[int, int]]:
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


def matplotlib_picture(d: StreamDAGData, sel: Drawn, fmt: str, title: str | None) -> bytes:
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

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
    with matplotlib.rc_context(
        {
            "svg.fonttype": "none",
            "font.family": "DejaVu Sans",
            "svg.hashsalt": "streampass",
        }
    ):
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
                    fc=LANE_FILLS[s % len(LANE_FILLS)],
                    ec=LANE_EDGES[s % len(LANE_EDGES)],
                    lw=1,
                    zorder=0,
                )
            )
            ax.text(
                0.0,
                top + 0.22,
                f"stream {s}" + (" (ambient)" if s == 0 else ""),
                fontsize=8,
                va="center",
                color="#333333",
                zorder=1,
            )
        by_name = {n["name"]: n for n in sel.nodes}
        haz_pairs = hazard_pairs(sel)
        k = 0
        for e in sel.edges + [
            {"src": u, "dst": v, "kinds": ["hazard"]}
            for (u, v) in haz_pairs
            if not any(x["src"] == u and x["dst"] == v for x in sel.edges)
        ]:
            u, v = e["src"], e["dst"]
            cross = by_name[u]["stream"] != by_name[v]["stream"]
            color, ls, lw = DATA_COLOUR, "-", 0.8
            if "sync" in e["kinds"]:
                color, ls, lw = SYNC_COLOUR, "--", 1.4
            elif cross:
                color, lw = CROSS_COLOUR, 1.4
            hs = haz_pairs.get((u, v))
            if hs:
                color, lw = HAZARD_COLOUR, 1.8
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
                gids[gid] = hazard_messages(hs)
            ax.add_patch(arrow)
        for n in sel.nodes:
            x, yy = xy[n["name"]]
            hz = sel.hazards_by_node.get(n["name"], [])
            fc, ec, tc, lw = "white", "#666666", "#111111", 0.8
            if n["role"] == "sync":
                fc = RECORD_FILL if n["sync"] in RECORD_OPS else WAIT_FILL
            elif n["role"] in ("input", "output"):
                fc = "#f7f7f7"
            if hz:
                fc, ec, tc, lw = HAZARD_FILL, HAZARD_COLOUR, HAZARD_COLOUR, 1.8
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
            gids[gid] = tooltip(n, hz)
            ax.add_patch(box)
            ax.text(
                x,
                yy - 0.1,
                n["name"],
                ha="center",
                va="center",
                fontsize=6.5,
                color=tc,
                zorder=4,
                clip_on=True,
            )
            ax.text(
                x,
                yy + 0.15,
                short_target(n)[:22],
                ha="center",
                va="center",
                fontsize=5.5,
                color="#555555",
                zorder=4,
            )
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=dpi, facecolor="white")
    out = buf.getvalue()
    if fmt == "svg":
        text = out.decode()
        for gid, tip in gids.items():
            text = text.replace(
                f'<g id="{gid}">',
                f'<g id="{gid}"><title>{html.escape(tip, quote=False)}</title>',
                1,
            )
        out = text.encode()
    return out

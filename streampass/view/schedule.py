"""The simulated schedule (:class:`streampass.sim.simulate.Schedule`) as swimlanes over time."""

from __future__ import annotations

import html
import io

from streampass.view.html import svg_block, wrap_page
from streampass.view.style import HAZARD_COLOUR, LANE_EDGES, RECORD_FILL, WAIT_FILL

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
    import matplotlib
    from matplotlib.figure import Figure

    slots = sorted(schedule.slots.values(), key=lambda s: (s.start, s.end))
    dropped = max(0, len(slots) - max_slots)
    slots = slots[:max_slots]
    rows = list(schedule.streams) + (["cpu"] if any(s.stream is None for s in slots) else [])
    y = {r: i for i, r in enumerate(rows)}
    scale = 1e6  # seconds -> microseconds
    end = max([schedule.makespan] + [s.end for s in slots]) * scale or 1.0
    gids: dict[str, str] = {}
    with matplotlib.rc_context(
        {
            "svg.fonttype": "none",
            "font.family": "DejaVu Sans",
            "svg.hashsalt": "streampass",
        }
    ):
        fig = Figure(figsize=(11, 0.9 + 0.45 * len(rows)), dpi=100)
        ax = fig.add_axes([0.1, 0.28 if len(rows) < 4 else 0.18, 0.88, 0.6 if len(rows) < 4 else 0.7])
        for k, s in enumerate(slots):
            r = s.stream if s.stream is not None else "cpu"
            if s.kind == "record":
                color = RECORD_FILL
                ec = "#3a8a3a"
            elif s.kind in ("wait", "sync"):
                color = WAIT_FILL
                ec = "#c07a20"
            else:
                color = LANE_EDGES[(s.stream or 0) % len(LANE_EDGES)] if s.stream is not None else "#bbbbbb"
                ec = "white"
            width = max((s.end - s.start) * scale, end * 0.0015)
            bars = ax.broken_barh(
                [(s.start * scale, width)],
                (y[r] - 0.35, 0.7),
                facecolors=color,
                edgecolors=ec,
                linewidth=0.5,
            )
            gid = f"sp-slot-{k}"
            bars.set_gid(gid)
            tip = f"{s.node} ({s.target}) on {'stream ' + str(s.stream) if s.stream is not None else 'CPU'}: {s.kind}, {s.start * scale:.2f}-{s.end * scale:.2f} us"
            if s.waited_on:
                tip += f", waited on {', '.join(s.waited_on)}"
            gids[gid] = tip
        ax.axvline(schedule.critical_path_time * scale, color=HAZARD_COLOUR, ls=":", lw=1)
        ax.set_yticks(
            range(len(rows)),
            [f"stream {r}" if r != "cpu" else "CPU" for r in rows],
            fontsize=8,
        )
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(0, end * 1.02)
        ax.set_xlabel("time (us); dotted red line: critical path (lower bound)", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        legend = [
            Patch(facecolor=LANE_EDGES[s % len(LANE_EDGES)], label=f"kernel on stream {s}") for s in schedule.streams
        ]
        legend += [
            Patch(facecolor=RECORD_FILL, edgecolor="#3a8a3a", label="record"),
            Patch(facecolor=WAIT_FILL, edgecolor="#c07a20", label="wait / sync"),
            Line2D([0], [0], color=HAZARD_COLOUR, ls=":", label="critical path"),
        ]
        ax.legend(
            handles=legend,
            loc="upper left",
            bbox_to_anchor=(0, -0.32 if len(rows) < 4 else -0.2),
            ncol=min(len(legend), 6),
            fontsize=7,
            frameon=False,
        )
        head = title or (schedule.summary() if caption else "")
        if dropped:
            head += f" — first {max_slots} slots drawn, {dropped} left out"
        if head:
            fig.suptitle(head, x=0.01, ha="left", fontsize=8.5, wrap=True)
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", facecolor="white")
    text = buf.getvalue().decode()
    for gid, tip in gids.items():
        text = text.replace(
            f'<g id="{gid}">',
            f'<g id="{gid}"><title>{html.escape(tip, quote=False)}</title>',
            1,
        )
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
    return wrap_page(
        f'<p class="sp-note">{html.escape(schedule.summary())}</p>'
        + svg_block(schedule_svg(schedule, caption=False, **kwargs))
    )

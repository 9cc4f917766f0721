"""A self-contained HTML report of a graph before and after the pass (``streampass demo/inspect``).

One file, no network: CSS inline, pictures as inline SVG, no JavaScript. Sections: the
graph's streams (summary table), its hazards, the DAG drawing (capped, see
:mod:`streampass.view`), what the pass added (:func:`streampass.view.compare.compare`), the DAG
after, and — when :mod:`streampass.sim.simulate` is available — the simulated schedule.
"""

from __future__ import annotations

import datetime
import html
from pathlib import Path

from streampass.view.data import data
from streampass.view.html import CSS, legend_html, svg_block
from streampass.view.notebook import region
from streampass.view.schedule import schedule_svg
from streampass.view.style import MAX_NODES
from streampass.view.tables import hazard_table, summary_table


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{body}</section>'


def _dag_body(dag, max_nodes: int, engine: str) -> str:
    d = data(dag)
    v = region(d, max_nodes=max_nodes, engine=engine)
    return (
        summary_table(d)
        + f"<h3>Hazards ({len(d.hazards)})</h3>"
        + hazard_table(d.hazards)
        + "<h3>Drawing</h3>"
        + legend_html()
        + svg_block(v.svg())
    )


def _schedule_body(gm, cost, cpu_launch: bool) -> str | None:
    try:
        from streampass.sim.simulate import simulate
    except ImportError:
        return None
    try:
        sched = simulate(gm, cost=cost, cpu_launch=cpu_launch)
    except Exception as e:  # the report must not fail because the simulator refuses a graph
        return f"<p>simulation unavailable for this graph: {html.escape(str(e))}</p>"
    return f'<p class="sp-note">{html.escape(sched.summary())}</p>' + svg_block(schedule_svg(sched, caption=False))


PAGE_CSS = """
body{margin:24px;max-width:1400px;font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
h3{font-size:15px;margin:14px 0 4px} pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
nav a{margin-right:12px} .meta{color:#666;font-size:12px}
"""


def build_report(
    before,
    after=None,
    *,
    title: str = "streampass report",
    lines: list[str] | None = None,
    cost="h100",
    schedule: bool = True,
    cpu_launch: bool = False,
    max_nodes: int = MAX_NODES,
    engine: str = "auto",
) -> str:
    """The report as one HTML string.

    ``before``: the graph as given (GraphModule or StreamDAG); ``after``: the graph after
    :func:`streampass.run` (omit to report one graph). ``lines``: a text summary shown at the
    top (the CLI passes what it printed). ``schedule``: add the simulated schedule of the final
    graph (``cost``: a profile name or a ``CostModel``; ``cpu_launch`` as for :func:`streampass.simulate`) when
    :mod:`streampass.sim.simulate` is installed.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> before = make_fx(f)(torch.ones(4))
    >>> after = make_fx(f)(torch.ones(4))
    >>> _ = sp.run(after)
    >>> page = build_report(before, after, title="sin | cos", lines=["4 hazards -> 0"])
    >>> page.startswith("<!DOCTYPE html>"), "<title>sin | cos</title>" in page
    (True, True)
    >>> [a for a in ("summary", "before", "changes", "after", "schedule") if f'<section id="{a}">' in page]
    ['summary', 'before', 'changes', 'after', 'schedule']
    >>> "<h3>Hazards (4)</h3>" in page, "<h3>Hazards (0)</h3>" in page, "<script" in page
    (True, True, False)
    >>> one = build_report(before, schedule=False)
    >>> "<h2>Graph</h2>" in one, '<section id="after">' in one, '<section id="schedule">' in one
    (True, False, False)
    """
    from streampass.view.compare import compare

    sections = []
    nav = []
    if lines:
        sections.append(_section("Summary", f"<pre>{html.escape(chr(10).join(lines))}</pre>", "summary"))
        nav.append(("summary", "Summary"))
    label = "Before the pass" if after is not None else "Graph"
    sections.append(_section(label, _dag_body(before, max_nodes, engine), "before"))
    nav.append(("before", label))
    if after is not None:
        cmp = compare(before, after)
        sections.append(_section("What the pass changed", cmp._repr_html_(), "changes"))
        sections.append(_section("After the pass", _dag_body(after, max_nodes, engine), "after"))
        nav += [("changes", "Changes"), ("after", "After")]
    final = after if after is not None else before
    if schedule and hasattr(final, "graph"):
        cost = "h100" if cost is None else cost
        body = _schedule_body(final, cost, cpu_launch)
        if body is not None:
            profile = cost if isinstance(cost, str) else getattr(cost, "profile", cost).name
            sections.append(_section(f"Simulated schedule ({profile})", body, "schedule"))
            nav.append(("schedule", "Schedule"))
    from streampass import __version__

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{PAGE_CSS}{CSS}</style></head>"
        f'<body><div class="sp-root"><h1>{html.escape(title)}</h1>'
        f'<p class="meta">streampass {__version__}, {stamp}. Hover over red nodes and edges for what can go wrong.</p>'
        "<nav>"
        + "".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in nav)
        + "</nav>"
        + "".join(sections)
        + "</div></body></html>\n"
    )


def write_report(path, before, after=None, **kwargs) -> Path:
    """Write :func:`build_report` to ``path`` (parent folders are created); returns the path.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> import os, shutil, tempfile
    >>> gm = make_fx(f)(torch.ones(4))
    >>> tmp = tempfile.mkdtemp()
    >>> path = write_report(os.path.join(tmp, "new", "report.html"), gm, schedule=False)
    >>> path.name, path.stat().st_size > 0, path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    ('report.html', True, True)
    >>> shutil.rmtree(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_report(before, after, **kwargs), encoding="utf-8")
    return path

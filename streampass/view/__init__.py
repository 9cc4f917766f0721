"""Views of a :class:`~streampass.analysis.dag.StreamDAG` that a person reads: lanes, tables, pictures.

Everything here reads a DAG and never edits a graph; a view is a function of a DAG (a
``StreamDAG``, a graph, or a snapshot). All views work on a plain snapshot of the DAG,
:class:`StreamDAGData` (nodes, edges, streams, hazards), so a DAG read back from JSON
(:func:`from_json`) displays exactly like the live one. One module per job:

- ``data``: the snapshot and its JSON; ``tables``: summary and hazard tables;
  ``select``: which region to draw; ``dot``: Graphviz source; ``render``: pictures
  (``dot``, else ``mpl``); ``notebook``: what Jupyter shows; ``html``: shared HTML;
  ``schedule``: the simulated schedule; ``compare`` and ``report``: before/after and the
  one-page HTML report.

- :func:`to_dot` — Graphviz source built with pydot: one cluster (lane) per stream, nodes in
  issue order, cross-stream data edges in blue, record -> wait edges dashed purple, hazards red
  with their message as tooltip.
- :func:`region` — a displayable region: ``around=node, depth=k`` or ``stream=s`` (plus the
  cross-stream neighbours of that stream). Every drawing is capped at ``max_nodes`` (250)
  and says what it left out.
- :func:`summary_table` — per stream: nodes, cross-stream in/out, records, waits, hazards.
- :func:`draw` / :func:`render_svg` — a picture: Graphviz ``dot`` when the binary is on PATH,
  else a matplotlib swimlane layout (``engine="matplotlib"`` forces it).
- :func:`to_json` / :func:`from_json` — a lossless round trip of the snapshot.
"""

from __future__ import annotations

from streampass.view.data import StreamDAGData, data, from_json, to_json
from streampass.view.dot import to_dot, to_pydot
from streampass.view.html import CSS, inline_svg, legend_html, wrap_page
from streampass.view.notebook import DAGView, region, repr_html, repr_svg
from streampass.view.render import draw, have_dot, render_svg
from streampass.view.schedule import schedule_html, schedule_svg
from streampass.view.style import MAX_NODES
from streampass.view.tables import hazard_table, summary, summary_table, summary_text

__all__ = [
    "CSS",
    "MAX_NODES",
    "DAGView",
    "StreamDAGData",
    "data",
    "draw",
    "from_json",
    "have_dot",
    "hazard_table",
    "inline_svg",
    "legend_html",
    "region",
    "render_svg",
    "repr_html",
    "repr_svg",
    "schedule_html",
    "schedule_svg",
    "summary",
    "summary_table",
    "summary_text",
    "to_dot",
    "to_json",
    "to_pydot",
    "wrap_page",
]

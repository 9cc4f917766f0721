"""What a notebook displays: a DAG region (:class:`DAGView`) and the DAG itself."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

from streampass.view.data import data
from streampass.view.dot import pydot_graph
from streampass.view.html import legend_html, svg_block, wrap_page
from streampass.view.render import render_picture
from streampass.view.select import select_region
from streampass.view.style import MAX_NODES
from streampass.view.tables import hazard_table, summary_table


class DAGView:
    """A region of a DAG, ready to display: ``_repr_html_`` (note + SVG), ``_repr_svg_``,
    ``to_dot()``, ``draw(path)``; ``.nodes`` lists the names drawn, ``.left_out`` how many
    nodes of the region did not fit under ``max_nodes``."""

    def __init__(
        self,
        dag,
        around=None,
        depth: int = 2,
        stream: int | None = None,
        nodes=None,
        max_nodes: int = MAX_NODES,
        collapse: bool = True,
        engine: str = "auto",
        title: str | None = None,
    ):
        self.data = data(dag)
        self.region = dict(
            around=around,
            depth=depth,
            stream=stream,
            nodes=nodes,
            max_nodes=max_nodes,
            collapse=collapse,
        )
        self.engine = engine
        self.title = title
        self._sel = select_region(self.data, **self.region)
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
        return pydot_graph(self.data, self._sel, self.title).to_string()

    def svg(self) -> str:
        """The region as an SVG document string (rendered once, then cached)."""
        if self._svg is None:
            self._svg = render_picture(self.data, self._sel, "svg", self.engine, self.title).decode()
        return self._svg

    def draw(self, path) -> Path:
        """Write the region's picture to ``path`` (format from the suffix); returns the path."""
        path = Path(path)
        fmt = path.suffix.lower().lstrip(".")
        path.write_bytes(render_picture(self.data, self._sel, fmt, self.engine, self.title))
        return path

    def _repr_svg_(self) -> str:
        return self.svg()

    def _repr_html_(self) -> str:
        return wrap_page(f'<p class="sp-note">{html.escape(self.note)}</p>{legend_html()}{svg_block(self.svg())}')

    def __repr__(self) -> str:
        return f"DAGView({self.note})"


def region(dag, around=None, depth: int = 2, stream: int | None = None, **kwargs) -> DAGView:
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
    >>> v = region(gm, around="sin", depth=1)
    >>> v.nodes, v.left_out
    (['x_1', 'sin', 'add'], 0)
    >>> v
    DAGView(3 of 5 node(s) drawn (within 1 dependency step(s) of sin))
    >>> small = region(gm, max_nodes=2)
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
    return region(dag).svg()


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
    v = region(d, max_nodes=max_nodes)
    hz = d.hazards
    kinds = Counter(h.kind for h in hz)
    head = f"<b>StreamDAG</b>: {len(d.nodes)} nodes, {len(d.edges)} edges, streams {d.streams}, " + (
        f'<span class="sp-bad">{len(hz)} hazard(s)</span> ({", ".join(f"{k}: {n}" for k, n in sorted(kinds.items()))})'
        if hz
        else '<span class="sp-ok">no hazards</span>'
    )
    parts = [f"<p>{head}</p>", summary_table(d)]
    if hz:
        parts.append(f"<details><summary>{len(hz)} hazard(s)</summary>{hazard_table(hz)}</details>")
    if v.left_out:  # the drawing's own caption says so too, but small on a large drawing
        parts.append(f'<p class="sp-note">{html.escape(v.note)}</p>')
    parts.append(legend_html())
    parts.append(svg_block(v.svg()))
    return wrap_page("".join(parts))

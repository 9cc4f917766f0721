"""Views of the stream DAG: DOT, SVG (Graphviz and matplotlib), JSON, regions, compare."""

from __future__ import annotations

import copy
import html
import re
import time

import pydot
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import view
from streampass.view import render, style
from streampass.view.compare import compare
from streampass.view.html import SCROLL_ABOVE_PT


def _small():
    def f(x, w):
        y = x * 2
        with sp.stream(1):
            z = (y + 1).relu()
        with sp.stream(2):
            u = w.cos()
        return z @ u

    return make_fx(f)(torch.ones(4, 4), torch.ones(4, 4))


@pytest.fixture
def small():
    gm = _small()
    return gm, sp.StreamDAG.from_graph(gm)


def _need_dot():
    if not view.have_dot():
        pytest.fail("the Graphviz `dot` binary is not on PATH: apt-get install -y graphviz")


def test_dot_has_every_node_one_lane_per_stream(small):
    gm, dag = small
    graphs = pydot.graph_from_dot_data(view.to_dot(dag))
    assert len(graphs) == 1
    g = graphs[0]
    clusters = {c.get_name(): c for c in g.get_subgraphs() if c.get_name().startswith("cluster_")}
    assert sorted(clusters) == sorted(f"cluster_stream_{s}" for s in dag.streams)
    labels = {}
    for s, c in ((int(k.rsplit("_", 1)[1]), c) for k, c in clusters.items()):
        for n in c.get_nodes():
            labels[n.get("label").strip('"').split("\\n")[0]] = s
    assert set(labels) == {n.name for n in gm.graph.nodes}
    assert all(labels[name] == dag.stream_of(name) for name in labels)  # each node in its own lane


def test_hazard_red_with_message_as_tooltip(small):
    _gm, dag = small
    hz = dag.hazards()
    raw = next(h for h in hz if h.kind == "raw")
    g = pydot.graph_from_dot_data(view.to_dot(dag))[0]
    nodes = {
        n.get("label").strip('"').split("\\n")[0]: n for c in g.get_subgraphs() for n in c.get_nodes() if n.get("label")
    }
    reader = nodes[raw.nodes[-1]]
    assert reader.get("color").strip('"') == style.HAZARD_COLOUR
    assert raw.message in reader.get("tooltip")
    red_edges = [e for e in g.get_edges() if (e.get("color") or "").strip('"') == style.HAZARD_COLOUR]
    assert any(raw.message in e.get("tooltip") for e in red_edges)
    involved = {x for h in hz for x in h.nodes}
    clean = [name for name in nodes if name not in involved]
    assert clean
    for name in clean:
        assert (nodes[name].get("color") or "").strip('"') != style.HAZARD_COLOUR


@pytest.mark.parametrize("engine", ["dot", "matplotlib"])
def test_svg_shows_nodes_lanes_and_hazard_tooltips(small, engine):
    if engine == "dot":
        _need_dot()
    gm, dag = small
    svg = view.render_svg(dag, engine=engine)
    assert svg.lstrip().startswith("<?xml") or svg.lstrip().startswith("<svg")
    for n in gm.graph.nodes:
        assert f">{n.name}<" in svg, n.name
    for s in dag.streams:
        assert f"stream {s}" in svg
    text = html.unescape(svg)
    for h in dag.hazards():
        assert h.message in text  # as a <title> tooltip
    assert style.HAZARD_COLOUR in svg.lower() or style.HAZARD_COLOUR.upper() in svg


def test_draw_matplotlib_when_dot_missing(small, tmp_path, monkeypatch):
    _gm, dag = small
    monkeypatch.setattr(render.shutil, "which", lambda name: None)
    assert not view.have_dot()
    png = view.draw(dag, tmp_path / "dag.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = view.draw(dag, tmp_path / "dag.svg")
    assert "<svg" in svg.read_text()
    assert repr(view.repr_svg(dag)).count("stream") >= len(dag.streams)
    with pytest.raises(RuntimeError, match="graphviz"):
        view.render_svg(dag, engine="dot")


def test_draw_with_graphviz(small, tmp_path):
    _need_dot()
    _gm, dag = small
    png = view.draw(dag, tmp_path / "dag.png", engine="dot")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        view.draw(dag, tmp_path / "dag.gif")


def test_json_round_trip(small):
    _gm, dag = small
    back = view.from_json(view.to_json(dag))
    d = view.data(dag)
    assert back == d
    assert back.streams == dag.streams
    assert back.hazards == dag.hazards()
    assert sorted(back.nx.nodes) == sorted(dag.nx.nodes)
    assert sorted(back.nx.edges) == sorted(dag.nx.edges)
    for u, v, attrs in dag.nx.edges(data=True):
        assert back.nx.edges[u, v]["kinds"] == attrs["kinds"]
    assert view.to_json(back) == view.to_json(dag)
    assert "stream 1" in back._repr_html_()  # a snapshot displays like the live DAG
    with pytest.raises(ValueError, match="format"):
        view.from_json('{"nodes": []}')


def test_json_round_trip_after_pass():
    gm = _small()
    sp.run(gm)
    dag = sp.StreamDAG.from_graph(gm)
    back = view.from_json(view.to_json(dag))
    assert back == view.data(dag)
    assert any(n["sync"] == "wait_event" for n in back.nodes)


def test_regions(small):
    _gm, dag = small
    v = view.region(dag, stream=1)
    on1 = set(dag.nodes_on(1))
    assert on1 <= set(v.nodes)
    assert all(
        dag.stream_of(x) == 1 or any(dag.nx.has_edge(x, y) or dag.nx.has_edge(y, x) for y in on1) for x in v.nodes
    )
    near = view.region(dag, around="relu", depth=1)
    assert set(near.nodes) == {"relu", "add", "mm"}
    assert "within 1" in near.note
    with pytest.raises(KeyError):
        view.region(dag, around="nope")
    with pytest.raises(KeyError):
        view.region(dag, stream=7)
    # a str said "no stream 1 in this DAG (streams: [0, 1])"; a bool, a float, a negative depth passed
    for bad in ("1", True, 1.0):
        with pytest.raises(TypeError, match="stream must be a stream index"):
            view.region(dag, stream=bad)
    with pytest.raises(ValueError, match="depth must be an int >= 0"):
        view.region(dag, around="relu", depth=-1)
    assert "<svg" in near._repr_html_()


def test_big_graph_is_capped_and_says_what_was_left_out():
    from streampass.synthetic import random_stream_graph

    gm = random_stream_graph(3000, 4, seed=1)
    dag = sp.StreamDAG.from_graph(gm)
    t = time.perf_counter()
    page = dag._repr_html_()
    elapsed = time.perf_counter() - t
    v = view.region(dag)
    assert len(v.nodes) == view.MAX_NODES
    assert v.left_out == len(dag.nx) - view.MAX_NODES - sum(
        1 for n in view.data(dag).nodes if n["role"] in ("alias", "subgraph")
    )
    assert "left out" in v.note and "view.region(dag, around=" in v.note
    assert len(page) < 5_000_000
    assert elapsed < 60
    assert "<table" in page  # the per-stream summary covers the whole graph
    # The page says what was left out in its own text, and a drawing too wide to shrink to the
    # page keeps its size in a scrolling box (scaled, its labels and caption were ~1px high).
    assert f'<p class="sp-note">{html.escape(v.note)}</p>' in page
    width = float(re.search(r'<svg[^>]*?\swidth="([\d.]+)pt"', page).group(1))
    assert ('class="sp-svg sp-wide"' in page) == (width > SCROLL_ABOVE_PT)
    rows = view.summary(dag)
    assert sum(r["nodes"] for r in rows) == len(dag.nx)


def test_summary_counts(small):
    _gm, dag = small
    rows = {r["stream"]: r for r in view.summary(dag)}
    assert sum(r["cross_out"] for r in rows.values()) == len(dag.cross_stream_edges())
    assert rows[1]["compute"] == 2 and rows[2]["compute"] == 1
    assert sum(r["hazards"] for r in rows.values()) == len(dag.hazards())
    assert "cross-stream in" in view.summary_text(dag)


def test_compare_shows_added_syncs_and_fixed_hazards():
    from streampass.commands import trace_demo

    gm, _ = trace_demo()
    before = copy.deepcopy(gm)
    result = sp.run(gm)
    c = compare(before, gm)
    assert len(c.records) == result.records_added
    assert len(c.waits) == result.waits_added
    assert c.ok and not c.hazards_after and not c.introduced
    assert sorted(map(str, c.fixed)) == sorted(map(str, result.before.hazards))
    for w in c.waits:
        assert w.partner is not None and w.partner_stream != w.stream
    assert any("mm_1" in w.protects for w in c.waits)  # the wait that guards the raw hazard on addmm
    text = str(c)
    assert "waits added" in text and "hazards that went away" in text
    page = c._repr_html_()
    assert "Waits added" in page and "mm_1" in page
    assert compare(gm, gm).records == []


def test_schedule_view():
    simulate = pytest.importorskip("streampass.sim.simulate").simulate
    gm = _small()
    sp.run(gm)
    sched = simulate(gm, cost="h100")
    svg = view.schedule_svg(sched)
    assert "<svg" in svg and "stream 1" in svg
    assert "makespan" in view.schedule_html(sched)


def _lanes_top_to_bottom(svg: str) -> list[int]:
    """Stream of each drawn lane, top to bottom (a cluster's box starts at its top-left corner)."""
    import re

    tops = re.findall(
        r"<title>cluster_stream_(\d+)</title>.*?<(?:path|polygon)[^>]*(?:d=\"M|points=\")[\d.\-]+,([\d.\-]+)", svg, re.S
    )
    return [int(s) for s, _ in sorted(tops, key=lambda t: float(t[1]))]


@pytest.mark.parametrize("seed", range(6))
def test_lanes_are_drawn_in_stream_order(seed):
    """dot alone drew these lanes in stream order for 3 of 24 random graphs (and 2, 0, 1 for the demo)."""
    from streampass.synthetic import random_stream_graph

    _need_dot()
    gm = random_stream_graph(40, 4, seed=seed)
    for _ in range(2):  # before and after run
        lanes = _lanes_top_to_bottom(view.render_svg(gm, engine="dot"))
        assert lanes == sorted(lanes) and lanes[0] == 0 and len(lanes) >= 2, lanes
        sp.run(gm)


def test_moving_a_spline_bends_it_from_its_tail_to_its_head():
    assert render._moved("1,2", 10) == "1,12.00"
    assert render._moved("e,5,0 0,0 1,0 2,0", 0, 30) == "e,5,30.00 0,0.00 1,15.00 2,30.00"
    assert render._moved("s,0,0 0,0 9,9", 4, 8) == "s,0,4.00 0,4.00 9,17.00"

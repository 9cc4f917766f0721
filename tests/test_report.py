"""The HTML report: `streampass demo --html`, `streampass inspect`, rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import streampass as sp
from streampass import cli
from streampass.sim.cost import CostModel
from streampass.view.report import build_report

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    # no fetched resources: only XML namespace URIs may mention http
    for m in re.finditer(r'(?:src|href)\s*=\s*"([^"]*)"', page):
        assert not m.group(1).startswith(("http:", "https:", "//")), m.group(0)
    assert "@import" not in page and "url(http" not in page
    assert "<!DOCTYPE svg" not in page  # inline SVG has its prologue stripped


def test_demo_writes_html_and_keeps_its_printout(tmp_path, capsys):
    path = tmp_path / "out" / "demo.html"
    assert cli.main(["demo", "--html", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hazards before the pass: 14" in out and "hazards after the pass: 0" in out
    # hazards name the kernels that touch memory, never a view (t, detach) that launches nothing
    assert not re.search(r"\] (t|t_\d|detach)\b", out)
    assert f"HTML report: {path.resolve()}" in out
    page = path.read_text()
    _self_contained(page)
    for section in ("Before the pass", "What the pass changed", "After the pass", "Waits added"):
        assert section in page
    assert page.count("<svg") >= 2
    assert "mm_1 on stream 0 reads addmm" in page  # a hazard message (table and tooltip)


def test_demo_default_html_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo"]) == 0
    assert (tmp_path / "streampass-demo.html").is_file()


def test_inspect_module_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "sp_user_model.py").write_text(
        textwrap.dedent(
            """
            import torch
            import streampass as sp

            def fn(x, w):
                h = x @ w
                with sp.stream(1):
                    g = torch.tanh(h)
                return h + g
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "inspect.html"
    rc = cli.main(["inspect", "sp_user_model:fn", "--shapes", "8x16,16x4", "--html", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "streams: [0, 1]" in out and "hazards after the pass: 0" in out
    assert "HTML report:" in out
    _self_contained(path.read_text())


def test_inspect_sees_stream_contexts_in_process(tmp_path, monkeypatch, capsys):
    # in the same process as other compiles (the CLI tests run it in a fresh one)
    (tmp_path / "sp_user_streams.py").write_text(
        textwrap.dedent(
            """
            import torch

            SIDE = torch.Stream("cpu")

            def fn(x):
                with SIDE:
                    y = x.sin()
                return y + 1
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["inspect", "sp_user_streams:fn", "--shapes", "4", "--html", ""]) == 0
    out = capsys.readouterr().out
    assert "streams: [0, 1]" in out and "hazards after the pass: 0" in out, out
    assert "make_fx" not in out


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_inspect_exported_program(tmp_path, capsys, strict):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            with sp.stream(1):
                y = self.lin(x).cos()
            return y + x

    # strict export traces sp.stream with dynamo, non-strict (torch's default) as Python under
    # make_fx; the annotation survives both, and save/load
    ep = torch.export.export(M(), (torch.randn(2, 8),), strict=strict)
    assert {n.meta.get("custom", {}).get("stream") for n in ep.graph.nodes if n.op == "call_function"} == {1, None}
    pt2 = tmp_path / "m.pt2"
    torch.export.save(ep, str(pt2))
    path = tmp_path / "m.html"
    rc = cli.main(["inspect", str(pt2), "--html", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "stream 1:" in out and "hazards after the pass: 0" in out
    assert "What the pass changed" in path.read_text()


class _TorchStreams(torch.nn.Module):
    def forward(self, x):
        s1, s2 = torch.Stream("cpu"), torch.Stream("cpu")
        with s1:
            a = x.cos()
        with s2:
            b = x.sin()
        return a + b


@pytest.mark.parametrize(
    "strict, says",
    [
        # dynamo numbers the first torch.Stream 0 on CPU, and the file keeps no object table
        (True, "if the program ran them on a torch.Stream, this file cannot say so"),
        # non-strict export runs torch.Stream as Python: nothing of it reaches the graph
        (False, "torch.export records torch.Stream blocks only with strict=True"),
    ],
    ids=["strict", "non-strict"],
)
def test_inspect_says_what_an_exported_file_cannot_tell(tmp_path, capsys, strict, says):
    ep = torch.export.export(_TorchStreams(), (torch.randn(2, 8),), strict=strict)
    pt2 = tmp_path / "streams.pt2"
    torch.export.save(ep, str(pt2))
    assert cli.main(["inspect", str(pt2), "--html", ""]) == 0
    out = capsys.readouterr().out
    assert says in out, out


def test_inspect_of_an_exported_sp_stream_program_adds_no_caveat(tmp_path, capsys):
    class M(torch.nn.Module):
        def forward(self, x):
            with sp.stream(1):
                y = x.cos()
            return y + x

    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(M(), (torch.randn(2, 8),), strict=True), str(pt2))
    assert cli.main(["inspect", str(pt2), "--html", ""]) == 0
    out = capsys.readouterr().out
    assert "stream 1:" in out and "torch.export" not in out, out


def test_inspect_rejects_bad_target(capsys):
    assert cli.main(["inspect", "no_colon_here"]) == 2
    assert "module:function" in capsys.readouterr().err


def _chromium() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "headless Chromium is needed to render the HTML report and was not found "
        f"(looked for {', '.join(CHROMIUM_NAMES)}): apt-get install -y chromium"
    )


def test_report_renders_in_headless_chromium(tmp_path):
    from matplotlib import image

    from streampass.commands import trace_demo

    gm, _ = trace_demo()
    import copy

    before = copy.deepcopy(gm)
    sp.run(gm)
    page = tmp_path / "report.html"
    page.write_text(build_report(before, gm, title="chromium check"))
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={shot}",
                "--window-size=1200,900",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
        )
    assert shot.is_file(), proc.stderr.decode(errors="replace")[-2000:]
    px = image.imread(str(shot))[..., :3]  # floats in [0, 1]
    assert px.shape[0] >= 800 and px.shape[1] >= 1100
    non_white = (px < 0.94).any(axis=-1).mean()
    assert 0.02 < non_white < 0.9, f"screenshot looks blank or broken: {non_white:.1%} non-white pixels"
    red = ((px[..., 0] > 0.7) & (px[..., 1] < 0.35) & (px[..., 2] < 0.35)).sum()
    assert red > 50, "no red (hazard) pixels in the rendered report"


def _chromium_flags(profile: str) -> list[str]:
    return [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}",
    ]  # fmt: skip


_MEASURE = """<script>
window.addEventListener("load", () => {
  const boxes = [...document.querySelectorAll(".sp-svg")].map(b => {
    const svg = b.querySelector("svg"); const r = svg.getBoundingClientRect();
    // the lanes as drawn, top to bottom: each cluster's title and the top of its box on screen
    const lanes = [...svg.querySelectorAll("g.cluster")].map(c => ({
      name: c.querySelector("title").textContent, top: c.getBoundingClientRect().top}))
      .sort((a, b) => a.top - b.top).map(l => l.name);
    return {scroll: b.scrollWidth, client: b.clientWidth, svg: r.width, lanes};
  });
  document.body.setAttribute("data-layout", JSON.stringify({page: document.documentElement.scrollWidth,
    window: window.innerWidth, boxes}));
});
</script>"""


def test_report_layout_at_1400px(tmp_path):
    """What a person sees at 1400 px: drawings fit the page, captions once, counts that agree."""
    import copy
    import html as html_lib
    import json

    from streampass.commands import trace_demo

    gm, _ = trace_demo()
    before = copy.deepcopy(gm)
    sp.run(gm)
    page = build_report(before, gm, title="layout check")
    # every drawing's caption once; its node total is the table's
    captions = re.findall(r"<text[^>]*>(\d+ of \d+ node\(s\) drawn[^<]*)</text>", page)
    assert len(captions) == 2, captions  # one per drawing, in the drawing
    assert not re.search(r'<p class="sp-note">[^<]*node\(s\) drawn', page)  # and not again above it
    tables = re.findall(r'<section id="(before|after)">.*?</section>', page, flags=re.S)
    assert len(tables) == 2
    for section, caption in zip(("before", "after"), captions):
        body = re.search(rf'<section id="{section}">(.*?)</section>', page, flags=re.S).group(1)
        nodes = [int(row[1]) for row in re.findall(r"<tr><td>(\d+)(?: \(ambient\))?</td><td>(\d+)</td>", body)]
        total = int(re.search(r"of (\d+) node", caption).group(1))
        assert sum(nodes) == total, (section, nodes, caption)
    # all hazards went away: said in one line, not a second copy of the table
    changes = re.search(r'<section id="changes">(.*?)</section>', page, flags=re.S).group(1)
    assert "what can go wrong" not in changes and "all of them" in changes
    # the schedule: its summary once (in the page, not again in the chart), and a legend
    sched = re.search(r'<section id="schedule">(.*?)</section>', page, flags=re.S).group(1)
    summary = re.search(r'<p class="sp-note">([^<]*)</p>', sched).group(1)
    assert sched.count(summary[:40]) == 1 and "kernel on stream 0" in sched and "critical path" in sched

    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", _MEASURE + "</body>"))
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            _chromium_flags(profile) + ["--window-size=1400,1000", "--dump-dom", path.resolve().as_uri()],
            capture_output=True, timeout=120,
        )  # fmt: skip
    dom = proc.stdout.decode(errors="replace")
    found = re.search(r'data-layout="([^"]*)"', dom)
    assert found, proc.stderr.decode(errors="replace")[-2000:]
    layout = json.loads(html_lib.unescape(found.group(1)))
    assert layout["page"] <= layout["window"], layout  # no horizontal scrolling
    assert len(layout["boxes"]) == 3  # two drawings and the schedule
    for box in layout["boxes"]:
        assert box["scroll"] <= box["client"] + 1 and box["svg"] <= box["client"] + 1, layout
    # lanes top to bottom in stream order, the ambient stream first (dot alone drew 2, 0, 1)
    drawings = [box["lanes"] for box in layout["boxes"] if box["lanes"]]
    assert drawings == [["cluster_stream_0", "cluster_stream_1", "cluster_stream_2"]] * 2, drawings


def test_cli_module_runs_without_html():
    proc = subprocess.run(
        [sys.executable, "-m", "streampass.cli", "demo", "--html", ""], capture_output=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert b"hazards after the pass: 0" in proc.stdout
    assert b"HTML report" not in proc.stdout  # --html '' writes none


@pytest.mark.parametrize("cost, title", [(None, "h100"), ("a100", "a100"), (CostModel("h200"), "h200")])
def test_report_simulates_with_a_profile_name_a_cost_model_or_the_default(cost, title):
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        with sp.stream(1):
            y = x.sin()
        return y + x.cos()

    gm = make_fx(f)(torch.ones(4))
    sp.run(gm)
    page = build_report(gm, cost=cost, cpu_launch=True)
    assert f"<h2>Simulated schedule ({title})</h2>" in page

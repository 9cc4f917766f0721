"""The benchmark script's own measuring helpers (benchmarks/run.py), on small graphs."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import streampass as sp
from streampass.synthetic import random_stream_graph

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import run as run_bench


@pytest.mark.parametrize("family", ["regions", "interleaved"])
def test_edit_floor_replays_exactly_streampass_edits(family):
    template = run_bench.synthetic_graph(300, family, seed=3)
    result = copy.deepcopy(template)
    sp.run(result)
    script, dropped = run_bench.edit_script(template, result)
    kinds = {step[0] for step in script}
    assert {"keep", "new"} <= kinds and kinds & {"swap", "edit"}  # old nodes re-pointed, new ones added
    assert sum(step[0] == "new" for step in script) == len(result.graph.nodes) - len(template.graph.nodes) + len(
        dropped
    )
    # edit_floor checks the replayed copy against the result node for node, and times it.
    assert run_bench.edit_floor(template, result, repeats=1) > 0
    # The template itself is untouched (each replay works on a copy).
    assert [n.name for n in template.graph.nodes] != [n.name for n in result.graph.nodes]


def test_edit_floor_replays_annotations_and_erased_fork_join():
    """fork/join graphs: streampass annotates the region's nodes and erases the fork/join nodes."""
    template = run_bench.lazy(random_stream_graph(150, 3, seed=5, style="fork_join"))
    result = copy.deepcopy(template)
    sp.run(result)
    script, dropped = run_bench.edit_script(template, result)
    assert dropped and any(step[0] == "edit" and step[5] is not run_bench._SAME for step in script)
    assert run_bench.edit_floor(template, result, repeats=1) > 0


def test_edit_floor_refuses_a_replay_that_does_not_reproduce_the_output(monkeypatch):
    template = run_bench.synthetic_graph(200, "regions", seed=4)
    result = copy.deepcopy(template)
    sp.run(result)
    script, dropped = run_bench.edit_script(template, result)
    i = next(i for i, step in enumerate(script) if step[0] in ("swap", "edit"))
    script[i] = ("keep", script[i][1])  # forget one re-pointed node
    monkeypatch.setattr(run_bench, "edit_script", lambda t, r: (script, dropped))
    with pytest.raises(RuntimeError, match="did not reproduce"):
        run_bench.edit_floor(template, result, repeats=1)


def test_swaps_only_for_plain_input_swaps():
    g = torch.fx.Graph()
    x, y, z = (g.placeholder(n) for n in "xyz")
    assert run_bench._swaps((x, [z], 1), (y, [z], 1)) == [("x", "y")]
    assert run_bench._swaps((x, x), (y, y)) == [("x", "y")]
    assert run_bench._swaps((x, x), (x, y)) is None  # replace_input_with would swap both
    assert run_bench._swaps((x, 1), (y, 2)) is None  # a constant changed
    assert run_bench._swaps((x,), (y, z)) is None  # another structure


def test_compile_reads_counts_one_reading_per_graph(tmp_path, capsys):
    """benchmarks/compile_reads.py on one layer: it sees the forward and the backward graph, each
    read once, and writes what it printed (timings are not checked: benchmarks are not tests)."""
    import json

    import compile_reads

    out = tmp_path / "reads.json"
    assert compile_reads.main(["--layers", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["graphs"]
    assert [r["graph"] for r in rows] == ["forward", "backward"]
    assert [r["reads"] for r in rows] == [1, 1]
    assert all(r["streampass_s"] > 0 and r["torch_s"] > 0 and r["waits_added"] > 0 for r in rows)
    assert "| forward |" in capsys.readouterr().out


@pytest.mark.usefixtures("fresh_caches")
def test_gpu_assign_dry_run_compiles_both_ways_and_reads_the_prediction(tmp_path):
    """benchmarks/gpu_assign.py, the issue-15 wall-time script a lent GPU runs, on CPU with tiny
    sizes (every aten kernel priced 100 us, so that side streams pay): both compiles of each
    program agree, the assignment placed side streams, and the simulator's prediction is read from
    the forward and the backward the pass saw. Timings are not checked."""
    import json

    import gpu_assign

    out = tmp_path / "gpu_assign.json"
    only = ["MoE (4 experts)", "MLP (2 layers), training step"]
    assert gpu_assign.main(["--cpu-dry-run", "--only", *only, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["programs"]
    assert [r["program"] for r in rows] == only
    assert [r["graphs"] for r in rows] == [["inference"], ["forward", "backward"]]
    for r in rows:
        assert r["results_match"] and r["side_streams"] >= 1, r
        assert r["predicted_speedup"] > 1 and r["one_stream_s"] > 0 and r["auto_s"] > 0, r


def test_sync_lookup_times_each_lookup_and_checks_its_answer(tmp_path, capsys):
    """benchmarks/sync_lookup.py with a few calls: every lookup it times answered the object it
    must (the script asserts it), the baseline is its first row (timings are not checked)."""
    import json

    import sync_lookup

    out = tmp_path / "lookup.json"
    assert sync_lookup.main(["--number", "10", "--repeat", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["lookup"].endswith("(baseline)") and rows[0]["ratio"] == 1
    assert len(rows) == 5 and all(r["us"] > 0 for r in rows)
    assert "own event (EVENT_BASE + 7)" in capsys.readouterr().out

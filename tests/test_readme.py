"""The Python examples of the README and of docs/ run as pasted, each in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks(path: str = "README.md") -> list[str]:
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    return [textwrap.dedent(b) for b in re.findall(r"^ *```python\n(.*?)^ *```", text, flags=re.S | re.M)]


BLOCKS = _python_blocks()
DOCS = {
    f"{name}-{i}": block
    for name in sorted(os.listdir(os.path.join(ROOT, "docs")))
    if name.endswith(".md")
    for i, block in enumerate(_python_blocks(os.path.join("docs", name)))
}


def test_readme_has_the_examples():
    assert len(BLOCKS) >= 2
    assert any("loss.backward()" in b and "enabled()" in b for b in BLOCKS)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs_as_pasted(code, tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    if "loss.backward()" in code:
        lines = [line for line in out.stdout.splitlines() if line.startswith("streampass [")]
        assert [line.split(",")[0] for line in lines] == ["streampass [forward", "streampass [backward"] * 2
        assert all("-> 0 after" in line for line in lines)


def test_docs_have_examples():
    assert {"assign.md-0", "cost_model.md-0", "inductor.md-0", "simulator.md-0", "views.md-0"} <= set(DOCS)


@pytest.mark.parametrize("name", DOCS)
def test_docs_block_runs_as_pasted(name, tmp_path):
    """Every Python block of docs/ defines what it uses (they used a `gm` from nowhere)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", DOCS[name]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]

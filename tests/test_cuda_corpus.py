"""PyTorch's own user-stream programs compiled under StreamPass on CUDA.

The corpus harness (tests/test_corpus.py) runs in a child pytest with
``STREAMPASS_CORPUS_DEVICE=cuda``: the programs' streams, events and inputs are then CUDA ones,
no CPU stand-in is used, the programs run on the real current stream, and the syncs that ran are
counted by the profiler. A child process because the device is chosen when the corpus module is
imported, and this process may already hold the CPU corpus.

Skipped without CUDA (CI has none). On a GPU machine: ``python -m pytest tests/test_cuda_corpus.py``
or ``.ci/device``, which also keeps the child's JUnit report (``STREAMPASS_CUDA_CORPUS_XML``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HERE = Path(__file__).resolve().parent


def _workers() -> list[str]:
    """pytest-xdist workers where it is installed: 102 inductor compiles take minutes serially."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", str(min(8, os.cpu_count() or 1))]


def test_corpus_on_cuda(tmp_path):
    xml = Path(os.environ.get("STREAMPASS_CUDA_CORPUS_XML", tmp_path / "corpus.xml"))
    env = {**os.environ, "STREAMPASS_CORPUS_DEVICE": "cuda", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pytest", str(HERE / "test_corpus.py"), "-q", "-p", "no:cacheprovider"]
    child = subprocess.run(
        [*cmd, *_workers(), f"--junitxml={xml}"], env=env, cwd=HERE.parent, capture_output=True, text=True
    )
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = [
        case.get("name")
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    ran = int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
    assert child.returncode == 0 and not failed, f"{len(failed)} of {ran} failed: {failed}\n{child.stdout[-6000:]}"
    assert ran >= 90  # the whole corpus ran (the CPU run checks which programs this torch leaves out)

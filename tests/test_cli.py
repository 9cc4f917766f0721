"""The command line as a person meets it: fast help, one-line errors with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*argv, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "streampass", *argv], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_help_and_version_need_no_torch():
    code = (
        "import sys, contextlib, io\n"
        "from streampass import cli\n"
        "for argv in (['--help'], ['--version'], ['inspect']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try: cli.main(argv)\n"
        "        except SystemExit: pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_python_dash_m_and_version():
    out = _run("--version")
    assert out.returncode == 0 and out.stdout.strip().startswith("streampass ")
    helped = _run("--help")
    assert helped.returncode == 0 and "``" not in helped.stdout and "inspect" in helped.stdout


@pytest.fixture
def user_folder(tmp_path):
    (tmp_path / "mymod.py").write_text(
        textwrap.dedent("""
        import torch
        import streampass as sp

        def f(x, w):
            with sp.stream(1):
                y = x @ w
            return y + 1

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                with sp.stream(1):
                    y = self.lin(x)
                return y.relu()

        class NeedsArgs(torch.nn.Module):
            def __init__(self, width):
                super().__init__()
    """)
    )
    return tmp_path


def test_inspect_finds_a_module_in_the_current_folder(user_folder):
    out = _run("inspect", "mymod:f", "--shapes", "8x4,4x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "hazards after the pass: 0" in out.stdout


def test_inspect_builds_a_module_class(user_folder):
    out = _run("inspect", "mymod:Block", "--shapes", "2x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "stream 1:" in out.stdout and "hazards after the pass: 0" in out.stdout


ERRORS = {
    "bad shape": (["mymod:f", "--shapes", "8by16"], "is not a shape"),
    "no shapes": (["mymod:f"], "give --shapes one shape per tensor argument"),
    "class with arguments": (["mymod:NeedsArgs", "--shapes", "2x4"], "name a function that builds"),
    "bad dtype": (["mymod:f", "--shapes", "8x4,4x4", "--dtype", "float33"], "torch has no dtype 'float33'"),
    "missing pt2": (["nowhere.pt2"], "no such file: nowhere.pt2"),
    "bad module": (["not_a_module_here:f", "--shapes", "2x2"], "cannot import module 'not_a_module_here'"),
    "bad attribute": (["mymod:g", "--shapes", "2x2"], "has no attribute 'g'"),
    "no colon": (["mymod"], "module:function"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_inspect_errors_are_one_line_and_exit_2(case, user_folder):
    argv, says = ERRORS[case]
    out = _run("inspect", *argv, "--html", "", cwd=user_folder)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_debug_shows_the_traceback(user_folder):
    out = _run("--debug", "inspect", "mymod:f", "--shapes", "8by16", "--html", "", cwd=user_folder)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_demo_prints_no_warning():
    out = _run("demo", "--html", "")
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr

"""The command line as a person meets it: fast help, one-line errors with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*argv, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}  # TORCH_LOGS keeps torch's logs
    return subprocess.run(
        [sys.executable, "-m", "streampass", *argv], capture_output=True, text=True, cwd=cwd, timeout=300, env=env
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

        class Towers(torch.nn.Module):
            # four independent projections: large enough (on meta) for side streams to pay

            def __init__(self, width=2048):
                super().__init__()
                self.towers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(4))

            def forward(self, x):
                return sum(t(x).relu() for t in self.towers)

        def make_towers():
            return Towers()

        def make_nothing():
            return 3

        def views_only(x):
            return x.view(-1), x[0]

        side, other = torch.Stream("cpu"), torch.Stream("cpu")

        def torch_streams(x, w):
            # plain torch streams, no streampass in the program
            with side:
                y = x @ w
            with other:
                z = x.relu()
            return y + z

        class Tokens(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(10, 4)

            def forward(self, idx):
                return self.emb(idx)

        def breaks(x, w):
            y = x @ w
            torch._dynamo.graph_break()
            return y.relu()

        def matmul_and_chain(x, w, y):
            a, b = x @ w, y
            for _ in range(8):
                b = (b * 1.5).relu()  # one kernel once inductor fuses the chain
            return a, b
    """)
    )
    (tmp_path / "fake.pt2").write_text("not a program torch.export wrote")
    return tmp_path


def test_inspect_finds_a_module_in_the_current_folder(user_folder):
    out = _run("inspect", "mymod:f", "--shapes", "8x4,4x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "hazards after the pass: 0" in out.stdout


def test_inspect_builds_a_module_class(user_folder):
    out = _run("inspect", "mymod:Block", "--shapes", "2x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "stream 1:" in out.stdout and "hazards after the pass: 0" in out.stdout


def test_inspect_sees_torch_stream_blocks(user_folder):
    out = _run("inspect", "mymod:torch_streams", "--shapes", "8x4,4x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "streams: [0, 1, 2]" in out.stdout and "hazards after the pass: 0" in out.stdout, out.stdout
    assert "make_fx" not in out.stdout


def test_assign_keeps_torch_stream_blocks_as_the_user_wrote_them(user_folder):
    out = _run("assign", "mymod:torch_streams", "--shapes", "8x4,4x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "fixed by user annotation (stream 1): mm" in out.stdout, out.stdout
    assert "fixed by user annotation (stream 2): relu" in out.stdout, out.stdout


def test_inspect_says_why_when_dynamo_cannot_capture_one_graph(user_folder):
    out = _run("inspect", "mymod:breaks", "--shapes", "8x4,4x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "torch.compile could not capture it as one graph" in out.stdout, out.stdout
    assert "traced with make_fx instead" in out.stdout


ERRORS = {
    "bad shape": (["mymod:f", "--shapes", "8by16"], "is not a shape"),
    "no shapes": (["mymod:f"], "give --shapes one shape per tensor argument"),
    "class with arguments": (["mymod:NeedsArgs", "--shapes", "2x4"], "name a function that builds"),
    "bad dtype": (["mymod:f", "--shapes", "8x4,4x4", "--dtype", "float33"], "torch has no dtype 'float33'"),
    # random inputs need a float dtype: it was torch's "normal_kernel_cpu not implemented for 'Long'"
    "integer dtype": (["mymod:f", "--shapes", "8x4,4x4", "--dtype", "int64"], "int64 is not a floating-point dtype"),
    "empty shape": (["mymod:f", "--shapes", "8x4,,4x4"], "an empty shape between commas"),  # was dropped
    "missing pt2": (["nowhere.pt2"], "no such file: nowhere.pt2"),
    "bad module": (["not_a_module_here:f", "--shapes", "2x2"], "cannot import module 'not_a_module_here'"),
    "bad attribute": (["mymod:g", "--shapes", "2x2"], "has no attribute 'g'"),
    "no colon": (["mymod"], "module:function"),
    # torch.export logs the deserialization traceback, fake tensors the failing meta kernel's:
    # both are silenced, the error is still the one line
    "not a pt2 program": (["fake.pt2"], "fake.pt2 is not a program torch.export.save wrote (BadZipFile"),
    "shapes that do not fit": (["mymod:f", "--shapes", "4x3,4x4"], "cannot be multiplied (4x3 and 4x4)"),
    # an embedding's token ids: the hint said "give --shapes one shape per tensor argument"
    "integer inputs": (["mymod:Tokens", "--shapes", "2x3"], "the random inputs are floating-point (--dtype)"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_inspect_errors_are_one_line_and_exit_2(case, user_folder):
    argv, says = ERRORS[case]
    out = _run("inspect", *argv, "--html", "", cwd=user_folder)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_debug_shows_the_traceback_with_the_same_status(user_folder):
    out = _run("--debug", "inspect", "mymod:f", "--shapes", "8by16", "--html", "", cwd=user_folder)
    assert out.returncode == 2 and "Traceback" in out.stderr  # not 1, which says that hazards remain


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly():
    """``streampass demo | head -1``, the reader gone before the first write: no
    ``BrokenPipeError`` line, and SIGPIPE's status."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails at once
    try:
        out = subprocess.run(
            [sys.executable, "-m", "streampass", "demo", "--html", ""],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert out.returncode == 141 and out.stderr == "", out.stderr


def test_debug_keeps_torch_s_own_logs(user_folder):
    quiet = _run("inspect", "mymod:f", "--shapes", "4x3,4x4", "--html", "", cwd=user_folder)
    loud = _run("--debug", "inspect", "mymod:f", "--shapes", "4x3,4x4", "--html", "", cwd=user_folder)
    assert quiet.returncode == 2 and len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    assert loud.returncode == 2 and "Traceback" in loud.stderr
    # torch's log lines carry the file that logged them (E1204 08:42:03.412000 pid torch/...py:3090])
    assert any(line[:1] in "WE" and "torch/" in line and "] " in line for line in loud.stderr.splitlines()), loud.stderr


def test_quiet_torch_logs_silences_torch_s_loggers_and_puts_their_levels_back():
    import logging

    import torch  # noqa: F401  (its loggers and their levels exist once it is imported)

    from streampass.cli import quiet_torch_logs

    names = ["torch", "torch.export", "torch._dynamo", "torch._subclasses.fake_tensor"]
    levels = {n: logging.getLogger(n).level for n in names}
    assert logging.getLogger("torch._subclasses.fake_tensor").isEnabledFor(logging.ERROR)
    with quiet_torch_logs():
        assert not any(logging.getLogger(n).isEnabledFor(logging.CRITICAL) for n in names)
        assert not logging.getLogger("torch.made_during_the_command").isEnabledFor(logging.CRITICAL)
        assert logging.getLogger("mymod").isEnabledFor(logging.ERROR)  # the user's own logs stay
    assert {n: logging.getLogger(n).level for n in names} == levels
    assert logging.getLogger("torch._subclasses.fake_tensor").isEnabledFor(logging.ERROR)
    with quiet_torch_logs(quiet=False):
        assert logging.getLogger("torch._subclasses.fake_tensor").isEnabledFor(logging.ERROR)


def test_cli_errors_leave_torch_s_log_levels_as_they_were(user_folder, monkeypatch, capsys):
    import logging

    from streampass import cli

    monkeypatch.chdir(user_folder)
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    levels = {n: log.level for n, log in logging.root.manager.loggerDict.items() if isinstance(log, logging.Logger)}
    assert cli.main(["inspect", "fake.pt2", "--html", ""]) == 2
    assert "is not a program torch.export.save wrote" in capsys.readouterr().err
    after = {n: log.level for n, log in logging.root.manager.loggerDict.items() if isinstance(log, logging.Logger)}
    assert {n: after[n] for n in levels} == levels


def test_assign_with_a_huge_max_streams_answers_at_once(user_folder):
    # it used to build a slot per stream asked for: 10**9 ran out of memory
    out = _run(
        "assign", "mymod:make_towers", "--shapes", "4096x2048", "--meta", "--max-streams", "1000000000",
        "--html", "", cwd=user_folder,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "0 after" in out.stdout and "with streams [0, 1" in out.stdout, out.stdout


def test_demo_prints_no_warning():
    out = _run("demo", "--html", "")
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr


def test_assign_chooses_streams_and_writes_the_report(user_folder):
    html = user_folder / "out" / "assign.html"
    out = _run("assign", "mymod:make_towers", "--shapes", "4096x2048", "--meta", "--html", str(html), cwd=user_folder)
    assert out.returncode == 0, out.stderr
    chose = next(line for line in out.stdout.splitlines() if line.startswith("predicted:"))
    used = chose.split("with streams ")[1].split("]")[0]
    assert used.count(",") >= 1, out.stdout  # more than the ambient stream
    one, mine = (float(x.split(" us")[0].split()[-1]) for x in (chose.split(", ")[-1], chose.split(" with")[0]))
    assert mine < one
    assert "hazards" not in out.stderr and "0 after" in out.stdout
    page = html.read_text(encoding="utf-8")
    assert '<section id="schedule">' in page and "streampass assign mymod:make_towers" in page


def test_assign_keep_fusions_prices_the_chain_inductor_fuses_as_one_kernel(user_folder):
    html = user_folder / "fused.html"
    shapes = ("--shapes", "4096x4096,4096x4096,1024x1024", "--dtype", "bfloat16", "--meta")
    per_op = _run("assign", "mymod:matmul_and_chain", *shapes, "--html", "", cwd=user_folder)
    fused = _run("assign", "mymod:matmul_and_chain", *shapes, "--keep-fusions", "--html", str(html), cwd=user_folder)
    assert per_op.returncode == 0 and fused.returncode == 0, per_op.stderr + fused.stderr
    assert "with streams [0, 1]" in per_op.stdout, per_op.stdout  # 16 kernels worth overlapping
    assert "with streams [0]" in fused.stdout and "inductor's fusions kept" in fused.stdout, fused.stdout
    predicted = next(line for line in fused.stdout.splitlines() if line.startswith("predicted:"))
    us = predicted.split(" us")[0].split()[-1]
    # the report simulates the result with the model the choice was priced with
    assert f"simulated makespan {us} us" in html.read_text(encoding="utf-8")


def test_assign_keeps_small_programs_on_one_stream(user_folder):
    out = _run("assign", "mymod:f", "--shapes", "8x4,4x4", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "streams [0, 1]" in out.stdout  # the program's own stream 1 stays; nothing added


def test_assign_on_a_program_with_no_kernels_reports_it(user_folder):
    out = _run("assign", "mymod:views_only", "--shapes", "8x8", "--html", "", cwd=user_folder)
    assert out.returncode == 0, out.stderr
    assert "(no kernels to time)" in out.stdout and "0 after" in out.stdout, out.stdout


@pytest.mark.parametrize(
    "argv, says",
    [
        (["mymod:make_towers", "--shapes", "8x2048", "--cost", "b200"], "no device profile 'b200'"),
        (["mymod:make_towers", "--shapes", "8x2048", "--max-streams", "0"], "--max-streams must be at least 1"),
        (["mymod:make_nothing", "--shapes", "2x2"], "returns int, not a module"),
    ],
)
def test_assign_errors_are_one_line_and_exit_2(argv, says, user_folder):
    out = _run("assign", *argv, "--html", "", cwd=user_folder)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr


def test_demo_shows_the_automatic_streams_next_to_the_hand_written_ones():
    out = _run("demo", "--html", "")
    assert out.returncode == 0, out.stderr
    times = {}
    for line in out.stdout.splitlines():
        for label in ("one stream", "hand-written streams", "automatic"):
            if line.strip().startswith(label):
                times[label] = float(line.split(":", 1)[1].split(" us")[0])
    assert set(times) == {"one stream", "hand-written streams", "automatic"}, out.stdout
    assert times["automatic"] <= times["one stream"] and times["hand-written streams"] < times["one stream"]

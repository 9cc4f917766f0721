"""The ``streampass`` command line (also ``python -m streampass``).

Parsing, ``--help``, ``--version`` and usage errors need no torch: the commands themselves
(:mod:`streampass.commands`) are imported only to run one. An error is one line on stderr and
exit status 2, torch's own logs silenced while a command runs (:func:`quiet_torch_logs`);
``--debug`` shows the traceback and the logs instead (the status stays 2). Output into a pipe its
reader closed (``| head``) ends the command quietly, with status 141 as SIGPIPE would.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator

DESCRIPTION = (
    "Multi-stream correctness for PyTorch graphs: read which stream each node runs on, find the races, "
    "insert the fewest record/wait syncs, verify the result. "
    "demo runs it on an embedded model; inspect on yours; assign chooses the streams for you."
)


def parser() -> argparse.ArgumentParser:
    from streampass import __version__

    p = argparse.ArgumentParser(prog="streampass", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"streampass {__version__}")
    p.add_argument("--debug", action="store_true", help="on an error, show the traceback")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="trace the embedded model, report its streams and hazards, fix them")
    demo.add_argument(
        "--html", default="streampass-demo.html", metavar="PATH", help="write the HTML report here ('' for none)"
    )
    insp = sub.add_parser("inspect", help="report a torch.export .pt2 program or a module:function, fix it, write HTML")
    insp.add_argument(
        "target", metavar="TARGET", help="a .pt2 file (torch.export.save), module:function or module:ModuleClass"
    )
    insp.add_argument("--shapes", help="example input shapes for module:function, e.g. 8x16,16x4")
    insp.add_argument("--dtype", default="float32", help="dtype of the random example inputs (default float32)")
    insp.add_argument(
        "--html", default="streampass-inspect.html", metavar="PATH", help="write the HTML report here ('' for none)"
    )
    asg = sub.add_parser(
        "assign", help="choose streams for a module:function automatically, against one stream; write HTML"
    )
    asg.add_argument("target", metavar="TARGET", help="a .pt2 file, module:function or module:ModuleClass")
    asg.add_argument("--shapes", help="example input shapes for module:function, e.g. 8x16,16x4")
    asg.add_argument("--dtype", default="float32", help="dtype of the example inputs (default float32)")
    asg.add_argument(
        "--meta", action="store_true", help="trace on the meta device: real model sizes without the memory or time"
    )
    asg.add_argument("--cost", default="h100", help="device profile to price with: h100, h200, a100, cpu")
    asg.add_argument("--max-streams", type=int, default=4, help="at most this many streams, ambient included")
    asg.add_argument(
        "--keep-fusions",
        action="store_true",
        help="for a program you will torch.compile: keep what inductor fuses on one stream, priced as one kernel",
    )
    asg.add_argument(
        "--html", default="streampass-assign.html", metavar="PATH", help="write the HTML report here ('' for none)"
    )
    for cmd in (demo, insp, asg):
        cmd.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


@contextlib.contextmanager
def quiet_torch_logs(quiet: bool = True) -> Iterator[None]:
    """torch's loggers silent while a command runs, their levels put back after: torch.export
    and fake tensors log a traceback before raising the error the CLI reports in one line.
    ``--debug`` (``quiet=False``) and ``TORCH_LOGS`` (asked for by the user) keep them.

    >>> import logging
    >>> with quiet_torch_logs():
    ...     logging.getLogger("torch.export").isEnabledFor(logging.CRITICAL)
    False
    >>> logging.getLogger("torch.export").isEnabledFor(logging.CRITICAL)
    True
    """
    if not quiet or os.environ.get("TORCH_LOGS"):
        yield
        return
    # A torch logger without a level of its own (or created during the command) takes the
    # level of the nearest ancestor that has one: these are all that need it.
    known = logging.root.manager.loggerDict
    names = ["torch"] + [
        n for n, log in known.items() if n.startswith("torch.") and isinstance(log, logging.Logger) and log.level
    ]
    saved = [(log, log.level) for log in map(logging.getLogger, names)]
    try:
        for log, _ in saved:
            log.setLevel(logging.CRITICAL + 1)
        yield
    finally:
        for log, level in saved:
            log.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """The ``streampass`` console script; returns the exit status.

    >>> main(["demo", "--html", ""])  # doctest: +ELLIPSIS
    == streampass demo: ...
    0
    >>> main(["inspect", "no_colon_here"])
    2
    """
    args = parser().parse_args(argv)
    try:
        from streampass import commands

        with quiet_torch_logs(not args.debug):
            return {"demo": commands.demo, "inspect": commands.inspect, "assign": commands.assign}[args.command](args)
    except BrokenPipeError:  # ``streampass inspect ... | head``: the reader is done; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as if killed by SIGPIPE, as a C tool would be
    except Exception as e:
        if args.debug:
            traceback.print_exc()
            return 2  # still 2: 1 says that hazards remain
        from streampass.commands import UsageError

        what = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if isinstance(e, UsageError):
            print(f"streampass {args.command}: {what}", file=sys.stderr)
        else:
            print(
                f"streampass {args.command}: {type(e).__name__}: {what} (--debug shows the traceback)", file=sys.stderr
            )
        return 2


if __name__ == "__main__":
    sys.exit(main())

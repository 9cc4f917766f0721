"""What one sync's object lookup costs at run time, against dynamo's lookup of its own objects.

    python benchmarks/sync_lookup.py [--number 200000] [--repeat 7] [--out results.json]

Compiled code resolves every stream and event index it syncs with when it runs: inductor's
generated code calls ``graph_bytecode_inputs.get_external_object_by_index`` (torch 2.13) or
``_get_stream_by_index`` (2.15), which :func:`streampass.runtime.install_object_fallback`
routes through :func:`streampass.runtime.lookup`. The indices streampass allocates (events from
``EVENT_BASE``, ``sp.stream`` side streams) are not in dynamo's table and get the calling
thread's own objects. The baseline, in the same run, is dynamo's own lookup of an object it
registered (what every compiled program with a user ``torch.Stream`` pays). Printed:
microseconds per lookup (the best of ``--repeat`` runs of ``--number`` calls) and the ratio to
the baseline. No timed unit test: tests/test_benchmarks.py only checks the script runs and each
lookup answers the right object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import timeit
from collections.abc import Callable, Iterator

import torch
from torch._dynamo import graph_bytecode_inputs as table
from torch.fx.experimental.proxy_tensor import make_fx

import streampass as sp
from streampass import runtime
from streampass.transform.plan import EVENT_BASE


def _side_streams(x):
    with sp.stream(1):
        y = x.sin()
    return y + x.cos()


@contextlib.contextmanager
def _dynamo_table_kept() -> Iterator[None]:
    """Put dynamo's object table back as it was (a dict before torch 2.15, a list since)."""
    refs = table.index_to_external_object_weakref
    saved = refs.copy()
    try:
        yield
    finally:
        refs.clear()
        if isinstance(refs, dict):
            refs.update(saved)
        else:
            refs.extend(saved)


def cases(stack: contextlib.ExitStack) -> Iterator[tuple[str, Callable[[], object], object]]:
    """(name, the call timed, what it must answer: a type or the very object), in timing order:
    the last lookups run inside a call of a rewritten graph (its bind open on ``stack``)."""
    runtime.install_object_fallback()
    stack.enter_context(_dynamo_table_kept())
    user_stream = torch.Stream("cpu")
    table.store_user_object_weakrefs(user_stream)  # index 0: what dynamo's prologue does per call
    yield "dynamo's lookup, registered index (baseline)", lambda: runtime._DYNAMO_LOOKUP(0), user_stream
    yield "streampass lookup, registered index", lambda: runtime.lookup(0), user_stream
    yield "streampass lookup, own event (EVENT_BASE + 7)", lambda: runtime.lookup(EVENT_BASE + 7), torch.Event
    yield "streampass lookup, own side stream (index 3)", lambda: runtime.lookup(3), torch.Stream
    gm = make_fx(_side_streams)(torch.ones(2))
    sp.run(gm)
    graph_table = stack.enter_context(runtime.bind(gm))
    event = next(iter(graph_table.events))
    yield "streampass lookup, a bound graph's event", lambda: runtime.lookup(event), graph_table.events[event]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows, baseline = [], None
    with contextlib.ExitStack() as stack:
        for name, call, want in cases(stack):
            got = call()
            assert isinstance(got, want) if isinstance(want, type) else got is want, f"{name} answered {got!r}"
            us = min(timeit.repeat(call, number=args.number, repeat=args.repeat)) / args.number * 1e6
            baseline = baseline or us
            rows.append({"lookup": name, "us": us, "ratio": us / baseline})
            print(f"| {name} | {us:.3f} | {us / baseline:.2f} |")
    if args.out:
        meta = {"torch": torch.__version__, "python": sys.version.split()[0], "machine": platform.processor()}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

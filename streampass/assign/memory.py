"""A simple estimate of a schedule's peak live memory (the simulator does not model memory).

Each storage a kernel makes (not a view, not an in-place result) is live from the moment its
producer starts (its output exists while the kernel writes it) until the end of the last node
that uses it: a kernel reading it (through any view or alias) or a sync that carries it. That
last part is the deferral to the join: ``streampass.run`` makes a value made on one stream and
read on another ride through a wait on its producer's stream after the reads (``sync_dealloc``,
or a wait's passthrough), and the value is live until that wait ends. Graph outputs stay live to
the end of the schedule. Graph inputs and parameters are left out: they are the caller's memory,
the same for every assignment. Not modelled: the caching allocator's reuse and fragmentation, and
that Python frees a buffer when its last use is *issued*, not when it completes.
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from streampass import ops
from streampass.analysis.reading import read_streams
from streampass.sim.schedule import Schedule


def value_bytes(node: torch.fx.Node) -> int:
    """Bytes of the tensors in ``node.meta["val"]`` (0 when unknown or symbolic without a hint).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> x.meta["val"] = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    >>> value_bytes(x)
    64
    """
    total = 0
    for t in tree_flatten(node.meta.get("val"))[0]:
        if isinstance(t, torch.Tensor):
            with contextlib.suppress(Exception):  # a size without a hint
                total += int(t.numel()) * t.element_size()
    return total


def peak_bytes(gm: torch.fx.GraphModule, schedule: Schedule, external_events=()) -> int:
    """The estimate above, for ``gm`` as :func:`streampass.simulate` scheduled it.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: (x.sin() * 2).sum())(torch.empty(1024, device="meta"))
    >>> peak_bytes(gm, sp.simulate(gm))  # sin and mul live together, 4 KiB each
    8192
    """
    a = read_streams(gm, external_events)
    slots = schedule.slots
    owner = {n: a.producer.get(a.root[n], a.root[n]) for n in a.nodes}
    alloc: dict[torch.fx.Node, float] = {}
    free: dict[torch.fx.Node, float] = {}
    for n in a.nodes:
        slot = slots.get(n.name)
        if a.is_compute(n) and owner[n] is n and slot is not None:
            alloc[n] = slot.start
            free[n] = slot.end
    for n in a.nodes:
        if n.op == "output":
            end = schedule.makespan
        else:
            slot = slots.get(n.name)
            if slot is None:
                continue
            end = slot.end
        for inp in ops.input_nodes(n):
            o = owner.get(inp)
            if o in free and end > free[o]:
                free[o] = end
    events = []
    for n, t in alloc.items():
        size = value_bytes(n)
        if size:
            events.append((t, 1, size))
            events.append((free[n], 0, -size))  # at equal times, frees come first
    live = peak = 0
    for _, _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak

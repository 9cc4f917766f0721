"""A simple estimate of a schedule's peak live memory (the simulator does not model memory).

Each storage a kernel makes (not a view, not an in-place result) is live from the moment its
producer starts (its output exists while the kernel writes it) until the last of: the end of a
kernel reading it (through any view or alias), the end of a sync that carries it, and the issue
of a sync ordered after it. The carrying is the deferral to the join: ``streampass.run`` makes a
value made on one stream and read on another ride through a wait on its producer's stream after
the reads (``sync_dealloc``, or a wait's passthrough), and the value is live until that wait
ends. The ordering is the encoding: a ``control_deps`` sync takes the work it is ordered after as
arguments, which the program holds until it calls the sync. Graph outputs stay live to the end
of the schedule. Graph inputs and parameters are left out: they are the caller's memory, the
same for every assignment. Not modelled: the caching allocator's reuse and fragmentation, and
that Python frees a buffer when its last kernel read is *issued*, not when it completes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from streampass import ops
from streampass.analysis.reading import StreamAssignment, read_streams
from streampass.sim.schedule import Schedule
from streampass.sim.tensors import numel


def value_bytes(node: torch.fx.Node) -> int:
    """Bytes of the tensors in ``node.meta["val"]`` (0 when unknown or symbolic without a hint).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> x.meta["val"] = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    >>> value_bytes(x)
    64
    """
    val = node.meta.get("val")
    total = 0
    for t in (val,) if isinstance(val, torch.Tensor) else tree_flatten(val)[0]:
        # by hint: int() of a symbolic numel would guard on it and recompile for every size
        count = numel(t)
        if count is not None:
            total += count * t.element_size()
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
    span, holds = {}, []
    for n in a.nodes:
        slot = schedule.slots.get(n.name)
        if slot is None:
            continue
        span[n] = (slot.start, slot.end)
        call = a.syncs.get(n)
        if call is not None and call.wrapper is not None:
            holds.append((slot.issued, ordering_deps(call.wrapper)))
    return live_peak(a, span, schedule.makespan, holds)


def carried(call: ops.SyncCall) -> list[torch.fx.Node]:
    """The tensors a stream op holds until it completes: its own tensor arguments
    (``sync_dealloc``, ``record_stream``) and what its ``control_deps`` wrapper passes through."""
    own = [x for x in call.args if isinstance(x, torch.fx.Node)]
    return own + ops.passthrough_values(call.wrapper) if call.wrapper is not None else own


def ordering_deps(wrapper: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes a ``control_deps`` wrapper is ordered after (its first argument): the program
    holds them until the wrapper is issued, not until it completes."""
    return [x for x in wrapper.args[0] if isinstance(x, torch.fx.Node)]


class LivePeak:
    """The estimate for one reading, prepared once: who owns each storage, what each node reads
    or carries, how big each allocation is. None of it depends on streams, so a search that
    prices many assignments of one graph (``assign.price``) builds it once and calls it per
    candidate; :func:`live_peak` is the one-off form.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> a = sp.read_streams(make_fx(lambda x: (x.sin() * 2).sum())(torch.empty(1024, device="meta")))
    >>> sin, mul, total = (a.node_named(k) for k in ("sin", "mul", "sum_1"))
    >>> LivePeak(a)({sin: (0.0, 1.0), mul: (1.0, 2.0), total: (2.0, 3.0)}, 3.0)  # sin and mul overlap at 1.0
    8192
    """

    def __init__(self, a: StreamAssignment):
        owner = {n: a.producer.get(a.root[n], a.root[n]) for n in a.nodes}
        self.owner = owner
        # (kernel, bytes) for the storages kernels make
        self.allocs = [(n, value_bytes(n)) for n in a.nodes if a.is_compute(n) and owner[n] is n]
        mine = {n for n, _ in self.allocs}
        # (node, is the output, the allocations it reads or carries): kept alive until it ends
        self.reads: list[tuple[torch.fx.Node, bool, list[torch.fx.Node]]] = []
        for n in a.nodes:
            call = a.syncs.get(n)
            owners = [owner.get(inp) for inp in (ops.input_nodes(n) if call is None else carried(call))]
            owners = [o for o in owners if o in mine]
            if owners:
                self.reads.append((n, n.op == "output", owners))

    def __call__(self, span: Mapping, makespan: float, holds: Iterable = ()) -> int:
        """Peak bytes for the schedule ``span`` (node -> (start, end) of the nodes it runs),
        ``makespan``, and ``holds`` (as :func:`live_peak`'s)."""
        alloc: dict[torch.fx.Node, float] = {}
        free: dict[torch.fx.Node, float] = {}
        for n, _ in self.allocs:
            s = span.get(n)
            if s is not None:
                alloc[n], free[n] = s
        for n, is_output, owners in self.reads:
            if is_output:
                end = makespan
            else:
                s = span.get(n)
                if s is None:
                    continue
                end = s[1]
            for o in owners:
                if o in free and end > free[o]:
                    free[o] = end
        owner = self.owner
        for end, values in holds:
            for v in values:
                o = owner.get(v)
                if o in free and end > free[o]:
                    free[o] = end
        events = []
        for n, size in self.allocs:
            if size and n in alloc:
                events.append((alloc[n], 1, size))
                events.append((free[n], 0, -size))  # at equal times, frees come first
        live = peak = 0
        for _, _, delta in sorted(events):
            live += delta
            peak = max(peak, live)
        return peak


def live_peak(a: StreamAssignment, span: Mapping, makespan: float, holds: Iterable = ()) -> int:
    """The estimate for a reading ``a`` played as ``span`` (node -> (start, end) of the nodes the
    schedule runs); ``holds``: ``(time, values)``: ``values`` stay alive until ``time`` at
    least (a sync's ordering dependencies until it is issued; a sync plan priced before it is
    applied adds its own)."""
    return LivePeak(a)(span, makespan, holds)

"""Races: the ordering requirements (:mod:`streampass.analysis.requirements`) that a graph's
syncs leave unmet, each described for a person. Works on a built :class:`~streampass.analysis.dag.StreamDAG`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx

from streampass import ops
from streampass.analysis.requirements import CrossStreamValue, Requirement, requirements

if TYPE_CHECKING:
    from streampass.analysis.dag import StreamDAG

KINDS = ("raw", "war", "waw", "entry", "exit", "dealloc")


@dataclass(frozen=True)
class Hazard:
    """One race: ``kind`` (one of ``KINDS``), the node names involved, and what can go wrong."""

    kind: str
    nodes: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


def _describe(req: Requirement, dag: StreamDAG) -> Hazard:
    b, a, v = req.before, req.after, req.value
    sb, sa = dag.stream_of(b), dag.stream_of(a)
    val = v.name if v is not None else None
    k = req.kind
    if k == "raw":
        msg = (
            f"{a.name} on stream {sa} reads {val}, written by {b.name} on stream {sb}, with no wait for it: "
            f"the GPU can run {a.name} before {b.name} has finished writing"
        )
    elif k == "entry":
        msg = (
            f"{a.name} on stream {sa} uses graph input {val} without waiting for the ambient stream: "
            f"it can run before the caller's pending work on {val} finishes"
        )
    elif k == "war":
        msg = (
            f"{a.name} on stream {sa} overwrites {val} while {b.name} on stream {sb} may still be reading it: "
            f"{b.name} can see the new values"
        )
    elif k == "waw":
        msg = (
            f"{a.name} on stream {sa} writes {val} without waiting for the earlier write by {b.name} "
            f"on stream {sb}: the two writes can land in either order"
        )
    elif v is not None:
        msg = (
            f"output {val} is written by {b.name} on stream {sb} but the ambient stream never waits for it: "
            f"the caller can read it before it is ready"
        )
    elif b in dag.assignment.syncs:
        msg = (
            f"stream {sb} issues {b.name} after its last join into the ambient stream: a CUDA-graph "
            f"capture ends with stream {sb} un-joined"
        )
    else:
        msg = (
            f"stream {sb} (last node {b.name}) is not joined into the ambient stream before return: "
            f"the caller can free or reuse memory that stream still uses"
        )
    return Hazard(k, (b.name, a.name), msg)


def keepalive_waits(dag: StreamDAG) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """value root -> wait nodes that hold the value alive as an argument (deferred frees).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> _ = sp.run(gm)
    >>> {v.name: len(ws) for v, ws in keepalive_waits(sp.StreamDAG.from_graph(gm)).items()}
    {'x_1': 1, 'sin': 2, 'add': 1}
    """
    a = dag.assignment
    out: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node, call in a.syncs.items():
        if call.target is ops.SYNC_DEALLOC:
            held = [call.args[2]]
        elif call.target in (ops.WAIT_EVENT, ops.WAIT_STREAM) and call.wrapper is not None:
            held = list(call.wrapper.args[2:])
        else:
            continue
        for x in held:
            if isinstance(x, torch.fx.Node):
                out.setdefault(a.root[x], []).append(node)
    return out


def recorded_streams(a) -> dict[torch.fx.Node, set[int]]:
    """value root -> the streams a ``record_stream`` of the graph marks it as used on.

    >>> import torch, streampass as sp
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> _ = g.call_function(torch.ops.streams.record_stream.default, (x, 1)); _ = g.output(x)
    >>> {v.name: s for v, s in recorded_streams(sp.read_streams(torch.fx.GraphModule({}, g))).items()}
    {'x': {1}}
    """
    recorded: dict[torch.fx.Node, set[int]] = {}
    for call in a.syncs.values():
        if call.target is ops.RECORD_STREAM and isinstance(call.args[0], torch.fx.Node):
            recorded.setdefault(a.root[call.args[0]], set()).add(call.args[1])
    return recorded


def dealloc_safe(dag: StreamDAG, cv: CrossStreamValue, keepalive, recorded_streams) -> bool:
    """Whether ``cv``'s memory cannot be reused by its stream while another stream reads it:
    every reading stream has a ``record_stream`` for it, or a wait of its own stream that
    follows all the reads holds it alive. Used by :func:`find_hazards` (the dealloc kind)."""
    recorded = recorded_streams.get(cv.value, ())
    if all(s in recorded for s in cv.readers):
        return True
    holders = keepalive.get(cv.value)
    if not holders:
        return False
    # happens_before(r, k) for every reader r, on the clocks directly (hot on large graphs):
    # readers are listed in issue order, so each stream's last reader is the one to check.
    clock, slot = dag.clock, dag.slot
    latest = [(slot[s], clock[rs[-1]][slot[s]]) for s, rs in cv.readers.items()]
    stream = dag.assignment.stream
    for k in holders:
        ck = clock[k]
        if stream[k] == cv.stream and all(ck[i] >= p for i, p in latest):
            return True
    return False


def find_hazards(dag: StreamDAG, reqs=None) -> list[Hazard]:
    """Hazards of an already-built DAG, in graph order of the later node.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> [h.kind for h in find_hazards(sp.StreamDAG.from_graph(gm))]
    ['entry', 'raw', 'exit', 'dealloc']

    ``reqs``: the ``(requirements, values)`` of :func:`streampass.analysis.requirements.requirements` for
    this DAG's assignment, if the caller already has them.
    """
    a = dag.assignment
    reqs, values = reqs if reqs is not None else requirements(a)
    # not happens_before(r.before, r.after), on the clocks directly (hot on large graphs)
    clock, slot, stream = dag.clock, dag.slot, a.stream
    found = []
    exits = set()  # an output's producer that is also its stream's last node: one hazard, not two
    for r in reqs:
        b = r.before
        i = slot[stream[b]]
        if b is r.after or clock[r.after][i] < clock[b][i]:
            if r.kind == "exit":
                if (b, r.after) in exits:
                    continue
                exits.add((b, r.after))
            found.append(_describe(r, dag))
    keep = keepalive_waits(dag)
    recorded = recorded_streams(a)
    for cv in values:
        if not dealloc_safe(dag, cv, keep, recorded):
            s, readers = next(iter(cv.readers.items()))
            found.append(
                Hazard(
                    "dealloc",
                    (cv.value.name, readers[-1].name),
                    f"{cv.value.name} is allocated on stream {cv.stream} and read by {readers[-1].name} on "
                    f"stream {s}; once freed, the caching allocator can give its memory to new work on "
                    f"stream {cv.stream} while stream {s} still reads it",
                )
            )
    return found

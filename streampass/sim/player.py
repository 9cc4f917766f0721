"""The simulator's player: the items one CPU thread issues (kernels, syncs) and one pass that
plays them on their streams (:func:`run_items`); :func:`ideal_makespan`, the same play with no
sync, is the assigner's lower bound. ``streampass.sim.simulate`` builds the items of a graph;
``streampass.assign.price`` builds them as it lays a plan out."""

from __future__ import annotations

import torch.fx

from streampass import ops
from streampass.ops import AMBIENT
from streampass.sim.cost import DeviceProfile

Node = torch.fx.Node

# Stream ops that enqueue something on a stream (the rest act on the host only).
_DEVICE_SYNCS = frozenset({ops.RECORD_EVENT, ops.WAIT_EVENT, ops.WAIT_STREAM, ops.SYNC_DEALLOC})
_HOST_BLOCKING = frozenset({ops.SYNC_EVENT, ops.SYNC_STREAM, ops.SYNC_DEVICE})


class Item:
    """One thing the CPU issues. A plain class with slots, not a dataclass: a search prices
    thousands of schedules, and making items was a tenth of each price."""

    __slots__ = ("block_cpu", "cpu", "done", "dur", "end", "gates", "issued", "kind", "lane", "node", "start", "stream")

    def __init__(
        self,
        node: Node,
        stream: int | None,  # None: host only
        dur: float,  # device time
        cpu: float,  # CPU time to issue it
        kind: str,
        gates: list[Item] | None = None,  # device items it must wait for
        block_cpu: bool = False,  # synchronize_*: the CPU waits for the gates
    ):
        self.node, self.stream, self.dur, self.cpu, self.kind = node, stream, dur, cpu, kind
        self.lane = stream  # what it queues behind: its stream, or one lane where streams do not overlap
        self.gates = [] if gates is None else gates
        self.block_cpu = block_cpu
        self.issued = self.start = self.end = -1.0
        self.done = False

    def __repr__(self) -> str:
        return f"Item({self.node.name}, stream={self.stream}, {self.kind}, start={self.start}, end={self.end})"


class Items:
    """The simulator's items, made one issued step at a time (what :func:`build_items` does for
    a whole list of steps; the assigner's pricing makes them as it lays a plan out, without the
    list). ``items``: in issue order."""

    def __init__(self, profile: DeviceProfile, cpu_launch: bool, serial: bool = False):
        self.items: list[Item] = []
        self.last_on: dict[int, Item] = {}
        self.last_record: dict[int, Item] = {}
        self.launch, self.cpu_launch, self.serial = profile.launch_overhead, cpu_launch, serial
        self.one_lane = not profile.concurrent_streams

    def kernel(self, node, stream: int, t: float) -> Item:
        """A kernel of ``t`` seconds (one launch included) on ``stream``."""
        s = AMBIENT if self.serial else stream
        cpu = min(t, self.launch) if self.cpu_launch else 0.0
        item = Item(node, s, t - cpu, cpu, "kernel")
        if self.one_lane:
            item.lane = AMBIENT
        self.last_on[s] = item
        self.items.append(item)
        return item

    def sync(self, node, call, stream: int, t: float) -> Item | None:
        """A stream op (``call``) on ``stream`` costing ``t``; None for what makes no item: fork,
        join and record_stream only change host-side state, and one stream needs no syncs."""
        if self.serial:
            return None
        target, cpu_launch = call.target, self.cpu_launch
        if target in _DEVICE_SYNCS:
            item = Item(
                node,
                stream,
                0.0 if cpu_launch else t,
                t if cpu_launch else 0.0,
                "record" if target is ops.RECORD_EVENT else "wait",
            )
            if self.one_lane:
                item.lane = AMBIENT
            if target is ops.RECORD_EVENT:
                # Completes when the work before it on its stream completes: stream order does that.
                self.last_record[call.args[0]] = item
            elif target is ops.WAIT_STREAM:
                if call.args[1] in self.last_on and call.args[1] != stream:
                    item.gates.append(self.last_on[call.args[1]])
            elif call.args[0] in self.last_record:  # wait_event / sync_dealloc; no record yet: no-op
                item.gates.append(self.last_record[call.args[0]])
            self.last_on[stream] = item
        elif target in _HOST_BLOCKING:
            item = Item(node, None, 0.0, t if cpu_launch else 0.0, "sync", block_cpu=True)
            if target is ops.SYNC_EVENT:
                if call.args[0] in self.last_record:
                    item.gates.append(self.last_record[call.args[0]])
            elif target is ops.SYNC_STREAM:
                if call.args[0] in self.last_on:
                    item.gates.append(self.last_on[call.args[0]])
            else:
                item.gates.extend(self.last_on.values())
        else:
            return None
        self.items.append(item)
        return item


def build_items(steps, times, profile: DeviceProfile, cpu_launch: bool, serial: bool) -> list[Item]:
    """The simulator's items for ``steps`` (see :func:`graph_steps`; a step's key needs only a
    ``name`` and an entry in ``times``)."""
    out = Items(profile, cpu_launch, serial)
    for node, call, stream, work in steps:
        if call is None:
            if work:
                out.kernel(node, stream, times[node])
        else:
            out.sync(node, call, stream, times[node])
    return out.items


def run_items(items: list[Item]) -> float:
    """Play ``items`` in issue order (sets each one's issue, start and end times); returns when
    the CPU is done.

    A stream item queues behind the items of its ``lane`` (its stream; one lane for every
    stream where the profile's streams do not overlap).
    One pass: every gate is an item issued earlier (a record before its wait, a producer before
    its reader), so when an item is reached everything that decides its start is known. A
    stream item starts at ``max(enqueued, end of the previous item on its stream, ends of its
    gates)``; a CPU-blocking sync returns at ``max(issued + its CPU time, ends of its gates)``.
    Both are what playing the events in time order gives, which this replaced (O(items ×
    streams) heap events); tests/test_simulate.py checks the two agree on random items.
    """
    cpu = 0.0
    last_end: dict[int, float] = {}
    for it in items:
        it.issued = cpu
        cpu += it.cpu  # a kernel reaches its stream when the launch call returns
        held = cpu if it.stream is None else max(cpu, last_end.get(it.lane, cpu))
        if it.stream is not None or it.block_cpu:
            for g in it.gates:
                if not g.done:
                    raise AssertionError(f"{it.node.name} is gated on {g.node.name}, which is issued after it")
                if g.end > held:
                    held = g.end
        if it.stream is None:  # on the CPU: a synchronize returns when its gates are done
            it.start, it.end, cpu = it.issued, held, held
        else:
            it.start, it.end = held, held + it.dur
            last_end[it.lane] = it.end
        it.done = True
    return cpu


def ideal_makespan(nodes, stream, preds, times, profile: DeviceProfile, cpu_launch: bool) -> float:
    """The makespan of ``nodes`` (in issue order) on ``stream[n]``, each starting when its
    ``preds`` on other streams have ended, with no sync issued: a lower bound on the simulated
    makespan of the same work after any sync plan. Every start is a max over earlier ends and
    issue times, so adding a sync (a gate, or CPU time in front of later launches) can only
    delay it. Streams overlap here whatever ``profile.concurrent_streams`` says: where they run
    one after another (the "cpu" profile) the bound is looser, and still a bound.

    >>> from streampass.sim.cost import PROFILES
    >>> t = {"a": 10e-6, "b": 10e-6, "c": 10e-6}
    >>> ideal_makespan(["a", "b", "c"], {"a": 0, "b": 1, "c": 0}, {"c": ["a", "b"]}, t, PROFILES["h100"], False)
    2e-05
    """
    # run_items on kernels gated on their predecessors, without building the items (a
    # predecessor on the same stream ended before the stream's previous kernel did).
    launch = profile.launch_overhead if cpu_launch else 0.0
    cpu = makespan = 0.0
    end: dict = {}
    last_end: dict[int, float] = {}
    for n in nodes:
        t = times[n]
        issue = t if t < launch else launch
        cpu += issue
        s = stream[n]
        start = last_end.get(s, cpu)
        if cpu > start:
            start = cpu
        for u in preds.get(n, ()):
            if end[u] > start:
                start = end[u]
        end[n] = last_end[s] = start + (t - issue)
        if end[n] > makespan:
            makespan = end[n]
    return max(cpu, makespan)

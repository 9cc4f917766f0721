"""A simulated schedule: when each node ran on which stream (:class:`Slot`), the races the
simulation saw (:class:`Race`), and the whole :class:`Schedule` with its summary and its
Chrome trace. :func:`streampass.sim.simulate.simulate` makes one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from streampass.ops import AMBIENT
from streampass.sim.cost import DeviceProfile

#: slack when comparing simulated times (float sums)
EPS = 1e-12


@dataclass(frozen=True)
class Slot:
    """When one node ran. ``stream`` is None for work on the CPU thread (``track == "cpu"``).

    ``kind``: ``"kernel"`` (compute), ``"record"``, ``"wait"`` (wait_event, wait_stream,
    sync_dealloc), ``"sync"`` (a CPU-blocking synchronize) or ``"launch"`` (the CPU side of a
    kernel launch, with ``cpu_launch=True``). ``waited_on`` names the node a wait or sync
    blocked on (the matching record, or the waited stream's last node), if any.
    """

    node: str
    stream: int | None
    start: float
    end: float
    kind: str
    target: str
    issued: float = 0.0
    waited_on: tuple[str, ...] = ()

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Race:
    """A dependency the schedule broke: ``after`` started before ``before`` had finished.

    ``kind`` is ``raw``, ``war``, ``waw`` (a tensor's storage) or ``exit`` (an output, or a side
    stream, not finished when the ambient stream reached the return). ``overlap`` is in seconds.
    """

    kind: str
    before: str
    after: str
    overlap: float


@dataclass
class Schedule:
    """The simulated timeline of one graph (times in seconds from graph entry).

    Attributes:
        slots: node name -> :class:`Slot`, for every node that does work (on a stream or the CPU).
        streams: the stream indices, ambient (0) first.
        makespan: when the last piece of work (any stream, or the CPU) completes.
        serial_time: the same compute nodes, in graph order, on one stream with no syncs.
        critical_path_time: the longest chain of data (and storage) dependencies, each node
            taking its cost-model time: a lower bound on any correct schedule.
        critical_path: the node names along that chain.
        returned_at: when the ambient stream has finished the work issued before ``output``
            (what a caller's next kernel on the ambient stream would wait for).
        races: dependencies this schedule violated (see :class:`Race`); empty for graphs that
            :func:`streampass.analysis.verify` passes.
        profile: the device profile the times come from.
    """

    slots: dict[str, Slot]
    streams: list[int]
    makespan: float
    serial_time: float
    critical_path_time: float
    critical_path: list[str]
    returned_at: float
    races: list[Race]
    profile: DeviceProfile
    cpu_launch: bool = False
    flows: list[tuple[str, str]] = field(default_factory=list)

    # -- summaries -------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """No dependency was violated (the timeline is one a correct program could have)."""
        return not self.races

    @property
    def below_critical_path(self) -> bool:
        """The schedule beat the critical path: only possible because of races."""
        return self.makespan < self.critical_path_time * (1 - 1e-9) - EPS

    @property
    def speedup(self) -> float:
        """``serial_time / makespan`` (1.0 for an empty graph)."""
        return self.serial_time / self.makespan if self.makespan > 0 else 1.0

    def on(self, stream: int) -> list[Slot]:
        """The slots of ``stream`` in the order they ran."""
        return sorted((s for s in self.slots.values() if s.stream == stream), key=lambda s: (s.start, s.end))

    @property
    def per_stream(self) -> dict[int, list[Slot]]:
        return {s: self.on(s) for s in self.streams}

    @property
    def cpu(self) -> list[Slot]:
        """What the CPU thread spent time on: launches and blocking synchronizes."""
        return sorted((s for s in self.slots.values() if s.stream is None), key=lambda s: s.start)

    def busy_time(self, stream: int) -> float:
        return sum(s.duration for s in self.slots.values() if s.stream == stream)

    @property
    def utilisation(self) -> dict[int, float]:
        """Per stream: the share of the makespan it spent running something (0..1)."""
        if self.makespan <= 0:
            return {s: 0.0 for s in self.streams}
        return {s: min(1.0, self.busy_time(s) / self.makespan) for s in self.streams}

    def summary(self) -> str:
        util = ", ".join(f"{s}: {u:.0%}" for s, u in self.utilisation.items())
        race = f"; {len(self.races)} race(s) in this schedule" if self.races else ""
        return (
            f"simulated makespan {self.makespan * 1e6:.1f} us on the {self.profile.name} cost model, not measured "
            f"(one stream {self.serial_time * 1e6:.1f} us, critical path {self.critical_path_time * 1e6:.1f} us, "
            f"speedup {self.speedup:.2f}x over one stream); utilisation {util}{race}"
        )

    def __repr__(self) -> str:
        return f"<Schedule {self.summary()}>"

    # -- Chrome trace ----------------------------------------------------------------------
    def to_chrome_trace(self, include_empty: bool = False) -> dict:
        """The schedule in the Chrome trace event format (open it in https://ui.perfetto.dev).

        Process 0 is the device: one thread (``tid``) per stream index. Process 1 is the CPU
        thread (launches and synchronizes). Every wait that blocked on a record or a stream
        gets a flow arrow (``ph`` ``"s"`` at the waited-on slot, ``"f"`` at the wait).
        Zero-length slots (views, getitems) are left out unless ``include_empty``.
        Times are microseconds. ``json.dumps`` the result to write a ``.json`` file.
        """
        us = 1e6
        ev: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": f"device ({self.profile.name})"}},
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "issue thread"}},
        ]
        for s in self.streams:
            label = "stream 0 (ambient)" if s == AMBIENT else f"stream {s}"
            ev.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": s, "args": {"name": label}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": s, "args": {"sort_index": s}})
        shown: set[str] = set()
        for slot in sorted(self.slots.values(), key=lambda s: (s.start, s.end)):
            if slot.duration <= 0 and not include_empty and slot.kind not in ("record", "wait", "sync"):
                continue
            shown.add(slot.node)
            pid, tid = (1, 0) if slot.stream is None else (0, slot.stream)
            ev.append(
                {
                    "ph": "X",
                    "name": slot.target,
                    "cat": slot.kind,
                    "pid": pid,
                    "tid": tid,
                    "ts": slot.start * us,
                    "dur": slot.duration * us,
                    "args": {
                        "node": slot.node,
                        "issued_us": slot.issued * us,
                        **({"waited_on": list(slot.waited_on)} if slot.waited_on else {}),
                    },
                }
            )
        for i, (src, dst) in enumerate(self.flows):
            a, b = self.slots.get(src), self.slots.get(dst)
            if a is None or b is None or src not in shown or dst not in shown:
                continue
            common = {"name": "sync", "cat": "sync", "id": i + 1}
            ev.append(
                {
                    **common,
                    "ph": "s",
                    "pid": 1 if a.stream is None else 0,
                    "tid": 0 if a.stream is None else a.stream,
                    "ts": a.start * us,
                }
            )
            ev.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "pid": 1 if b.stream is None else 0,
                    "tid": 0 if b.stream is None else b.stream,
                    "ts": b.start * us,
                }
            )
        return {
            "traceEvents": ev,
            "displayTimeUnit": "ns",
            "otherData": {
                "profile": self.profile.name,
                "makespan_us": self.makespan * us,
                "serial_time_us": self.serial_time * us,
                "critical_path_time_us": self.critical_path_time * us,
                "races": len(self.races),
            },
        }

    def save_chrome_trace(self, path, **kwargs) -> None:
        """Write :meth:`to_chrome_trace` as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.to_chrome_trace(**kwargs), f)


# -- the simulation ----------------------------------------------------------------------------

"""The sync plan: which records and waits make a graph race-free (:class:`SyncPlan`), and the
event indices it may use. :func:`streampass.transform.planner.plan_syncs` computes one;
:mod:`streampass.transform.apply` makes its edit. Nothing here edits a graph.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch.fx

from streampass.analysis.reading import StreamAssignment
from streampass.errors import StreamPassError
from streampass.ops import AMBIENT, MAX_INDEX

Node = torch.fx.Node


@dataclass(eq=False)
class PlannedWait:
    """Insert ``wait_event(record.event, stream)`` right before ``before``.

    The stream waits for ``source`` up to its node at position ``point`` (the record sits
    right after that node, or is an existing record with no work of ``source`` between).
    """

    stream: int
    source: int
    before: Node
    point: int
    record: PlannedRecord | None = None
    used: bool = False
    free_point: bool = False  # defers the free of a value read on other streams (docs/plan.md §4)

    @property
    def name(self) -> str:
        return f"wait({self.source}->{self.stream}) before {self.before.name}"


@dataclass(eq=False)
class PlannedRecord:
    """``record_event(event, stream)`` right after ``anchor`` (an input: at graph entry), or,
    with ``after``, right after that planned wait (a side stream's join after its free points)."""

    stream: int
    event: int
    anchor: Node | None
    existing: Node | None = None  # an existing record of the graph, reused
    node: Node | None = None  # the node apply() created
    after: PlannedWait | None = None


@dataclass
class SyncPlan:
    """Everything :func:`streampass.transform.apply.apply_plan` needs, computed without editing the graph.

    Attributes:
        waits: new waits, in walk order.
        records: new records (existing records reused by a new wait are not listed).
        protect: gate (an existing sync node or a :class:`PlannedWait`) -> (consumer, value)
            pairs: ``consumer`` must be data-dependent on the gate for the tensor ``value``
            (None: ordering only, e.g. a side stream joined at exit).
        keepalive: gate -> values the gate must hold alive (deferred frees).
        first_event: the first event index new records use.
        exact: whether the search proved the wait count minimal (see module docs).
        capture_joins: waits added only to join a side stream back after its free points
            (the search's minimum does not count them; see ``_join_free_points``).
    """

    assignment: StreamAssignment
    waits: list[PlannedWait] = field(default_factory=list)
    records: list[PlannedRecord] = field(default_factory=list)
    protect: dict = field(default_factory=lambda: defaultdict(list))
    keepalive: dict = field(default_factory=lambda: defaultdict(list))
    first_event: int = 0
    exact: bool = True
    capture_joins: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.waits

    @property
    def next_event(self) -> int:
        """The first event index above the ones this plan's new records take."""
        return self.first_event + len(self.records)

    def summary(self) -> str:
        return f"{len(self.records)} record(s), {len(self.waits)} wait(s) to add"


#: Event indices streampass allocates start here: far above the stream indices people write
#: (and dynamo's object-table indices), so a stream added to the graph later cannot collide.
EVENT_BASE = 1 << 20


def first_free_event(a: StreamAssignment) -> int:
    """The first event index for new records: above every index in the graph, and >= EVENT_BASE.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> first_free_event(sp.read_streams(gm)) == EVENT_BASE
    True
    """
    used = set(a.streams) | a.events() | set(a.external_events)
    for call in a.syncs.values():
        used.update(x for x in call.args if isinstance(x, int) and not isinstance(x, bool))
    return max(max(used) + 1, EVENT_BASE)


def check_event_indices(a: StreamAssignment, first: int, count: int) -> None:
    """Refuse a plan whose new event indices would not fit in the int64 the stream ops take."""
    if count and first + count - 1 > MAX_INDEX:
        largest = first - 1  # the node that holds it (an external event has none: the last stream's)
        node = next(
            (n for n, c in a.syncs.items() if largest in c.args),
            max(a.nodes, key=lambda n: a.stream.get(n, 0)),
        )
        raise StreamPassError(
            f"the plan needs {count} new event index(es) above {first - 1}, the largest index in the graph, "
            f"but stream/event indices must fit in int64 (max {MAX_INDEX}); use smaller stream indices",
            node.name,
        )


def join_free_points(plan: SyncPlan) -> None:
    """Join each side stream back into the ambient stream after its last free-point wait.

    A free point (docs/plan.md §4) is a wait issued on a value's side stream at the graph's
    end. Issued after the ambient stream's exit wait on that stream, it would leave the side
    stream un-joined to a CUDA-graph capture. So the exit wait waits for a record right
    after the free point instead (it knows more than the record it replaces), or, where the
    output needed no wait on that stream, one is added: one wait per side stream with free
    points, the least a capture needs. Free-point demands come before the output's in the
    walk, so every exit wait follows the free points in the graph.
    """
    last_free: dict[int, PlannedWait] = {}
    for w in plan.waits:
        if w.free_point and w.stream != AMBIENT:
            last_free[w.stream] = w
    for s, free in last_free.items():
        output = free.before
        record = PlannedRecord(s, 0, None, after=free)
        plan.records.append(record)
        join = next(
            (
                w
                for w in plan.waits
                if w.stream == AMBIENT and w.source == s and w.before is output and not w.free_point
            ),
            None,
        )
        if join is None:
            join = PlannedWait(AMBIENT, s, output, 0, used=True)
            plan.waits.append(join)
            plan.capture_joins += 1
            plan.protect[join].append((output, None))
        replaced, join.record = join.record, record
        if replaced is not None and replaced.existing is None and all(w.record is not replaced for w in plan.waits):
            plan.records.remove(replaced)
    for i, r in enumerate(r for r in plan.records if r.existing is None):
        r.event = plan.first_event + i

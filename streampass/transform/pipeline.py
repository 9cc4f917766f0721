"""``streampass.run``: read -> plan -> apply -> verify, in place, all or nothing."""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import operator
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch.fx

from streampass import runtime
from streampass.analysis import bodies
from streampass.analysis.dag import StreamDAG
from streampass.analysis.hazards import find_hazards
from streampass.analysis.reading import StreamAssignment, event_indices, read_streams
from streampass.analysis.requirements import exit_joins, requirements
from streampass.analysis.verify import Report
from streampass.errors import StreamPassError, StreamPassWarning
from streampass.ops import AMBIENT
from streampass.transform import snapshot
from streampass.transform.apply import apply_and_read
from streampass.transform.plan import SyncPlan
from streampass.transform.planner import plan_syncs


@dataclass
class RunResult:
    """What :func:`run` did: hazards before and after, syncs added, whether the graph changed.
    With bodies (``torch.cond``'s branches, ...), the reports and counts cover the whole tree,
    while ``plan`` and ``assignment`` are the calling graph's own."""

    before: Report
    after: Report
    records_added: int
    waits_added: int
    changed: bool
    plan: SyncPlan
    #: the reading of the graph as run left it, for later passes that need one (the lowerings):
    #: built from the edit's bookkeeping, or re-read with ``check="full"``
    assignment: StreamAssignment | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.after.ok

    def __repr__(self) -> str:
        """One line: whether the result is race-free, and what the pass did.

        >>> import torch, streampass as sp
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> def f(x):
        ...     with sp.stream(1):
        ...         y = x.sin()
        ...     return y + 1
        >>> sp.run(make_fx(f)(torch.ones(2)))
        <RunResult ok: streams [0, 1]: 4 hazard(s) before, 0 after; added 4 record(s), 4 wait(s)>
        """
        return f"<RunResult {'ok' if self.ok else 'NOT race-free'}: {self.summary()}>"

    def summary(self) -> str:
        return (
            f"streams {self.after.streams}: {len(self.before.hazards)} hazard(s) before, "
            f"{len(self.after.hazards)} after; added {self.records_added} record(s), {self.waits_added} wait(s)"
        )


def _as_module(g: torch.fx.GraphModule | torch.fx.Graph) -> torch.fx.GraphModule:
    if isinstance(g, torch.fx.GraphModule):
        return g
    if isinstance(g, torch.fx.Graph):
        if isinstance(g.owning_module, torch.fx.GraphModule):
            return g.owning_module
        raise StreamPassError("run() needs a GraphModule, or a Graph owned by one (subgraphs live on the module)")
    raise StreamPassError(f"expected a torch.fx.GraphModule or Graph, got {type(g).__name__}")


def run(
    g: torch.fx.GraphModule | torch.fx.Graph,
    external_events: Iterable[int] = (),
    check: bool | str = "region",
    bind_runtime: bool = True,
    recompile: bool = True,
    assignment: StreamAssignment | None = None,
    with_bodies: bool = True,
) -> RunResult:
    """Make ``g`` race-free in place: insert the fewest record/wait pairs and encode the order.

    Idempotent: a second call changes nothing. On a :class:`StreamPassError` the graph is left
    exactly as it was. The final check (``result.after``) is as strong as :func:`verify`:
    ``check="region"`` (the default, also ``True``) runs verify's race check on the reading the
    edit kept up to date, after re-reading only the nodes it touched; ``check="full"`` re-reads
    the whole graph first (the tests check that both agree); ``check=False`` skips it.
    ``bind_runtime`` makes ``gm(*args)`` fill the stream/event table itself
    (:func:`streampass.runtime.install`); compilers that own the table turn it off.
    ``recompile=False`` leaves regenerating ``gm``'s Python code to the caller (a compiler
    pass that lowers the graph, not the code). ``assignment``: ``read_streams(g,
    external_events)`` if the caller already has it (used unless the pass first moves nodes);
    the result's ``assignment`` is the reading of the rewritten graph, so that a compiler reads
    each graph twice in all (before and after), not once per pass. The bodies of the graph's
    higher-order ops (``torch.cond``'s branches, ...) are made race-free too, each as a graph of
    its own, with events of their own, all or nothing with the graph
    (:mod:`streampass.analysis.bodies`); ``with_bodies=False`` leaves them to the caller (inductor
    hands each body to its passes itself, before the graph that calls it), and new events still
    take indices no body uses. Either way an op that runs on a side stream and calls a body with
    streams of its own is first moved to the ambient stream, with a warning (docs/design.md).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return x.cos() + y
    >>> gm = make_fx(f)(torch.ones(2))
    >>> result = sp.run(gm)
    >>> result.ok, len(result.before.hazards) > 0, sp.run(gm).changed
    (True, True, False)
    """
    if check not in (True, False, "region", "full"):
        raise StreamPassError(f'run(check=...) takes "region", "full", True or False, not {check!r}')
    with collector_paused():
        gm = _as_module(g)
        if not bodies.bodies(gm):
            return _run(gm, external_events, check, bind_runtime, recompile, assignment)
        if not with_bodies:  # planned by the caller, before or after: new events stay clear of theirs
            records: list = []
            with snapshot.all_or_nothing(gm):
                assignment, notes, below = _bodies_callers_to_ambient(gm, external_events, assignment, True)
                first = bodies.indices_used(gm) + 1
                result = _run(gm, external_events, check, bind_runtime, recompile, assignment, first, records)
            for write in records:
                write(below)
            _reserve_events(gm, max(first, result.plan.next_event))
            _warn(notes)
            return result
        return _run_with_bodies(gm, external_events, check, bind_runtime, recompile, assignment)


@contextlib.contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector for the pass.

    The pass allocates many small objects (requirements, clocks, nodes); each burst makes the
    collector rescan every object alive, the whole FX graph included, and that cost 25-45% of
    the pass on 16k-node graphs. Nothing the pass creates needs the cycle collector to be
    freed promptly; it runs again as usual afterwards.

    >>> import gc
    >>> with collector_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def hoist_attributes(gm: torch.fx.GraphModule) -> bool:
    """Move every ``get_attr`` up to the graph's inputs; returns whether any moved.

    A parameter or buffer is an input like a placeholder, ready on the ambient stream at entry,
    wherever ``make_fx`` put its ``get_attr`` (at first use). Moving it up changes no value
    and lets the entry records that cover it stand with the other inputs.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> class M(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__(); self.w = torch.nn.Parameter(torch.ones(2, 2))
    ...     def forward(self, x):
    ...         return x.sin() @ self.w
    >>> gm = make_fx(M())(torch.ones(2, 2))
    >>> [n.op for n in gm.graph.nodes][:3]
    ['placeholder', 'call_function', 'get_attr']
    >>> hoist_attributes(gm), [n.op for n in gm.graph.nodes][:3], hoist_attributes(gm)
    (True, ['placeholder', 'get_attr', 'call_function'], False)
    """
    nodes = list(gm.graph.nodes)
    lead, moved = attributes_to_hoist(nodes)
    last = lead[-1] if lead else None
    for node in moved:
        if last is None:
            nodes[0].prepend(node)
        else:
            last.append(node)
        last = node
    return bool(moved)


def attributes_to_hoist(nodes: list[torch.fx.Node]) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The leading run of inputs (placeholders and ``get_attr``), and the ``get_attr`` nodes
    after it, in graph order: :func:`hoist_attributes` moves the second right after the first
    (``assign.price.hoisted`` reads a graph as if it had)."""
    lead = list(itertools.takewhile(lambda n: n.op in ("placeholder", "get_attr"), nodes))
    return lead, [n for n in nodes[len(lead) :] if n.op == "get_attr"]


def _run_with_bodies(gm, external_events, check, bind_runtime, recompile, given) -> RunResult:
    """:func:`_run` on ``gm``, then on each body under it (a body is planned in the body: it runs
    on the stream that calls it, which the calling graph reads as one kernel). A body shares the
    event table of its caller, so every new event takes an index no graph of the tree uses."""
    saved = [snapshot.take(m) for m in (gm, *bodies.nested(gm))]
    records: list[Callable[[], None]] = []  # records and warnings, written once the whole tree is planned
    try:
        first = bodies.indices_used(gm) + 1
        result, _ = _run_tree(gm, external_events, check, bind_runtime, recompile, given, first, records)
    except Exception as e:
        for s in saved:
            s.restore()
        if isinstance(e, StreamPassError):
            raise
        raise StreamPassError(f"internal error ({e!r}); the graph was restored") from e
    for write in records:
        write()
    return result


def _run_tree(gm, external_events, check, bind_runtime, recompile, given, first_event, records):
    given, notes, _ = _bodies_callers_to_ambient(gm, external_events, given, False)
    mine: list = []
    result = _run(gm, external_events, check, bind_runtime, recompile, given, first_event, mine)
    free = max(first_event, result.plan.next_event)
    caller = result.assignment if result.assignment is not None else read_streams(gm, external_events)
    for body in bodies.bodies(gm):
        # Bodies are recompiled whatever ``recompile`` says: the caller's code calls them.
        inner, free = _run_tree(
            body.module, bodies.external_events(caller), check, bind_runtime, True, None, free, records
        )
        result = RunResult(
            result.before.with_body(inner.before, body.name, body.op.name),
            result.after.with_body(inner.after, body.name, body.op.name),
            result.records_added + inner.records_added,
            result.waits_added + inner.waits_added,
            result.changed or inner.changed,
            result.plan,
            result.assignment,
        )
    records += [functools.partial(write, result.before.streams) for write in mine]  # the tree's streams
    records.append(functools.partial(_warn, notes))
    return result, free


def _bodies_callers_to_ambient(gm, external_events, given, planned: bool) -> tuple[StreamAssignment, list, set]:
    """Move each higher-order op that runs on a side stream and calls a body whose tree uses
    other streams to the ambient stream (``bodies.off_ambient``), its getitems with it, before
    ``gm`` is planned: a body is planned from the ambient stream, and syncs order the op with the
    side stream's work. Returns ``gm``'s reading (``given``, or a new one if an op moved), the
    warnings to give once the run succeeds, and the streams the bodies use (``bodies.tree_streams``)."""
    ext = tuple(sorted(event_indices(external_events)))
    a = given if given is not None else read_streams(gm, ext)
    moved: set[torch.fx.Node] = set()
    notes, below = [], set()
    for body in bodies.bodies(gm):
        inner = bodies.tree_streams(body.module, bodies.external_events(a), planned)
        below.update(inner)
        for op in [o for o in bodies.off_ambient(body, a, inner) if o not in moved]:  # graph order
            notes.append(
                f"node {op.name!r}: runs on stream {a.stream[op]}, and its body {body.name} places work on "
                f"streams {inner}: moved to the ambient stream (a body's streams are planned from there)"
            )
            getitems = [u for u in op.users if u.op == "call_function" and u.target is operator.getitem]
            for node in (op, *getitems):  # new dicts: snapshots keep the old ones
                node.meta["custom"] = {**(node.meta.get("custom") or {}), "stream": AMBIENT}
            moved.add(op)
    return (read_streams(gm, ext) if moved else a), notes, below


def _reserve_events(gm: torch.fx.GraphModule, free: int) -> None:
    """Tell each body under ``gm``, planned by a later call, that event indices below ``free``
    are taken: the body shares ``gm``'s event table, and re-recording one of ``gm``'s events
    while ``gm`` waits on it would make that wait wait for the body instead."""
    for body in bodies.nested(gm):
        record = runtime.state(body)
        record["events_from"] = max(record.get("events_from", 0), free)


def _reserved_events(gm: torch.fx.GraphModule) -> int:
    """The first event index a plan of ``gm`` may take (:func:`_reserve_events`; 0: any)."""
    return gm.meta.get("streampass", {}).get("events_from", 0)


def _warn(notes: list[str]) -> None:
    for note in notes:
        warnings.warn(StreamPassWarning(note), stacklevel=4)


def _run(gm, external_events, check, bind_runtime, recompile, given=None, first_event=0, records=None) -> RunResult:
    """Plan and edit ``gm`` alone. Its record (``runtime.state``) and runtime hooks are written
    at once, or, with ``records``, appended there to be written when every graph of a tree is
    planned: a refused body leaves no trace on a caller planned before it."""
    external_events = tuple(sorted(event_indices(external_events)))
    if given is not None and (given.graph is not gm.graph or given.external_events != frozenset(external_events)):
        raise StreamPassError("run(assignment=...) must be read_streams of this graph with the same external_events")
    saved = snapshot.take(gm)
    try:
        hoisted = hoist_attributes(gm)
        assignment = given if given is not None and not hoisted else read_streams(gm, external_events)
        dag = StreamDAG(assignment)
        reqs = requirements(assignment)
        before = Report(find_hazards(dag, reqs), dag.streams)
        plan = plan_syncs(assignment, reqs=reqs, min_event=max(first_event, _reserved_events(gm)))
        edited, final = apply_and_read(gm, plan, recompile=recompile)
        changed = edited or hoisted
    except Exception as e:
        saved.restore()
        if isinstance(e, StreamPassError):
            raise
        raise StreamPassError(f"internal error ({e!r}); the graph was restored") from e

    install = bind_runtime and (assignment.streams != [0] or assignment.syncs or plan.waits)
    write = functools.partial(_write_record, gm, external_events, dag.streams, changed, install)
    if records is None:
        write(())
    else:  # each to be called with the streams of the graph's bodies
        records.append(write)
    if not check:
        after = Report([], dag.streams)
    elif not changed:  # the graph is as it was read: so is its verdict
        after = before
    elif check == "full":
        after_dag = StreamDAG.from_graph(gm, external_events)
        after, final = Report(find_hazards(after_dag), after_dag.streams), after_dag.assignment
    else:
        after = _region_check(final, reqs)
    return RunResult(before, after, len(plan.records), len(plan.waits), changed, plan, final)


def _write_record(gm, external_events, streams, changed, install, below) -> None:
    record = runtime.state(gm)
    record["external_events"] = external_events
    record["streams"] = sorted({*streams, *below})  # its bodies' too: what a caller checks
    if changed:
        record["table"] = None  # streams or events may have changed: rebuild on next call
    if install:
        runtime.install(gm)


def _region_check(final: StreamAssignment, reqs) -> Report:
    """Verify's race check on the edited graph's kept reading: the data requirements are the
    ones read before the edit (syncs add none), the exit joins are recomputed (syncs move
    where each stream ends)."""
    data, cross = reqs
    output = next(n for n in reversed(final.nodes) if n.op == "output")
    kept = [r for r in data if r.kind != "exit" or r.value is not None] + exit_joins(final, output)
    dag = StreamDAG(final)
    return Report(find_hazards(dag, (kept, cross)), dag.streams)

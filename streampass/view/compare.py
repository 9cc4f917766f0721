"""``streampass.compare(before, after)``: what a pass changed about a graph's streams.

``streampass.run(gm)`` edits ``gm`` in place, so keep a copy first::

    before = copy.deepcopy(gm)
    sp.run(gm)
    sp.compare(before, gm)      # displays in Jupyter; str() for a terminal

The comparison lists the stream ops the pass added (records, waits, and other syncs such as
``record_stream`` / ``sync_dealloc``), for each wait which record it waits for and which nodes
it now protects, and the hazards that went away (or appeared), matched by kind and message.
Read-only: neither graph is edited.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

import torch.fx

from streampass import ops
from streampass.analysis.dag import StreamDAG


@dataclass(frozen=True)
class AddedSync:
    """One stream op present in ``after`` but not in ``before``.

    ``op``: the op name (``record_event``, ``wait_event``, ``wait_stream``, ...); ``node``: the
    node performing it (a ``control_deps`` wrapper after :func:`streampass.run`); ``stream``:
    where it runs; ``event``: the event index for event ops; ``partner``: for a wait, the record
    it waits for (node name) and ``partner_stream`` its stream; ``after_node``: for a record, the
    last node before it on its stream (what the event marks as done); ``protects``: for a wait,
    the nodes ordered after it through data dependencies (its direct consumers).
    """

    op: str
    node: str
    stream: int
    event: int | None = None
    partner: str | None = None
    partner_stream: int | None = None
    after_node: str | None = None
    protects: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.op in ("wait_event", "sync_dealloc") and self.partner is not None:
            s = f"stream {self.stream} waits for event e{self.event} recorded on stream {self.partner_stream} ({self.partner})"
        elif self.op == "wait_stream" and self.partner_stream is not None:
            s = f"stream {self.stream} waits for all work queued on stream {self.partner_stream}"
        elif self.op == "record_event":
            s = f"stream {self.stream} records event e{self.event}" + (
                f" after {self.after_node}" if self.after_node else " at its start"
            )
        else:
            s = f"{self.op} on stream {self.stream}"
        if self.protects:
            shown = ", ".join(self.protects[:6]) + (
                f", … {len(self.protects) - 6} more" if len(self.protects) > 6 else ""
            )
            s += f"; orders before: {shown}"
        return s


@dataclass
class Comparison:
    """What changed between two versions of a graph (see :func:`compare`)."""

    streams: list[int]
    records: list[AddedSync] = field(default_factory=list)
    waits: list[AddedSync] = field(default_factory=list)
    other: list[AddedSync] = field(default_factory=list)
    removed_syncs: list[str] = field(default_factory=list)
    hazards_before: list = field(default_factory=list)
    hazards_after: list = field(default_factory=list)
    fixed: list = field(default_factory=list)
    introduced: list = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0

    @property
    def ok(self) -> bool:
        """True when ``after`` has no hazards."""
        return not self.hazards_after

    def fixed_by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(h.kind for h in self.fixed).items()))

    def summary(self) -> str:
        kinds = ", ".join(f"{k}: {n}" for k, n in self.fixed_by_kind().items()) or "none"
        s = (
            f"streams {self.streams}: added {len(self.records)} record(s), {len(self.waits)} wait(s)"
            + (f", {len(self.other)} other sync(s)" if self.other else "")
            + f"; hazards {len(self.hazards_before)} -> {len(self.hazards_after)} (fixed {kinds})"
        )
        if self.introduced:
            s += f"; {len(self.introduced)} NEW hazard(s)"
        return s

    def __str__(self) -> str:
        lines = [self.summary(), f"nodes: {self.nodes_before} -> {self.nodes_after}"]
        for title, items in (
            ("records added", self.records),
            ("waits added", self.waits),
            ("other syncs added", self.other),
        ):
            if items:
                lines.append(f"{title}:")
                lines += [f"  {x.node}: {x.describe()}" for x in items]
        if self.removed_syncs:
            lines.append(f"syncs removed: {', '.join(self.removed_syncs)}")
        if self.fixed:
            lines.append("hazards that went away:")
            lines += [f"  {h}" for h in self.fixed]
        if self.introduced:
            lines.append("hazards that appeared:")
            lines += [f"  {h}" for h in self.introduced]
        lines.append("after: " + ("no hazards" if self.ok else f"{len(self.hazards_after)} hazard(s) remain"))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from streampass.view.html import wrap_page
        from streampass.view.tables import hazard_table

        def rows(items: list[AddedSync]) -> str:
            if not items:
                return "<p>none</p>"
            body = "".join(
                f"<tr><td><code>{html.escape(x.node)}</code></td><td>{html.escape(x.op)}</td><td>{x.stream}</td>"
                f"<td>{'' if x.event is None else 'e' + str(x.event)}</td><td>{html.escape(x.describe())}</td></tr>"
                for x in items
            )
            return (
                '<table class="sp-table"><thead><tr><th>node</th><th>op</th><th>stream</th><th>event</th>'
                f"<th>what it orders</th></tr></thead><tbody>{body}</tbody></table>"
            )

        verdict = (
            '<span class="sp-ok">no hazards after</span>'
            if self.ok
            else f'<span class="sp-bad">{len(self.hazards_after)} hazard(s) remain</span>'
        )
        parts = [
            f"<p><b>Before → after</b>: {html.escape(self.summary())} — {verdict}</p>",
            f"<h4>Records added ({len(self.records)})</h4>{rows(self.records)}",
            f"<h4>Waits added ({len(self.waits)})</h4>{rows(self.waits)}",
        ]
        if self.other:
            parts.append(f"<h4>Other syncs added ({len(self.other)})</h4>{rows(self.other)}")
        if self.removed_syncs:
            parts.append(f"<p>Syncs removed: {html.escape(', '.join(self.removed_syncs))}</p>")
        if self.fixed and self.ok and not self.introduced:  # all of them: the table above lists them
            kinds = Counter(h.kind for h in self.fixed)
            parts.append(
                f"<h4>Hazards that went away ({len(self.fixed)})</h4><p>all of them "
                f"({html.escape(', '.join(f'{k}: {n}' for k, n in sorted(kinds.items())))})</p>"
            )
        else:
            parts.append(f"<h4>Hazards that went away ({len(self.fixed)})</h4>{hazard_table(self.fixed)}")
        if self.introduced:
            parts.append(
                f'<h4 class="sp-bad">Hazards that appeared ({len(self.introduced)})</h4>{hazard_table(self.introduced)}'
            )
        if self.hazards_after and not self.introduced:
            parts.append(f"<h4>Hazards that remain ({len(self.hazards_after)})</h4>{hazard_table(self.hazards_after)}")
        return wrap_page("".join(parts))


def _dag(g) -> StreamDAG:
    if isinstance(g, StreamDAG):
        return g
    if isinstance(g, (torch.fx.GraphModule, torch.fx.Graph)):
        return StreamDAG.from_graph(g)
    raise TypeError(f"compare() takes GraphModules, Graphs or StreamDAGs, got {type(g).__name__}")


def _hkey(h) -> tuple[str, str]:
    return (h.kind, h.message)


def compare(before, after) -> Comparison:
    """Compare two versions of a graph (GraphModule, Graph or StreamDAG): syncs added, hazards fixed.

    Stream ops are matched by node name (a pass keeps the names of the nodes it does not
    touch); hazards by ``(kind, message)``.

    >>> import copy, torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4)); before = copy.deepcopy(gm); _ = sp.run(gm)
    >>> c = sp.compare(before, gm)
    >>> len(c.waits) > 0, len(c.fixed) == len(sp.verify(before).hazards), c.ok
    (True, True, True)
    """
    db, da = _dag(before), _dag(after)
    a = da.assignment
    before_syncs = {n.name for n in db.assignment.syncs}
    after_syncs = {n.name for n in a.syncs}
    records_by_event: dict[int, torch.fx.Node] = {}
    prev_on: dict[torch.fx.Node, str | None] = {}
    last: dict[int, str] = {}
    for n in a.nodes:
        s = a.stream[n]
        prev_on[n] = last.get(s)
        call = a.syncs.get(n)
        if call is not None and call.target is ops.RECORD_EVENT:
            records_by_event[call.args[0]] = n
        if a.is_compute(n) or n.op == "placeholder":
            last[s] = n.name

    cmp = Comparison(
        streams=list(da.streams),
        nodes_before=len(db.assignment.nodes),
        nodes_after=len(a.nodes),
    )
    for n in a.nodes:
        call = a.syncs.get(n)
        if call is None or n.name in before_syncs or call.target in (ops.FORK, ops.JOIN):
            continue
        s = a.stream[n]
        t = call.target
        event = call.args[0] if t in (ops.RECORD_EVENT, ops.WAIT_EVENT, ops.SYNC_EVENT, ops.SYNC_DEALLOC) else None
        if t is ops.RECORD_EVENT:
            cmp.records.append(AddedSync(call.name, n.name, s, event=event, after_node=prev_on[n]))
            continue
        protects = tuple(_protected(n, a))
        if t in (ops.WAIT_EVENT, ops.SYNC_DEALLOC):
            rec = records_by_event.get(event)
            item = AddedSync(
                call.name,
                n.name,
                s,
                event=event,
                partner=rec.name if rec is not None else None,
                partner_stream=a.stream[rec] if rec is not None else None,
                protects=protects,
            )
        elif t is ops.WAIT_STREAM:
            item = AddedSync(call.name, n.name, s, partner_stream=call.args[1], protects=protects)
        else:
            item = AddedSync(call.name, n.name, s, event=event, protects=protects)
        (cmp.waits if t in (ops.WAIT_EVENT, ops.WAIT_STREAM) else cmp.other).append(item)
    cmp.removed_syncs = sorted(before_syncs - after_syncs)
    cmp.hazards_before = list(db.hazards())
    cmp.hazards_after = list(da.hazards())
    after_keys = Counter(_hkey(h) for h in cmp.hazards_after)
    before_keys = Counter(_hkey(h) for h in cmp.hazards_before)
    cmp.fixed = _minus(cmp.hazards_before, after_keys)
    cmp.introduced = _minus(cmp.hazards_after, before_keys)
    return cmp


def _minus(hazards, keys: Counter) -> list:
    keys = Counter(keys)
    out = []
    for h in hazards:
        k = _hkey(h)
        if keys[k]:
            keys[k] -= 1
        else:
            out.append(h)
    return out


def _protected(n: torch.fx.Node, a) -> list[str]:
    """Compute nodes data-dependent on ``n`` directly or through its passthrough getitems."""
    out: list[str] = []
    seen = set()
    stack = list(n.users)
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if a.is_compute(u) or u.op == "output" or u in a.syncs:
            out.append(u.name)
        else:  # an alias (getitem of control_deps): look through it
            stack.extend(u.users)
    pos = a.position or {x: i for i, x in enumerate(a.nodes)}
    return sorted(dict.fromkeys(out), key=lambda name: pos.get(a.node_named(name), 0))

"""Apply a :class:`~streampass.transform.plan.SyncPlan`: the only module that edits graphs.

Every sync op (new or already there) is wrapped in torch's ``control_deps`` higher-order op so
that the ordering the plan relies on becomes data dependencies:

* a sync on stream ``s`` depends on every node of ``s`` issued since the previous sync of ``s``
  and on that sync (a chain per stream), so it stays after the work it covers;
* a wait depends on the record of its event;
* every consumer that relies on a wait reads the protected tensor through the wait's
  passthrough output (``getitem(control_deps(...), i)``), so it stays after the wait;
* a value whose free the plan defers rides through the wait as a passthrough argument.

Any topological order of the result is then race-free, and DCE keeps the syncs
(``control_deps`` is side-effecting). fork/join nodes are replaced by ``custom.stream``
annotations: a stream switch has no data dependencies and would not survive reordering.
"""

from __future__ import annotations

import itertools
import operator

import torch
import torch.fx

from streampass import ops
from streampass.analysis.reading import StreamAssignment, annotated_stream
from streampass.errors import StreamPassError
from streampass.ops import AMBIENT
from streampass.transform.annotations import drop_stream, set_stream
from streampass.transform.encoding import WRAPPABLE, last_work, output_value_to_thread, reads_an_input
from streampass.transform.gated_uses import GatedUses
from streampass.transform.plan import SyncPlan
from streampass.transform.reading_after import check_order, check_region, reading_after
from streampass.transform.subgraphs import drop_unused_body, free_attr, set_wrapper_val, sync_subgraph

Node = torch.fx.Node
_NAMES = {ops.RECORD_EVENT: "record_event_default", ops.WAIT_EVENT: "wait_event_default", operator.getitem: "getitem"}


class _Editor:
    """Collects what each sync needs, then rewrites the graph in one go."""

    def __init__(self, gm: torch.fx.GraphModule, plan: SyncPlan):
        self.gm, self.plan, self.a = gm, plan, plan.assignment
        self.graph = gm.graph
        self.stream: dict[Node, int] = dict(self.a.stream)
        self.gate_node: dict = {}  # PlannedWait | existing node -> sync node in the graph
        self.root: dict[Node, Node] = dict(self.a.root)
        self.index: dict[Node, int] = {}
        self.subgraphs: dict[tuple, Node] = {}
        self.placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        self.reads_input: dict[Node, bool] = {}  # encoding.reads_an_input's answers
        self.calls: dict[Node, ops.SyncCall] = dict(self.a.syncs)  # every stream op, new ones too
        self.edited: list[Node] = []  # nodes made or given new inputs, for check_order
        self.switches: list[Node] = []  # fork/join nodes, replaced by annotations
        self.read_as: dict[tuple[Node, Node], Node] = {}  # (user, value) -> what it reads instead
        self.changed = False

    def _call(self, target, args: tuple) -> Node:
        """``graph.call_function`` at the current insert point, minus its scan of ``args`` for
        raw SymInts (ours are ints and nodes): that scan was a tenth of the rewrite's time."""
        node = self.graph.create_node("call_function", target, (), name=_NAMES[target])
        node.args = args
        self.edited.append(node)
        return node

    # -- 1. insert the new plain sync nodes -------------------------------------------------
    def insert(self) -> None:
        # Records at entry (their anchor is an input) go after the leading inputs, and first,
        # so that waits inserted before the first real node follow them.
        leading = list(itertools.takewhile(lambda n: n.op in ("placeholder", "get_attr"), self.graph.nodes))

        def at_entry(r):
            return r.anchor is not None and r.anchor.op in ("placeholder", "get_attr")

        for r in self.plan.records:
            if at_entry(r):
                with self.graph.inserting_after(leading[-1]) if leading else self.graph.inserting_before(None):
                    r.node = self._new_sync(self._call(ops.RECORD_EVENT, (r.event, r.stream)), r.stream)
        for w in self.plan.waits:
            with self.graph.inserting_before(w.before):
                node = self._call(ops.WAIT_EVENT, (w.record.event, w.stream))
            self.gate_node[w] = self._new_sync(node, w.stream)
        for r in self.plan.records:
            if not at_entry(r):
                with self.graph.inserting_after(r.anchor if r.after is None else self.gate_node[r.after]):
                    r.node = self._new_sync(self._call(ops.RECORD_EVENT, (r.event, r.stream)), r.stream)

    def _new_sync(self, node: Node, s: int) -> Node:
        self.calls[node] = ops.SyncCall(node.target, node.args, node, None)
        self.stream[node] = s
        node.meta["streampass"] = "sync"
        set_stream(node, s)
        self.changed = True
        return node

    # -- 2. drop fork/join, annotate every node with its stream -----------------------------
    def normalize_streams(self) -> None:
        for node in self.graph.nodes:
            call = self.a.syncs.get(node)
            if call is not None and call.target in (ops.FORK, ops.JOIN):
                self.switches.append(node)  # erased last: an erased node cannot be restored
                self.changed = True
                continue
            s = self.stream.get(node, AMBIENT)
            if node.op not in ops.CALL_OPS:
                continue
            if s != AMBIENT:
                annotated = set_stream(node, s)
            else:  # keeps no other stream's annotation: torch copies a value's onto the getitems
                # that pass it through a sync it wraps, whose stream the sync's is
                annotated = annotated_stream(node) not in (None, AMBIENT) and drop_stream(node) is not None
            if annotated:
                self.edited.append(node)
                self.changed = True

    # -- 3. the data dependencies that encode the order -------------------------------------
    def encode(self) -> None:
        switches = set(self.switches)
        order = [n for n in self.graph.nodes if n not in switches]
        index = self.index
        index.update((n, i) for i, n in enumerate(order))
        gates = {self.gate_node.get(g, g): g for g in dict.fromkeys([*self.plan.protect, *self.plan.keepalive])}
        rewires = GatedUses(self.plan, self.stream, self.calls, self.root, index).by_sync(order, gates)

        pending: dict[int, list[Node]] = {}  # per stream: work since its last sync
        last_sync: dict[int, Node] = {}
        last_record: dict[int, Node] = {}  # per event: its latest record so far
        for n in order:
            s = self.stream.get(n, AMBIENT)
            call = self.calls.get(n)
            if call is None or call.target not in WRAPPABLE:
                if n.op in ops.CALL_OPS and n.target is not operator.getitem:
                    pending.setdefault(s, []).append(n)
                elif n.op == "get_attr" and isinstance(ops.attribute(self.gm, n.target), torch.Tensor):
                    # A parameter or buffer has no inputs: without this, a later pass may sort
                    # it after the records that cover it as an input.
                    pending.setdefault(s, []).append(n)
                continue
            deps = last_work(pending.pop(s, []))
            if s in last_sync:
                deps.append(last_sync[s])
            if call.target in (ops.WAIT_EVENT, ops.SYNC_EVENT) and call.args[0] in last_record:
                deps.append(last_record[call.args[0]])
            elif call.target is ops.WAIT_STREAM:
                other = call.args[1]
                deps += last_work(pending.get(other, [])) + ([last_sync[other]] if other in last_sync else [])
            # A use an earlier wait already rerouted now reads that wait's getitem: thread
            # the getitem through this wait too, so the user follows both.
            mine = [(user, inp, self.read_as.get((user, inp), inp)) for user, inp in rewires.get(n, ())]
            passthrough = list(dict.fromkeys(actual for _, _, actual in mine))
            gate = gates.get(n)
            for value in self.plan.keepalive.get(gate, ()) if gate is not None else ():
                if value not in passthrough and index[value] < index[n]:
                    passthrough.append(value)
            last_sync[s] = self._wrap(n, call, deps, passthrough, mine)
            if call.target is ops.RECORD_EVENT:
                last_record[call.args[0]] = last_sync[s]
        if AMBIENT in last_sync:
            self._order_output_after(last_sync[AMBIENT], index)

    def _order_output_after(self, last: Node, index) -> None:
        """Make the output read one value through ``last`` (:func:`encoding.output_value_to_thread`)."""
        out = next(iter(self.graph.find_nodes(op="output")), None)
        use = output_value_to_thread(out, last, index) if out is not None else None
        if use is not None:
            user, value = use
            self._wrap(last, ops.as_sync_call(last), [], [value], [(user, value, value)])

    def _wrap(self, sync: Node, call: ops.SyncCall, deps: list[Node], passthrough, rewires) -> Node:
        """Wrap a plain sync in ``control_deps`` (or extend an existing wrapper); returns the wrapper."""
        if call.wrapper is not None:
            wrapped = call.wrapper
            old_pass = ops.passthrough_values(wrapped)
            missing = [d for d in deps if d not in wrapped.args[0] and d is not wrapped]
            new_pass = [p for p in passthrough if p not in old_pass]
            if missing or new_pass:
                all_pass, old_body = old_pass + new_pass, wrapped.args[1]
                wrapped.args = (
                    tuple(wrapped.args[0]) + tuple(missing),
                    self._subgraph(call, len(all_pass), ops.added_by_streampass(wrapped)),
                    *call.args,
                    *all_pass,
                )
                if drop_unused_body(self.gm, old_body):  # the body it had served it alone
                    self.subgraphs = {k: g for k, g in self.subgraphs.items() if g is not old_body}
                self.edited.append(wrapped)
                self.changed = True
            self._reroute(wrapped, ops.passthrough_values(wrapped), rewires)
            return wrapped
        if self.placeholders and not any(reads_an_input(n, self.reads_input) for n in (*deps, *passthrough)):
            deps = [*deps, self.placeholders[0]]  # else a re-trace (unpickling) runs the sync at trace time
        # The plain sync node becomes its own wrapper (no new node): same name, place and meta.
        getter = self._subgraph(call, len(passthrough), ops.added_by_streampass(sync))
        sync.target = ops.CONTROL_DEPS
        sync.args = (tuple(deps), getter, *call.args, *passthrough)
        if sync.kwargs:
            sync.kwargs = {}  # call.args holds them in schema order (FX's setter is not free)
        self.edited.append(sync)
        self.changed = True
        self._reroute(sync, passthrough, rewires)
        return sync

    def _subgraph(self, call: ops.SyncCall, n_pass: int, added: bool) -> Node:
        """The get_attr node of the shared subgraph ``(*int_args, *passthrough) -> (op(...), *passthrough)``.

        One subgraph serves every sync with the same op and passthrough count: the event and
        stream indices are arguments, not constants, so thousands of syncs share a handful
        of subgraph modules. Those of the syncs streampass ``added`` are named apart.
        """
        key = (call.target, len(call.args), n_pass, added)
        getter = self.subgraphs.get(key)
        if getter is None:
            attr = free_attr(self.gm, f"{ops.ADDED_SYNC_PREFIX if added else 'streampass_'}{call.name}_{n_pass}")
            self.gm.add_submodule(attr, sync_subgraph(self.gm, call.target, len(call.args), n_pass))
            where = self.placeholders[-1] if self.placeholders else None
            with self.graph.inserting_after(where) if where is not None else self.graph.inserting_before(None):
                getter = self.subgraphs[key] = self.graph.get_attr(attr)
        return getter

    def _reroute(self, wrapped: Node, passthrough: list[Node], rewires) -> None:
        set_wrapper_val(wrapped)
        outs: dict[Node, Node] = {}
        for user in wrapped.users:
            if (
                user.target is operator.getitem
                and isinstance(user.args[1], int)
                and 1 <= user.args[1] <= len(passthrough)
            ):
                outs.setdefault(passthrough[user.args[1] - 1], user)
        last = wrapped
        for user, original, inp in rewires:
            if inp not in outs:
                with self.graph.inserting_after(last):
                    g = self._call(operator.getitem, (wrapped, passthrough.index(inp) + 1))
                g.meta.update(inp.meta)
                # the same tensor: it binds none of inp's unbacked symbols anew (inductor's
                # FakeTensorUpdater, re-deriving the getitem, would rename them: "u4 -> u0")
                g.meta.pop("unbacked_bindings", None)
                self.stream[g] = self.stream[wrapped]
                self.root[g] = self.root.get(inp, inp)
                self.index[g] = self.index[wrapped]
                set_stream(g, self.stream[wrapped])
                outs[inp] = g
                last = g
            user.replace_input_with(inp, outs[inp])
            self.read_as[user, original] = outs[inp]
            self.edited.append(user)
            self.changed = True

    def drop_switches(self) -> None:
        """Erase the fork/join nodes. Last, after every check: undoing an erasure reaches into
        FX internals (streampass.transform.snapshot), so the pass avoids needing it."""
        for node in self.switches:
            if node.users:
                raise StreamPassError(
                    f"{node.name} switches streams but its result is used by {next(iter(node.users)).name}; "
                    "fork/join return nothing to use",
                    node.name,
                )
        for node in self.switches:
            self.graph.erase_node(node)


def apply_plan(gm: torch.fx.GraphModule, plan: SyncPlan, recompile: bool = True) -> bool:
    """Edit ``gm`` as ``plan`` says; returns whether anything changed (then recompiles ``gm``
    unless ``recompile=False``). :func:`streampass.run` wraps this with reading, planning,
    verification and the all-or-nothing guarantee; use that.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> plan = sp.plan_syncs(sp.read_streams(gm))
    >>> apply_plan(gm, plan), sp.verify(gm).ok
    (True, True)
    """
    return apply_and_read(gm, plan, recompile)[0]


def apply_and_read(gm: torch.fx.GraphModule, plan: SyncPlan, recompile: bool = True) -> tuple[bool, StreamAssignment]:
    """:func:`apply_plan`, and the edited graph's reading from the edit's bookkeeping
    (:mod:`streampass.transform.reading_after`, whose example calls this), its edited nodes
    checked against the graph."""
    editor = _Editor(gm, plan)
    editor.insert()
    editor.normalize_streams()
    editor.encode()
    if not editor.changed:
        return False, plan.assignment
    check_order(gm.graph, editor.edited)
    editor.drop_switches()
    after = reading_after(plan.assignment, gm.graph, editor.stream, editor.calls, editor.root)
    check_region(after, editor.edited)
    if recompile:
        gm.recompile()
    return True, after

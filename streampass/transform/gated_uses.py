"""Which uses each sync carries: the consumers that must stay after a wait read one protected value
through the wait's passthrough output, and this module picks those uses (pure analysis; the
rewrite is :mod:`streampass.transform.apply`'s).

A consumer that must follow several waits of its stream reads one value through the latest of them
(the per-stream chain of syncs orders it after the earlier ones), or nothing when one of its
same-stream inputs already follows it. Passthroughs are looked through, so a second run reaches the
same decisions and changes nothing.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from streampass import ops, values
from streampass.analysis.reading import StreamAssignment
from streampass.analysis.requirements import is_tensor_value
from streampass.ops import AMBIENT
from streampass.transform.encoding import WRAPPABLE
from streampass.transform.plan import SyncPlan
from streampass.transform.user_waits import input_reads_after_user_waits

Node = torch.fx.Node
Use = tuple[Node, Node]  # (user, the input it reads)


class GatedUses:
    """The graph as the rewrite sees it before any rerouting: ``stream``, ``calls`` and ``root``
    include the syncs the plan just inserted; ``index`` is each node's position in ``order``."""

    def __init__(self, plan: SyncPlan, stream: dict[Node, int], calls: dict, root: dict[Node, Node], index):
        self.plan, self.a = plan, plan.assignment
        self.stream, self.calls, self.root, self.index = stream, calls, root, index

    def by_sync(self, order: list[Node], gates: dict) -> dict[Node, list[Use]]:
        """sync node -> the uses ``(user, input)`` to read through it. ``gates`` maps each sync
        node that protects something to its plan entry (a planned wait, or the node itself).
        The consumers: the plan's, and the reads of graph inputs after a program's own waits.

        ``after[n]``: the position, among the syncs of ``n``'s stream, of the latest sync ``n``
        follows through same-stream data.
        """
        a: StreamAssignment = self.a
        needs: dict[Node, list[tuple[Node, Node]]] = {}  # consumer -> [(sync node, value)]
        for sync, gate in gates.items():
            for consumer, value in self.plan.protect.get(gate, ()):
                if value is not None:
                    needs.setdefault(consumer, []).append((sync, value))
        program = input_reads_after_user_waits(order, self.stream, self.calls, self.root, a.hidden)
        for consumer, pairs in program.items():
            needs.setdefault(consumer, []).extend(pairs)
        stream, getitem = self.stream, operator.getitem
        chain: dict[Node, int] = {}
        count: dict[int, int] = {}
        after: dict[Node, int] = {}
        out: dict[Node, list[Use]] = {}
        for n in order:
            s = stream.get(n, AMBIENT)
            call = self.calls.get(n)
            if call is not None and call.target in WRAPPABLE:
                count[s] = chain[n] = after[n] = count.get(s, 0) + 1
                continue
            base = 0
            for x in ops.input_nodes(n):
                while x is not None:  # look through passthroughs, as if never rerouted
                    if stream.get(x, AMBIENT) == s:
                        b = after.get(x, 0)
                        if b > base:
                            base = b
                    x = ops.passthrough_source(x) if x.target is getitem else None
            todo = []
            for sync, value in needs.get(n, ()):
                same = stream.get(sync, AMBIENT) == s  # (a gate is a wait of its consumer's stream)
                uses = self.uses(n, value, sync)
                if uses is None:  # some path already passes the sync (an earlier run's reroute)
                    if same:
                        base = max(base, chain[sync])
                elif uses:
                    todo.append((chain[sync], same, sync, uses))
            # The output reads every protected value through its own wait: a partitioner may
            # split the outputs, and each part must still carry its value's order.
            exit_node = n.op == "output"
            for k, same, sync, uses in sorted(todo, key=lambda t: -t[0]):
                if same and k <= base and not exit_node:
                    continue
                for user, inp in uses:
                    out.setdefault(sync, []).append((user, inp))
                    if same and stream.get(user, AMBIENT) == s:
                        after[user] = max(after.get(user, 0), k)
                if same:
                    base = k
            after[n] = base
        return out

    def uses(self, consumer: Node, value: Node, sync: Node) -> list[Use] | None:
        """The uses (user, input) on ``consumer``'s path to ``value`` to reroute through ``sync``; None if a
        path already passes ``sync`` or a later sync of its stream (then the per-stream chain orders it).

        ``consumer`` may read ``value`` through views made after the sync: the first use whose input is
        defined before the sync is the one to reroute. A submodule's own tensor (``a.hidden``) is no argument:
        a tensor argument's use carries its order (its own input's, :func:`_carrier`, if issued after the sync
        yet not ordered after it).
        """
        index, stream = self.index, self.stream
        found = []
        hidden = any(value in roots for roots in self.a.hidden.get(consumer, ()))
        for inp in ops.input_nodes(consumer):
            if found and hidden:
                break
            if not (is_tensor_value(inp) if hidden else self.root.get(inp, inp) is value):
                continue
            user, x = consumer, inp
            while True:
                src = ops.passthrough_source(x)
                if src is not None:
                    holder = x.args[0]
                    if stream.get(holder) == stream.get(sync) and index[holder] >= index[sync]:
                        return None
                if index[x] < index[sync]:
                    found.append((user, x))
                    break
                nxt = src if src is not None else values.aliases_input(x)
                if src is None and nxt is not None and x.target is operator.getitem and x.args[0] is not nxt:
                    # One result of a call that returns its arguments or views of them
                    # (``meshgrid(a, b)[1]``, an ``out=`` tuple's): the call is the use that reads it.
                    made = x.args[0]
                    if index[made] < index[sync]:
                        break  # only the tuple is older than the sync, and it cannot pass through
                    user, x = made, nxt
                    continue
                if nxt is None and hidden and stream.get(x) == stream.get(sync):
                    nxt = _carrier(x)
                if nxt is None:
                    break  # made after the sync on this path: nothing before the sync to guard
                user, x = x, nxt
        return found


def _carrier(node: Node) -> Node | None:
    """The input of ``node`` whose use carries an order through a wait: its first tensor input, else
    its first input of another kind (a size it is made from), never a sync's wrapper."""
    inputs = [i for i in ops.input_nodes(node) if i.target is not ops.CONTROL_DEPS]
    return next((i for i in inputs if is_tensor_value(i)), inputs[0] if inputs else None)

"""The planner's search state: per-stream vector clocks that can be copied cheaply
(:class:`Clocks`), the demands the walk meets (:class:`Demand`), and which clock positions a
later demand can still test (:class:`StillNeeded`), so equal states merge."""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import defaultdict
from dataclasses import dataclass, field

import torch.fx

Node = torch.fx.Node


class Clocks:
    """What each stream knows of every other stream, when, and what existing records captured.

    ``k[b * n + s]`` is how many nodes of stream ``s`` stream ``b`` knows to be complete. A
    stream's knowledge of itself is how many of its nodes were issued, the same in every
    state of the search, so it lives outside (``issued``) and the diagonal is unused.
    ``hpos[b]``/``hrow[b]`` keep b's row each time it changed, so the row b had when its
    node ``p`` was issued (what a record right after ``p`` captures) can be looked up.
    """

    __slots__ = ("events", "hpos", "hrow", "k", "n")

    def __init__(self, n: int):
        self.n = n
        self.k = [0] * (n * n)
        self.events: dict[int, list[int]] = {}
        self.hpos = [[0] for _ in range(n)]
        self.hrow = [[(0,) * n] for _ in range(n)]

    def copy(self) -> Clocks:
        c = Clocks.__new__(Clocks)
        c.n, c.k = self.n, list(self.k)
        c.events = {e: list(v) for e, v in self.events.items()}
        c.hpos = [list(h) for h in self.hpos]
        c.hrow = [list(h) for h in self.hrow]
        return c

    def know(self, issued: list[int], b: int, s: int) -> int:
        return issued[s] if s == b else self.k[b * self.n + s]

    def row(self, issued: list[int], b: int) -> list[int]:
        r = self.k[b * self.n : (b + 1) * self.n]
        r[b] = issued[b]
        return r

    def snap(self, a: int, p: int) -> list[int]:
        """Stream a's row when its p-th node was issued (p itself included)."""
        h = self.hpos[a]
        r = list(self.hrow[a][bisect.bisect_left(h, p) - 1])
        r[a] = p
        return r

    def join(self, issued: list[int], b: int, src: list[int], gate=None, gained=None) -> None:
        k, base, changed = self.k, b * self.n, False
        for i, v in enumerate(src):
            if i != b and v > k[base + i]:
                k[base + i] = v
                changed = True
                if gained is not None:
                    gained(b, i, v, gate)
        if changed:
            row = tuple(k[base : base + self.n])
            if self.hpos[b][-1] == issued[b]:
                self.hrow[b][-1] = row
            else:
                self.hpos[b].append(issued[b])
                self.hrow[b].append(row)

    def dominates(self, other: Clocks, shared: list[int]) -> bool:
        """At least as much knowledge now and at every past point. Histories agree on their
        first ``shared[b]`` entries (every state descends from one state that had them)."""
        if any(h[i:] != o[i:] for h, o, i in zip(self.hpos, other.hpos, shared)):
            return False  # knowledge changed at different points: not comparable
        return (
            all(map(operator.ge, self.k, other.k))
            and all(
                all(map(operator.ge, x, y))
                for hs, ho, i in zip(self.hrow, other.hrow, shared)
                for x, y in zip(hs[i:], ho[i:])
            )
            and all(e in self.events and all(map(operator.ge, self.events[e], c)) for e, c in other.events.items())
        )

    def total(self) -> int:
        return sum(self.k)


def does_no_work(node: Node) -> bool:
    """A call that launches nothing on the device: a getitem (of a tuple or a passthrough)."""
    return node.op == "call_function" and node.target is operator.getitem


class StillNeeded:
    """Which positions of each stream some demand not yet reached still needs.

    Knowledge that no remaining demand can test is irrelevant: a clock entry ``v`` of stream
    ``s`` behaves exactly like the largest still-needed position ``<= v``. Rounding every
    state down to that (:meth:`canon`) makes states that differ only in irrelevant knowledge
    equal, which keeps the search's frontier small. Union-find over positions gives the
    "largest still-needed position <= v" query in near-constant time.
    """

    def __init__(self, counts: list[int], demands: list[Demand]):
        # Every position not needed points one down; position 0 is always "needed".
        self.parent = [[0, *range(c)] for c in counts]
        last: dict[tuple[int, int], int] = {}
        for k, d in enumerate(demands):
            for sp in d.slots:
                last[sp] = k
        self.retire: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for (s, p), k in last.items():
            self.retire[k].append((s, p))
            self.parent[s][p] = p

    def find(self, s: int, v: int) -> int:
        parent = self.parent[s]
        root = v
        while parent[root] != root:
            root = parent[root]
        while parent[v] != root:
            parent[v], v = root, parent[v]
        return root

    def done(self, k: int) -> None:
        """Demand ``k`` is planned: positions no later demand needs stop mattering."""
        for s, p in self.retire.pop(k, ()):
            self.parent[s][p] = p - 1

    def canon(self, clk: Clocks, shared: list[int]) -> tuple:
        n = clk.n
        k = clk.k
        for i in range(n * n):
            b, s = divmod(i, n)
            if b != s and k[i]:
                k[i] = self.find(s, k[i])
        for c in clk.events.values():
            for s, v in enumerate(c):
                if v:
                    c[s] = self.find(s, v)
        rows = tuple(
            tuple(tuple(self.find(s, v) if v else 0 for s, v in enumerate(r)) for r in h[i:])
            for h, i in zip(clk.hrow, shared)
        )
        hpos = tuple(tuple(h[i:]) for h, i in zip(clk.hpos, shared))
        return (tuple(k), rows, hpos, tuple(sorted((e, tuple(c)) for e, c in clk.events.items())))


def covering_sets(snaps: dict[int, list[int]], useful: list[int], unmet, limit: int) -> tuple[list, bool]:
    """Every set of ``useful`` streams whose snapshots together cover ``unmet`` (``(stream,
    position)`` pairs), with the knowledge it brings, fewest members first; and whether that is
    every set. A stream that alone covers one of ``unmet`` is in every set (joining many
    streams has only those); the others are tried in every combination, unless there are more
    than ``limit``: then one greedy cover (not every set).

    >>> snaps = {1: [0, 5, 0, 0], 2: [0, 0, 3, 0], 3: [0, 5, 3, 0]}  # stream 3 knows both
    >>> [c for c, _ in covering_sets(snaps, [1, 2, 3], [(1, 5), (2, 3)], 8)[0]]
    [(3,), (1, 2), (1, 3), (2, 3), (1, 2, 3)]
    >>> covering_sets(snaps, [1, 2, 3], [(1, 5), (2, 3)], 1)
    ([((3,), [0, 5, 3, 0])], False)
    """
    if len(useful) == 1:  # the common case: one producer stream
        joined = snaps[useful[0]]
        return ([((useful[0],), joined)] if all(joined[s] >= p for s, p in unmet) else []), True
    covers = [[a for a in useful if snaps[a][s] >= p] for s, p in unmet]
    if not all(covers):
        return [], True
    forced = sorted({c[0] for c in covers if len(c) == 1})
    optional = [a for a in useful if a not in forced]
    if len(optional) > limit:
        combo = list(forced)
        joined = [max(col) for col in zip(*(snaps[a] for a in combo))] if combo else [0] * len(snaps[useful[0]])
        left = [(s, p) for s, p in unmet if joined[s] < p]
        while left:  # the stream that covers most of what is left
            best = max(optional, key=lambda a: (sum(snaps[a][s] >= p for s, p in left), -a))
            combo.append(best)
            joined = [max(x, y) for x, y in zip(joined, snaps[best])]
            left = [(s, p) for s, p in left if joined[s] < p]
        return [(tuple(sorted(combo)), joined)], False
    out = []
    for size in range(len(optional) + 1):
        for extra in itertools.combinations(optional, size):
            combo = tuple(sorted((*forced, *extra)))
            if combo:
                joined = [max(col) for col in zip(*(snaps[a] for a in combo))]
                if all(joined[s] >= p for s, p in unmet):
                    out.append((combo, joined))
    out.sort(key=lambda o: (len(o[0]), o[0]))
    return out, True


@dataclass
class Demand:
    stream: int  # slot
    needs: list[tuple[Node, Node | None]]
    before: Node
    on_gate: object  # callable(gate, value)
    slots: list[tuple[int, int]] = field(default_factory=list)  # (stream slot, position) per need
    at_exit: bool = False  # the output or a free point: nothing runs after it on its stream
    free_point: bool = False

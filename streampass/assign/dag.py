"""The work graph the assigner places on streams: compute nodes, what each must wait for, what
each costs, and which nodes the user already placed (fixed).

Edges are the program's own orderings (``requirements(..., same_stream=True)``: a read after
the write it reads, a write after earlier reads and writes of its storage), between compute
nodes only: views and the getitems of multi-output ops launch nothing (docs/design.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx
import torch.fx

from streampass import ops
from streampass.analysis import bodies
from streampass.analysis.reading import StreamAssignment
from streampass.analysis.requirements import Accesses, Orderings, accesses
from streampass.ops import AMBIENT
from streampass.sim.cost import CostModel, DeviceProfile

Node = torch.fx.Node


def fixed_streams(a: StreamAssignment) -> dict[Node, tuple[int, str]]:
    """Compute nodes whose stream the graph already decides, with the reason: a ``custom.stream``
    annotation, or an open fork/join region around it.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> a = sp.read_streams(make_fx(f)(torch.ones(2)))
    >>> {n.name: v for n, v in fixed_streams(a).items()}
    {'sin': (1, 'fixed by user annotation')}
    """
    out: dict[Node, tuple[int, str]] = {}
    depth = 0
    for node in a.nodes:
        call = a.syncs.get(node)
        if call is not None:
            depth += 1 if call.target is ops.FORK else -1 if call.target is ops.JOIN else 0
            continue
        if not a.is_compute(node):
            continue
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and custom.get("stream") is not None:
            out[node] = (a.stream[node], "fixed by user annotation")
        elif bodies.inlines(node, bodies.NODE_BY_NODE_OPS):
            out[node] = (a.stream[node], "fixed: inductor lowers its function here, each node on its own stream")
        elif depth > 0:
            out[node] = (a.stream[node], "fixed by an enclosing fork/join region")
    module = a.graph.owning_module
    if isinstance(module, torch.fx.GraphModule):
        for op, (name, streams) in bodies.ops_with_streams(module, a).items():
            if op not in out and a.is_compute(op):
                out[op] = (
                    AMBIENT,
                    f"its body {name} places work on streams {streams}: run plans a body from the ambient stream",
                )
    return out


@dataclass
class WorkGraph:
    """The compute nodes of a graph in issue order, with their dependencies and times.

    ``time[n]``: the cost model's seconds (one launch included); ``device[n]``: that time less
    the launch overhead, the part that other streams can overlap. ``fixed``: node -> (stream,
    why). :attr:`nx`: the dependency DAG over the nodes (networkx, edges ``before -> after``).
    ``accesses``: what each node reads and writes (``requirements.accesses``), and
    ``orderings``: every ordering of the graph (``requirements.Orderings``), which every
    candidate's sync plan reuses.
    """

    nodes: list[Node]
    preds: dict[Node, list[Node]]
    succs: dict[Node, list[Node]]
    time: dict[Node, float]
    device: dict[Node, float]
    fixed: dict[Node, tuple[int, str]]
    profile: DeviceProfile
    accesses: Accesses = field(repr=False, default_factory=dict)
    orderings: Orderings | None = field(repr=False, default=None)

    @property
    def nx(self) -> nx.DiGraph:
        """The dependencies as a ``networkx.DiGraph`` (built on first use: the search needs none)."""
        cached = self.__dict__.get("_nx")
        if cached is None:
            cached = self.__dict__["_nx"] = nx.DiGraph()
            cached.add_nodes_from(self.nodes)
            cached.add_edges_from((u, v) for v in self.nodes for u in self.preds[v])
        return cached

    @property
    def free(self) -> list[Node]:
        return [n for n in self.nodes if n not in self.fixed]

    def base(self) -> dict[Node, int]:
        """Every node on the ambient stream except the fixed ones."""
        return {n: self.fixed[n][0] if n in self.fixed else AMBIENT for n in self.nodes}

    def critical_path(self) -> list[Node]:
        """The longest chain of dependencies by cost-model time (:func:`longest_path`)."""
        cached = self.__dict__.get("_critical_path")
        if cached is None:
            cached = self.__dict__["_critical_path"] = longest_path(self.nodes, self.preds, self.time)
        return list(cached)

    def reduction(self) -> nx.DiGraph:
        """The transitive reduction of the dependencies (Nimble's minimum equivalent graph), as
        :func:`transitive_reduction` computes it (the same graph as ``networkx.transitive_reduction``)."""
        cached = self.__dict__.get("_reduction")
        if cached is None:
            g = nx.DiGraph()
            g.add_nodes_from(self.nodes)
            g.add_edges_from(self.reduced_edges())
            cached = self.__dict__["_reduction"] = g
        return cached

    def reduced_edges(self) -> list[tuple[Node, Node]]:
        """The edges of :meth:`reduction`, without building a networkx graph (the candidates
        need only the edges)."""
        cached = self.__dict__.get("_reduced_edges")
        if cached is None:
            cached = self.__dict__["_reduced_edges"] = transitive_reduction(self.nodes, self.succs)
        return cached


def longest_path(order: list, preds: Mapping[object, list], time: Mapping[object, float]) -> list:
    """The heaviest path of the DAG ``preds`` (node -> its predecessors), a node weighing
    ``time[node]``, for ``order`` a topological order of its nodes; ties go to the first
    predecessor listed, and to the path that ends first in ``order``.

    What ``networkx.dag_longest_path`` gives on the same DAG with a source before every node,
    except among equal paths, where networkx prefers the first end in its own topological
    order (tests/test_assign.py checks the two weigh the same on random DAGs). Networkx sorts
    the graph first and builds it as a graph of its own: a tenth of the candidates' time on a
    3,800-node training graph, for one pass of this.

    >>> preds = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    >>> longest_path(["a", "b", "c", "d"], preds, {"a": 1.0, "b": 1.0, "c": 2.0, "d": 1.0})
    ['a', 'c', 'd']
    """
    dist: dict = {}
    back: dict = {}
    end, longest = None, -1.0
    for v in order:
        t = time[v]
        best, via = t, None  # from the source: the path that starts at v
        for u in preds[v]:
            d = dist[u] + t
            if d > best or (d == best and via is None):
                best, via = d, u
        dist[v], back[v] = best, via
        if best > longest:
            end, longest = v, best
    path = []
    while end is not None:
        path.append(end)
        end = back[end]
    return path[::-1]


def transitive_reduction(order: list, succs: Mapping[object, list]) -> list[tuple[object, object]]:
    """The edges ``u -> v`` of the DAG ``succs`` that no longer path implies, for ``order`` a
    topological order of its nodes (the issue order, for a graph's work).

    A DAG's transitive reduction is unique, so this is ``networkx.transitive_reduction``'s graph
    (tests/test_assign.py checks it on random DAGs), computed with one bitset of descendants per
    node: networkx walks the descendants of every node again (O(nodes × edges) Python steps,
    1.7 s of a 4.5 s assignment on a 3,800-node training graph); here a node's successors,
    taken in topological order, are each one test and one bitwise or.

    >>> succs = {"a": ["b", "c"], "b": ["c"], "c": []}
    >>> transitive_reduction(["a", "b", "c"], succs)
    [('a', 'b'), ('b', 'c')]
    """
    index = {n: i for i, n in enumerate(order)}
    below = [0] * len(order)  # node i -> the bits of every node reachable from it, itself included
    implied = [0] * len(order)  # node i -> the bits of its successors another successor reaches
    for i in range(len(order) - 1, -1, -1):
        reach = 0
        # A successor that an earlier successor reaches comes later in topological order.
        for j in sorted(index[v] for v in succs[order[i]]):
            if reach >> j & 1:
                implied[i] |= 1 << j
            else:
                reach |= below[j]
        below[i] = reach | 1 << i
    return [(u, v) for i, u in enumerate(order) for v in succs[u] if not implied[i] >> index[v] & 1]


def work_graph(a: StreamAssignment, model: CostModel, fixed: dict | None = None) -> WorkGraph:
    """The :class:`WorkGraph` of a reading (``fixed``: its :func:`fixed_streams`, if known).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> w = work_graph(sp.read_streams(make_fx(lambda x: x.sin() + x.cos())(torch.ones(2))), CostModel())
    >>> [n.name for n in w.nodes], [u.name for u in w.preds[w.nodes[-1]]]
    (['sin', 'cos', 'add'], ['sin', 'cos'])
    """
    nodes = [n for n in a.nodes if a.is_compute(n)]
    preds: dict[Node, list[Node]] = {n: [] for n in nodes}
    succs: dict[Node, list[Node]] = {n: [] for n in nodes}
    table = accesses(a)
    orderings = Orderings(a, table)
    seen: set[tuple[Node, Node]] = set()
    for r in orderings.all:
        u, v = r.before, r.after
        if u is v or u not in preds or v not in preds or (u, v) in seen:
            continue
        seen.add((u, v))
        preds[v].append(u)
        succs[u].append(v)
    launch = model.profile.launch_overhead
    time = model.node_times(nodes)
    device = {n: max(0.0, t - launch) for n, t in time.items()}
    fixed = fixed_streams(a) if fixed is None else fixed
    return WorkGraph(nodes, preds, succs, time, device, fixed, model.profile, table, orderings)

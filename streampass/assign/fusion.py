"""Keep together what inductor will fuse: its scheduler never fuses nodes on different streams
(``Scheduler.can_fuse``: "Prevent fusion across stream boundaries"), so an assignment that splits
a chain of pointwise ops turns one kernel into several, a cost the pre-fusion post-grad graph
does not show. ``assign_streams(..., keep_fusions=True)``, which ``assign="auto"`` inside
``torch.compile`` uses, places each such chain as one unit.

The groups approximate inductor's vertical fusion: a pointwise op joins the group of every
pointwise input it reads (through views), and a reduction joins the group of its pointwise
inputs, unless the merged group would have to run both before and after some other node, or
would hold reductions over different loops. Matmuls, convolutions and other extern kernels stay
on their own. Horizontal fusion (siblings reading the same input) is not modelled: splitting
siblings costs a launch, not a round trip through memory.

:func:`fused_cost` prices each group as the one kernel inductor makes of it, so that a candidate
is not charged a launch and a round trip through memory for every op of a chain that will run as
one kernel.
"""

from __future__ import annotations

from operator import getitem

import networkx as nx
import torch
import torch.fx

from streampass.analysis.reading import StreamAssignment
from streampass.analysis.requirements import requirements
from streampass.assign.dag import WorkGraph, fixed_streams
from streampass.sim.cost import CostModel
from streampass.sim.tensors import covered_bytes, numel
from streampass.values import written_arguments

Node = torch.fx.Node


def _tagged(node: Node, tag) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and tag in node.target.tags


def fusion_groups(a: StreamAssignment) -> list[list[Node]]:
    """The compute nodes inductor would fuse into one kernel, each group in issue order: the
    fusion edges above, taken in issue order, each merging two groups unless the merged kernel
    would both feed and wait for a node outside it (a matmul between a forward ReLU and its
    backward, say): inductor refuses those fusions (``will_fusion_create_cycle``) too.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x, w):
    ...     return ((x @ w).relu() * 2).sum() + (x @ w.t()).sigmoid().sum()
    >>> [[n.name for n in g] for g in fusion_groups(sp.read_streams(make_fx(f)(torch.ones(4, 4), torch.ones(4, 4))))]
    [['relu', 'mul', 'sum_1'], ['sigmoid', 'sum_2']]
    >>> def g(x, w):
    ...     h = x.relu()
    ...     return (h @ w) * h  # mul reads relu, but also the matmul that waits for relu
    >>> fusion_groups(sp.read_streams(make_fx(g)(torch.ones(4, 4), torch.ones(4, 4))))
    []
    """
    pointwise, reduction = torch.Tag.pointwise, torch.Tag.reduction
    compute = [n for n in a.nodes if a.is_compute(n)]
    maker = _makers(a)
    succs: dict[Node, set[Node]] = {n: set() for n in compute}  # every ordering, in-place ones too
    for r in requirements(a, same_stream=True)[0]:
        if r.before in succs and r.after in succs and r.before is not r.after:
            succs[r.before].add(r.after)
    pos = a.position or {n: i for i, n in enumerate(a.nodes)}
    groups = nx.utils.UnionFind()
    members: dict[Node, set[Node]] = {}
    loops: dict[Node, object] = {}  # group -> the iteration space of its reductions, if any
    for n in compute:
        if not (_tagged(n, pointwise) or _tagged(n, reduction)):
            continue
        if _tagged(n, reduction):
            loops[n] = _reduction_loops(n)
        for inp in n.all_input_nodes:
            src = maker(inp)
            if src is None or src is n or not _tagged(src, pointwise) or groups[src] is groups[n]:
                continue
            mine, theirs = loops.get(groups[n]), loops.get(groups[src])
            if mine is not None and theirs is not None and mine != theirs:
                continue  # reductions over different loops are different kernels
            roots = (groups[src], groups[n])
            merged = members.get(roots[0], {src}) | members.get(roots[1], {n})
            # Paths go forward in issue order except through a group, and every group holds only
            # nodes up to n (the edges are taken in n's order): nothing after n can lead back.
            if not _feeds_and_waits(merged, succs, lambda w: members.get(groups[w], (w,)), pos, pos[n]):
                for root in roots:
                    members.pop(root, None)
                    loops.pop(root, None)
                groups.union(src, n)
                members[groups[n]] = merged
                loops[groups[n]] = mine if mine is not None else theirs
    out = [sorted(m, key=pos.__getitem__) for m in members.values() if len(m) > 1]
    return sorted(out, key=lambda g: pos[g[0]])


def _makers(a: StreamAssignment):
    """node -> the kernel that made the value it stands for: itself for a compute node, the op a
    view or a getitem reads from, None for inputs. An in-place op is the maker of its result."""

    def maker(n: Node) -> Node | None:
        while not a.is_compute(n):
            if n.target is getitem or (a.root.get(n, n) is not n and n.all_input_nodes):
                n = n.all_input_nodes[0]  # a view's base, a getitem's op
            else:
                return None
        return n

    return maker


def _reduction_loops(n: Node) -> object:
    """A reduction's iteration space as inductor groups kernels by it: (elements out, elements
    reduced into each); a reduction whose sizes are unknown gets a space of its own."""
    out = numel(n.meta.get("val"))
    src = next((k for k in (numel(i.meta.get("val")) for i in n.all_input_nodes) if k), None)
    return (out, src // max(out, 1)) if out is not None and src is not None else n


def _feeds_and_waits(group: set[Node], succs: dict[Node, set[Node]], group_of, pos, window) -> bool:
    """Whether something outside ``group`` depends on it and is depended on by it: one kernel
    made of ``group`` would have to run both before and after it. ``group_of(w)``: the members of
    the group ``w`` is in (a group is one kernel, so a path that enters it may leave from any
    member). Nodes positioned after ``window`` are not searched: no group reaches back from there."""
    seen: set[Node] = set(group)
    todo = [s for m in group for s in succs[m] if s not in group]
    while todo:
        w = todo.pop()
        if w in seen or pos[w] > window:
            continue
        for v in group_of(w):
            seen.add(v)
            for s in succs[v]:
                if s in group:
                    return True
                if s not in seen:
                    todo.append(s)
    return False


#: why a fusion group stays on one stream
FUSED = "inductor fuses them, and never across streams"


def keep_together(
    w: WorkGraph, streams: dict[Node, int], groups: list[list[Node]]
) -> tuple[dict[Node, int], dict[Node, str]]:
    """``streams`` with each group on one stream: a fixed member's (when the fixed members agree;
    otherwise the group is left as it is), else the stream of its heaviest member. A group may
    say why it is kept together (``group.why``); by default, inductor fuses it.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from streampass.assign.dag import work_graph
    >>> from streampass.sim.cost import CostModel
    >>> a = sp.read_streams(make_fx(lambda x: x.exp().relu())(torch.ones(4)))
    >>> w = work_graph(a, CostModel())
    >>> exp, relu = w.nodes
    >>> kept, why = keep_together(w, {exp: 1, relu: 0}, fusion_groups(a))
    >>> kept[relu], why[relu]
    (1, 'kept with exp on its stream: inductor fuses them, and never across streams')
    """
    out = dict(streams)
    notes: dict[Node, str] = {}
    for group in groups:
        fixed = {w.fixed[n][0] for n in group if n in w.fixed}
        if len(fixed) > 1:
            continue
        head = max(group, key=lambda n: (n in w.fixed, w.device.get(n, 0.0)))
        s = fixed.pop() if fixed else out[head]
        for n in group:
            if out[n] != s and n not in w.fixed:
                out[n] = s
                notes[n] = f"kept with {head.name} on its stream: {getattr(group, 'why', FUSED)}"
    return out, notes


def fused_cost(a: StreamAssignment, groups: list[list[Node]], model: CostModel, fixed: dict | None = None) -> CostModel:
    """``model`` with each group priced as one kernel: the members' flops, the group's inputs
    read once and the values it hands out (to other nodes or the output) written once, one
    launch. The last member (in issue order) carries that time and the others cost nothing, so
    the simulated kernel starts when the whole group's inputs are ready and launches once.
    Groups the graph itself splits over streams (fixed members on different streams) stay
    priced per op, as do nodes ``model``'s own overrides price. ``fixed``: the reading's
    :func:`~streampass.assign.dag.fixed_streams`, if known.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: x.exp().relu().sigmoid())(torch.empty(2**20, device="meta"))
    >>> a, base = sp.read_streams(gm), CostModel("h100")
    >>> fused = fused_cost(a, fusion_groups(a), base)
    >>> exp, relu, sigmoid = [n for n in a.nodes if a.is_compute(n)]
    >>> fused.node_time(exp), fused.node_time(sigmoid) == base.kernel_time(0, 2 * 4 * 2**20, torch.float32)
    (0.0, True)
    """
    times: dict[str, float] = {}
    group_of = {n: i for i, group in enumerate(groups) for n in group}
    maker = _makers(a)
    handed_out: set[Node] = set()  # members whose value a node outside their group reads
    for n in a.nodes:
        if a.is_compute(n) or n.op == "output":
            for inp in n.all_input_nodes:
                src = maker(inp)
                if src in group_of and group_of.get(n) != group_of[src]:
                    handed_out.add(src)
    fixed = {n: s for n, (s, _) in (fixed_streams(a) if fixed is None else fixed).items()}
    for group in groups:
        if len({fixed[n] for n in group if n in fixed}) > 1:
            continue
        inside = set(group)
        read: dict[Node, int] = {}  # storage root -> the most of it a member reads
        for n in group:
            for inp in n.all_input_nodes:
                if maker(inp) not in inside:
                    root = a.root.get(inp, inp)
                    read[root] = max(read.get(root, 0), covered_bytes(inp))
        # what leaves the kernel: values read outside it, and storage a member writes in place
        written = sum(covered_bytes(n) for n in group if n in handed_out or written_arguments(n))
        flops = sum(model.node_flops(n) for n in group)
        dtype = next((v.dtype for v in (n.meta.get("val") for n in group) if isinstance(v, torch.Tensor)), None)
        for n in group:
            times[n.name] = 0.0
        times[group[-1].name] = model.kernel_time(flops, sum(read.values()) + written, dtype)
    return _with_times(model, times)


def _with_times(model: CostModel, times: dict[str, float]) -> CostModel:
    """A model that prices the nodes named in ``times`` so, unless ``model``'s overrides say."""
    over = model.overrides
    if over is None:
        return CostModel(model.profile, dict(times))
    if callable(over):

        def chained(node: Node, over=over) -> float | None:
            mine = over(node)
            return mine if mine is not None else times.get(node.name)

        chained.__qualname__ = getattr(over, "__qualname__", "overrides")
        return CostModel(model.profile, chained)
    return CostModel(model.profile, {**times, **over})

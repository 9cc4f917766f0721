"""Keep together what inductor will fuse: its scheduler never fuses nodes on different streams
(``Scheduler.can_fuse``: "Prevent fusion across stream boundaries"), so an assignment that splits
a chain of pointwise ops turns one kernel into several, a cost the pre-fusion post-grad graph
does not show. ``assign_streams(..., keep_fusions=True)``, which ``assign="auto"`` inside
``torch.compile`` uses, places each such chain as one unit.

The groups approximate inductor's vertical fusion: a pointwise op joins the group of every
pointwise input it reads (through views), and a reduction joins the group of its pointwise
inputs. Matmuls, convolutions and other extern kernels stay on their own. Horizontal fusion
(siblings reading the same input) is not modelled: splitting siblings costs a launch, not a
round trip through memory.
"""

from __future__ import annotations

import networkx as nx
import torch
import torch.fx

from streampass.analysis.reading import StreamAssignment
from streampass.assign.dag import WorkGraph

Node = torch.fx.Node


def _tagged(node: Node, tag) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and tag in node.target.tags


def fusion_groups(a: StreamAssignment) -> list[list[Node]]:
    """The compute nodes inductor would fuse into one kernel: the connected components (networkx)
    of the fusion edges above with two or more members, each in issue order.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x, w):
    ...     return ((x @ w).relu() * 2).sum() + (x @ w.t()).sigmoid().sum()
    >>> [[n.name for n in g] for g in fusion_groups(sp.read_streams(make_fx(f)(torch.ones(4, 4), torch.ones(4, 4))))]
    [['relu', 'mul', 'sum_1'], ['sigmoid', 'sum_2']]
    """
    pointwise, reduction = torch.Tag.pointwise, torch.Tag.reduction
    g = nx.Graph()
    for n in a.nodes:
        if not a.is_compute(n) or not (_tagged(n, pointwise) or _tagged(n, reduction)):
            continue
        for inp in n.all_input_nodes:
            root = a.root.get(inp, inp)
            src = a.producer.get(root, root)
            if src is not n and a.is_compute(src) and _tagged(src, pointwise):
                g.add_edge(src, n)
    order = a.position or {n: i for i, n in enumerate(a.nodes)}
    groups = [sorted(c, key=order.__getitem__) for c in nx.connected_components(g)]
    return sorted(groups, key=lambda c: order[c[0]])


def keep_together(
    w: WorkGraph, streams: dict[Node, int], groups: list[list[Node]]
) -> tuple[dict[Node, int], dict[Node, str]]:
    """``streams`` with each group on one stream: a fixed member's (when the fixed members agree;
    otherwise the group is left as it is), else the stream of its heaviest member.

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
                notes[n] = f"kept with {head.name} on its stream: inductor fuses them, and never across streams"
    return out, notes

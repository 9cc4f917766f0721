"""A race detector that does not trust streampass's reading of storage: it runs the original
graph node by node on CPU and watches which storages each kernel really reads and writes (a write
is seen as a change of values, shape, strides or storage; a node whose result lives in its
inputs' storage and that changes nothing is a view, and touches nothing). Against the syncs of
``run``'s result (``StreamDAG.happens_before``), every two accesses on different streams to one
storage, one of them a write, must be ordered; so must a side stream's use of an input after the
graph starts, and before it returns.

Only the streams and syncs come from streampass: which storage a node touches is observed.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

import streampass as sp
from streampass.ops import attribute


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _snapshot(t: torch.Tensor):
    return (tuple(t.shape), t.stride(), t.storage_offset(), _storage(t), t.detach().clone())


def _changed(t: torch.Tensor, snap) -> bool:
    if (tuple(t.shape), t.stride(), t.storage_offset(), _storage(t)) != snap[:4]:
        return True
    return not torch.equal(t.detach(), snap[4]) and not (t.is_floating_point() and t.isnan().any())


class _Watcher(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.touched: dict[str, tuple[set, set]] = {}  # node name -> (storages read, written)

    def run_node(self, n: torch.fx.Node):
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if n.op == "call_module":
            module = self.module.get_submodule(n.target)
            tensors += [*module.parameters(), *module.buffers()]
        before = [(t, _snapshot(t)) for t in tensors]
        out = super().run_node(n)
        written = {snap[3] for t, snap in before if _changed(t, snap)}
        read = {_storage(t) for t in tensors} - {None}
        made = {_storage(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
        if not written and made and made <= read:
            read = set()  # a view or alias: metadata only
        self.touched[n.name] = (read, written)
        return out


def unordered_accesses(original: torch.fx.GraphModule, inputs, result: torch.fx.GraphModule) -> list[tuple]:
    """``(kind, a, b)`` for each conflicting pair of accesses ``result``'s syncs leave unordered;
    ``original``: the graph before ``run`` (run on copies of ``inputs``, and changed by it)."""
    watcher = _Watcher(original)
    with torch.no_grad():
        watcher.run(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    dag = sp.StreamDAG.from_graph(result)
    names = {n.name for n in result.graph.nodes}
    order = [n.name for n in original.graph.nodes if n.name in watcher.touched and n.name in names]
    first = next(iter(result.graph.nodes)).name
    output = result.graph.output_node().name
    found = []
    for i, a in enumerate(order):
        read_a, wrote_a = watcher.touched[a]
        side = dag.stream_of(a) != sp.ops.AMBIENT
        if side and (read_a or wrote_a) and not dag.happens_before(first, a):
            found.append(("entry", first, a))
        if side and (read_a or wrote_a) and not dag.happens_before(a, output):
            found.append(("exit", a, output))
        for b in order[i + 1 :]:
            read_b, wrote_b = watcher.touched[b]
            if dag.stream_of(a) == dag.stream_of(b):
                continue
            if (wrote_a & (read_b | wrote_b) or read_a & wrote_b) and not dag.happens_before(a, b):
                found.append(("unordered", a, b))
    return found


def state_after(gm: torch.nn.Module, args) -> list[torch.Tensor]:
    """Call ``gm`` on copies of ``args`` and return what the call leaves, in an order that does
    not depend on the graph's: outputs, inputs (written in place), and every tensor of the module,
    the constants make_fx names with get_attr included, by name."""
    args = [a.clone() for a in args]
    with torch.no_grad():
        out = gm(*args)
    out = out if isinstance(out, (tuple, list)) else [out]
    names = sorted({n.target for n in gm.graph.nodes if n.op == "get_attr"}) if hasattr(gm, "graph") else []
    held = [t for t in (attribute(gm, name) for name in names) if isinstance(t, torch.Tensor)]
    state = [t for _, t in sorted(gm.state_dict().items())]
    return [t.detach().clone() for t in (*out, *args, *state, *held)]

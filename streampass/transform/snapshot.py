"""A cheap snapshot of a GraphModule, so a failed rewrite can put everything back.

``copy.deepcopy(gm.graph)`` copies every node and its metadata: about as slow as the whole
pass on a large graph. The rewrite adds nodes and submodules, re-points existing nodes'
``target``/``args``/``kwargs``, replaces entries of their ``meta``, drops a sync body it left
unused and, last of all, erases fork/join nodes. So it is enough to remember, per node, those
fields (``meta`` as a shallow copy), the node order, the submodules (by reference) and the
generated code; :meth:`Snapshot.restore` erases whatever node was added, brings back erased
ones, puts every field and the order back, drops new submodules, puts removed ones back and
puts the code back as it was (not regenerated: a graph edited and not yet recompiled keeps its
old code). That also undoes a buggy edit made through plain FX calls, which is what the
all-or-nothing guarantee is for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch.fx


@dataclass
class Snapshot:
    """What :func:`take` saved; :meth:`restore` brings ``gm`` back to it."""

    gm: torch.fx.GraphModule
    graph: torch.fx.Graph
    nodes: list[tuple[torch.fx.Node, object, tuple, dict, dict]]
    modules: dict[str, torch.nn.Module | None]
    code: dict[str, object]  # what recompile() sets: the code as it was, even if stale

    def restore(self) -> None:
        gm, graph = self.gm, self.graph
        gm.graph = graph  # in case the graph object itself was replaced
        kept = {node for node, *_ in self.nodes}
        added = [n for n in graph.nodes if n not in kept]
        for node, *_ in self.nodes:
            if node._erased:
                _unerase(graph, node)
        for node, target, args, kwargs, meta in self.nodes:
            if node.target is not target:
                node.target = target
            if node.args is not args:
                node.args = args
            if node.kwargs is not kwargs:
                node.kwargs = kwargs
            node.meta = meta
        # New nodes may use each other in any order: cut their inputs, then erase them.
        for node in added:
            node.args, node.kwargs = (), {}
        for node in added:
            graph.erase_node(node)
        prev = graph._root
        for node, *_ in self.nodes:
            if node.prev is not prev:
                prev.append(node)
            prev = node
        for name in set(gm._modules) - set(self.modules):
            delattr(gm, name)
        for name, module in self.modules.items():  # a submodule the edit removed or replaced
            if gm._modules.get(name) is not module:
                gm._modules[name] = module
        # The code as it was, not regenerated: a graph edited and not yet recompiled keeps
        # running what it ran before (each GraphModule has a class of its own for forward).
        for name, value in self.code.items():
            if name == "forward":
                if value is not _ABSENT:
                    type(gm).forward = value
                elif "forward" in type(gm).__dict__:
                    delattr(type(gm), "forward")
            elif value is _ABSENT:
                gm.__dict__.pop(name, None)
            else:
                gm.__dict__[name] = value


_ABSENT = object()
_CODE = ("_code", "_lineno_map", "_prologue_start", "_in_spec", "_out_spec")


def _unerase(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Undo ``Graph.erase_node`` (torch 2.13 internals; FX has no public way back). The node
    is left unlinked; :meth:`Snapshot.restore` relinks it in place and restores its args."""
    node._erased = False
    node._prev = node._next = node  # its old neighbours' links are stale
    graph._len += 1
    graph._find_nodes_lookup_table.insert(node)


def take(gm: torch.fx.GraphModule) -> Snapshot:
    """Remember what a rewrite of ``gm`` may change.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: x + 1)
    >>> code, snap = gm.code, take(gm)
    >>> add = next(n for n in gm.graph.nodes if n.op == "call_function")
    >>> with gm.graph.inserting_after(add):
    ...     extra = gm.graph.call_function(torch.neg, (add,))
    >>> _ = add.replace_all_uses_with(extra, lambda user: user is not extra)
    >>> _ = gm.recompile()
    >>> snap.restore()
    >>> gm.code == code
    True
    """
    graph = gm.graph
    code = {name: gm.__dict__.get(name, _ABSENT) for name in _CODE}
    code["forward"] = type(gm).__dict__.get("forward", _ABSENT)
    return Snapshot(
        gm,
        graph,
        [(n, n.target, n.args, n.kwargs, dict(n.meta)) for n in graph.nodes],
        dict(gm._modules),
        code,
    )


@contextlib.contextmanager
def all_or_nothing(gm: torch.fx.GraphModule) -> Iterator[Snapshot]:
    """Run the block's edits of ``gm`` whole, or not at all: on any exception the graph, its
    submodules and its generated code are put back as they were, and the exception goes on.

    >>> import torch, operator
    >>> g = torch.fx.Graph(); x = g.placeholder("x"); _ = g.output(x)
    >>> gm = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> try:
    ...     with all_or_nothing(gm):
    ...         with gm.graph.inserting_before(x.next):
    ...             _ = gm.graph.call_function(operator.neg, (x,))
    ...         raise ValueError("a check failed")
    ... except ValueError:
    ...     pass
    >>> [n.op for n in gm.graph.nodes]
    ['placeholder', 'output']
    >>> gm.add_submodule("body", torch.nn.Identity())
    True
    >>> try:
    ...     with all_or_nothing(gm):
    ...         delattr(gm, "body")  # an edit that drops a subgraph it left unused
    ...         raise ValueError("a check failed")
    ... except ValueError:
    ...     pass
    >>> isinstance(gm.body, torch.nn.Identity)
    True
    """
    saved = take(gm)
    try:
        yield saved
    except BaseException:
        saved.restore()
        raise

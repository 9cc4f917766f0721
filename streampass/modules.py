"""What a ``call_module`` uses without taking it as an argument: its module's parameters and
buffers (``symbolic_trace`` keeps ``self.lin(x)`` as one call), and the storage roots the reading
gives them (docs/design.md, "call_module")."""

from __future__ import annotations

import torch
import torch.fx

from streampass import ops, values
from streampass.values import graph_module_writes


def module_state(node: torch.fx.Node) -> list[tuple[str, torch.Tensor, bool]]:
    """The tensors a ``call_module`` uses without taking them as arguments (``symbolic_trace``
    keeps ``self.lin(x)`` as one call): ``(qualified name, tensor, whether the call writes it)``.
    A module's parameters are read (an embedding with a ``max_norm`` writes its weight) and its
    buffers written while it trains (batch norm's running statistics), read otherwise; a module
    not from ``torch.nn`` (a custom tracer's leaf) writes its buffers evaluating too. A ``GraphModule`` (``split_module``'s parts) says what it does:
    the tensors its ``get_attr`` nodes name, written where one of its nodes writes them in place,
    and those of the modules its own ``call_module`` nodes call.

    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    >>> lin, bn = gm.graph.find_nodes(op="call_module")
    >>> [(k, w) for k, _, w in module_state(lin)]
    [('0.weight', False), ('0.bias', False)]
    >>> [(k, w) for k, _, w in module_state(bn)][2:4]
    [('1.running_mean', True), ('1.running_var', True)]
    >>> _ = gm.eval(); [w for _, _, w in module_state(bn)][2:4]  # evaluating: only read
    [False, False]
    """
    module = values.called_module(node)
    if module is None:
        return []
    if isinstance(module, torch.fx.GraphModule):
        return [(f"{node.target}.{k}", t, w) for k, t, w in _graph_module_state(module)]
    out = [(f"{node.target}.{k}", p, _renormed(module, k)) for k, p in module.named_parameters()]
    for k, b in module.named_buffers():
        owner = module.get_submodule(k.rpartition(".")[0])
        out.append((f"{node.target}.{k}", b, owner.training or not _from_torch(owner)))
    return out


def _renormed(module: torch.nn.Module, name: str) -> bool:
    """Whether calling ``module`` writes its parameter ``name``: an embedding with a ``max_norm``
    renormalizes the rows it looks up in its weight, evaluating too."""
    owner = module.get_submodule(name.rpartition(".")[0])
    embeds = isinstance(owner, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and owner.max_norm is not None
    return embeds and name.rpartition(".")[2] == "weight"


def _from_torch(module: torch.nn.Module) -> bool:
    """Whether ``module`` is one of torch's own (``torch.nn``, ``torch.ao.nn``), known to write
    its buffers only while training (batch norm's running statistics). A module of anyone
    else's that a tracer keeps whole may write them evaluating too (a KV cache, a counter)."""
    return type(module).__module__.startswith(("torch.nn.", "torch.ao.nn."))


def _graph_module_state(module: torch.fx.GraphModule) -> list[tuple[str, torch.Tensor, bool]]:
    """:func:`module_state` of a call of ``module``, read from its graph."""
    written, _ = graph_module_writes(module)
    out = [s for n in module.graph.find_nodes(op="call_module") for s in module_state(n)]
    for n in module.graph.find_nodes(op="get_attr"):
        held = ops.attribute(module, n.target)
        if isinstance(held, torch.Tensor):
            out.append((n.target, held, n in written))
    return out


def attribute_roots(nodes: list[torch.fx.Node], owner) -> tuple[dict[tuple, torch.fx.Node], dict]:
    """``(storage -> the first get_attr before the output that names it, get_attr -> that root)``
    (storage: ``values.attribute_storage``), known before the walk, so a ``call_module`` earlier
    in the graph finds it too. A get_attr of an attribute ``owner`` lacks has no root."""
    by_storage: dict[tuple, torch.fx.Node] = {}
    by_node: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in nodes:
        if node.op == "output":
            break
        if node.op == "get_attr":
            held = ops.attribute(owner, node.target) if owner is not None else None
            if held is not ops.MISSING:
                by_node[node] = by_storage.setdefault(values.attribute_storage(node.target, held), node)
    return by_storage, by_node


def module_state_roots(node: torch.fx.Node, attributes: dict[tuple, torch.fx.Node]):
    """(roots read, roots written) of the tensors ``node`` (a ``call_module``) uses unseen; a
    tensor no ``get_attr`` names gets a root of its own, shared by every call that uses it."""
    reads: dict[torch.fx.Node, None] = {}
    writes: dict[torch.fx.Node, None] = {}
    for name, tensor, written in module_state(node):
        key = values.attribute_storage(name, tensor)
        root = attributes.get(key)
        if root is None:
            root = attributes[key] = torch.fx.Graph().get_attr(name)
        (writes if written else reads)[root] = None
    return tuple(r for r in reads if r not in writes), tuple(writes)

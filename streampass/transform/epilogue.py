"""Functionalization's epilogue copies (``aten.copy_`` into a graph input: a buffer updated in
place) kept writing the input itself after torch threads the input through a sync."""

from __future__ import annotations

import torch

from streampass import ops


def _input_behind(node: object) -> torch.fx.Node | None:
    """The graph input a chain of ``control_deps`` passthroughs ends at, or None."""
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            return node
        node = ops.passthrough_source(node)
    return None


def copy_back_into_inputs(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """Point each ``aten.copy_`` whose destination is a passthrough of a graph input back at the
    input; return the copies changed.

    torch's ``wrap_all_sync_nodes_with_control_deps`` threads an input read after a wait through
    the wait's ``control_deps``, so that the read is ordered after it, and re-points every later
    use, the epilogue copy included; AOT autograd then refuses the graph, which must copy into
    the input ("n=copy_, n.args[0]=getitem_3"). torch 2.14 keeps the destination for a
    ``wait_event``'s inputs only; this does it for every sync. The copy's source, computed from
    the passthrough, still orders it after the wait; one that is not (zeros: ``buf.zero_()``) is
    ordered by StreamPass (``transform/user_waits.py``).

    >>> import operator
    >>> from streampass.transform.subgraphs import sync_subgraph
    >>> gm = torch.nn.Module(); g = torch.fx.Graph()
    >>> buf = g.placeholder("buf")
    >>> gm.sync = sync_subgraph(gm, ops.WAIT_STREAM, 2, 1)  # wait_stream(0, 1), passing buf
    >>> wait = g.call_function(ops.CONTROL_DEPS, ((buf,), g.get_attr("sync"), 0, 1, buf))
    >>> passed = g.call_function(operator.getitem, (wait, 1))
    >>> new = g.call_function(torch.ops.aten.add.Tensor, (passed, 1))
    >>> copy = g.call_function(torch.ops.aten.copy_.default, (passed, new))
    >>> _ = g.output(None)
    >>> gm = torch.fx.GraphModule(gm, g)
    >>> [n.name for n in copy_back_into_inputs(gm.graph)], copy.args[0].name
    (['copy__default'], 'buf')
    """
    changed = []
    for copy in graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default):
        dest = copy.args[0]
        into = _input_behind(dest)
        if into is not None and into is not dest:
            copy.args = (into, *copy.args[1:])
            changed.append(copy)
    return changed

"""Work that a post-grad pass before StreamPass wrapped in ``control_deps`` to fix its order
(torch's ``preserve_node_ordering``, as the passes of torch's own
``test/inductor/test_control_deps.py`` do): taken out of its wrapper while StreamPass reads and
plans the graph, and wrapped again, with the same dependencies, after.

Inside its wrapper the work's reads and writes are out of the plan's sight (the op is in a
subgraph), so a graph with streams used to refuse it. Unwrapped, it is an op like any other:
its stream is the wrapper's annotation (``preserve_node_ordering`` copies the node's meta), and
the plan covers its data. Its dependencies order launches, as they did before; they add no
stream ordering, which the plan's syncs give where data needs it.

Only the wrappers ``preserve_node_ordering`` makes are taken out: one op, called with the
wrapper's arguments, its result returned. Any other wrapper around work is left as it is, and
:func:`streampass.read_streams` refuses it, naming it, where the graph uses streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx
from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
from torch.utils._ordered_set import OrderedSet

from streampass import ops
from streampass.analysis import wellformed
from streampass.transform.inductor_order import sort_as_inductor_will

Node = torch.fx.Node


@contextlib.contextmanager
def as_plain_ops(gm: torch.fx.GraphModule) -> Iterator[dict[Node, tuple[Node, ...]]]:
    """Sort ``gm`` as inductor will, take out the work wrapped in ``control_deps`` for the
    block, then wrap it again with its dependencies and sort again. Yields what it took out
    (the plain op -> its dependencies). On an exception the graph stays as the block left it:
    the caller's ``snapshot.all_or_nothing`` puts it back.

    >>> import torch
    >>> from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    >>> from torch.utils._ordered_set import OrderedSet
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> a = g.call_function(torch.ops.aten.sin.default, (x,), name="sin")
    >>> b = g.call_function(torch.ops.aten.cos.default, (x,), name="cos")
    >>> _ = g.output(g.call_function(torch.ops.aten.add.Tensor, (a, b), name="add"))
    >>> gm = torch.fx.GraphModule(torch.nn.Module(), g)
    >>> preserve_node_ordering(g, {a: OrderedSet([b])})
    >>> with as_plain_ops(gm) as taken:
    ...     [(n.name, n.target.__name__, [d.name for d in deps]) for n, deps in taken.items()]
    [('sin', 'sin.default', ['cos'])]
    >>> [n.name for n in g.nodes if n.target is ops.CONTROL_DEPS]  # wrapped again, after cos
    ['sin']
    >>> [n.name for n in g.nodes if n.op == "call_function"]
    ['cos', 'sin', 'add']
    """
    sort_as_inductor_will(gm.graph)
    taken = unwrap(gm)
    yield taken
    rewrap(gm, taken)


def unwrap(gm: torch.fx.GraphModule) -> dict[Node, tuple[Node, ...]]:
    """Replace each ``control_deps`` that ``preserve_node_ordering`` made around work with the
    plain op, under the wrapper's name and meta; return plain op -> its dependencies."""
    taken: dict[Node, tuple[Node, ...]] = {}
    for wrapper in list(gm.graph.find_nodes(op="call_function", target=ops.CONTROL_DEPS)):
        op = _wrapped_op(wrapper)
        if op is None:
            continue
        inner = dict(zip((p for p in op.graph.nodes if p.op == "placeholder"), wrapper.args[2:]))
        with gm.graph.inserting_before(wrapper):
            plain = gm.graph.call_function(
                op.target, torch.fx.map_arg(op.args, inner.get), torch.fx.map_arg(op.kwargs, inner.get)
            )
        plain.meta = {**op.meta, **wrapper.meta}
        deps, subgraph, name = tuple(wrapper.args[0]), wrapper.args[1], wrapper.name
        wrapper.replace_all_uses_with(plain)
        gm.graph.erase_node(wrapper)
        plain.name = name
        if not subgraph.users and "." not in subgraph.target:
            gm.graph.erase_node(subgraph)
            delattr(gm, subgraph.target)
        taken[plain] = deps
    return taken


def rewrap(gm: torch.fx.GraphModule, taken: dict[Node, tuple[Node, ...]]) -> None:
    """Wrap each op :func:`unwrap` took out in ``control_deps`` again, with its dependencies
    (torch's ``preserve_node_ordering``), and sort the graph as inductor will. An op the GPU
    lowering has wrapped meanwhile (a first reader after a wait, ``inductor_order``) keeps that
    wrapper, which takes the dependencies too; ``preserve_node_ordering`` keeps names, and
    nodes are found again by theirs. A dependency the pass removed (a ``fork`` or ``join``,
    which it reads into the stream assignment) is dropped: nothing of it is left to order."""
    if not taken:
        return
    named = {n.name: n for n in gm.graph.nodes}

    def now(n: Node) -> Node | None:
        return named.get(n.name) if n._erased else n

    fresh: dict[Node, OrderedSet[Node]] = {}
    for op, deps in taken.items():
        node, deps = now(op), OrderedSet(d for d in map(now, deps) if d is not None)
        if node is None or not deps:
            continue
        if node.target is ops.CONTROL_DEPS:  # wrapped by the lowering
            node.args = (tuple(OrderedSet(node.args[0]) | deps), *node.args[1:])
        else:
            fresh[node] = deps
    preserve_node_ordering(gm.graph, fresh)
    sort_as_inductor_will(gm.graph)


def _wrapped_op(wrapper: Node) -> Node | None:
    """The one op a well-formed ``control_deps`` around work calls with its arguments and
    returns, as ``preserve_node_ordering`` makes it; None for any other wrapper."""
    if wellformed.control_deps_problem(wrapper) is not None or wellformed.control_deps_work(wrapper) is None:
        return None
    nodes = list(ops.subgraph_module(wrapper).graph.nodes)
    places = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op not in ("placeholder", "output")]
    out = nodes[-1]
    simple = (
        not wrapper.kwargs
        and len(calls) == 1
        and calls[0].op == "call_function"
        and len(places) == len(wrapper.args) - 2
        and out.op == "output"
        and out.args[0] is calls[0]
        and all(isinstance(d, Node) for d in wrapper.args[0])
        and all(isinstance(a, Node) for a in wrapper.args[2:])
    )
    return calls[0] if simple else None

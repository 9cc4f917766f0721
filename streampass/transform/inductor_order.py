"""The readers of a wait's passthrough outputs, ordered after the wait for inductor's scheduler.

streampass keeps a read after a wait by reading the value through the wait
(``getitem(control_deps(...), i)``), and FX orders it. inductor lowers that getitem to the
very buffer the wait was given, so before torch 2.14 (which puts an ``OrderingBarrier`` on each
passthrough; torch 2.13 only for ``wait_stream``) its scheduler saw no edge from the wait to the
reader, and fused the reader into a kernel issued before the wait: on a GPU, a read of another
stream's result before waiting for it. Found on CPU by compiling with the GPU lowering; plain
torch 2.13 does the same with a user's ``e.wait()``.

:func:`order_readers_after_waits` wraps each first reader in ``control_deps`` with the wait as
its dependency (torch's own :func:`~torch._inductor.fx_passes.control_dependencies.preserve_node_ordering`),
which inductor turns into a scheduler edge from 2.13 on. A reader so wrapped is a buffer of its
own (it is not inlined into a later kernel), which is what holds every later use after the wait
too. torch 2.12's lowering keeps no edge to a sync at all (it has no output), so no graph edit can
order a kernel after one there: ``one_stream.one_stream`` issues the graph's kernels on one stream instead.

:func:`sort_as_inductor_will` sorts a graph an earlier custom pass left out of order, as inductor
does right after those passes, before StreamPass reads it.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
from torch._inductor.pattern_matcher import stable_topological_sort

from streampass import ops, values

Node = torch.fx.Node

#: the syncs later work is held behind: waits, and the host barriers
WAITS = frozenset({ops.WAIT_EVENT, ops.WAIT_STREAM, ops.SYNC_EVENT, ops.SYNC_STREAM, ops.SYNC_DEVICE})


def sort_as_inductor_will(graph: torch.fx.Graph) -> bool:
    """Sort ``graph`` as inductor does right after its custom post-grad passes (torch's
    ``stable_topological_sort``) if a node comes before one of its inputs, and say whether it did.
    A user's pass listed before StreamPass can leave the graph so: torch's
    ``preserve_node_ordering`` puts the ``control_deps`` where the wrapped node was, which may be
    before its new dependency (as torch's own ``test/inductor/test_control_deps.py`` passes do).

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> late = g.call_function(torch.ops.aten.sin.default, (x,), name="sin"); _ = g.output(late)
    >>> with g.inserting_before(late):
    ...     early = g.call_function(torch.ops.aten.cos.default, (late,), name="cos")
    >>> sort_as_inductor_will(g), [n.name for n in g.nodes], sort_as_inductor_will(g)
    (True, ['x', 'sin', 'cos', 'output'], False)
    """
    seen: set[Node] = set()
    for node in graph.nodes:
        if any(i not in seen for i in ops.input_nodes(node)):
            stable_topological_sort(graph)
            return True
        seen.add(node)
    return False


def first_readers(graph: torch.fx.Graph) -> dict[Node, list[Node]]:
    """reader -> the waits it reads a passthrough of: the aten ops that read a wait's passthrough
    output directly or through views (which launch nothing).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y.t().cos()
    >>> gm = make_fx(f)(torch.ones(2, 2)); _ = sp.run(gm)
    >>> {r.name: [w.name for w in ws] for r, ws in first_readers(gm.graph).items()}
    {'sin': ['wait_event_default'], 'cos': ['wait_event_default_1']}
    """
    out: dict[Node, list[Node]] = {}
    for wait in graph.find_nodes(op="call_function", target=ops.CONTROL_DEPS):
        call = ops.as_sync_call(wait)
        if call is None or call.target not in WAITS:
            continue
        todo = [g for g in wait.users if g.target is operator.getitem and g.args[1] != 0]
        while todo:
            value = todo.pop()
            for user in value.users:
                if user.op != "call_function" or user.target is ops.CONTROL_DEPS:
                    continue
                if values.aliases_input(user) is value:
                    todo.append(user)  # a view: its readers read the same memory
                elif isinstance(user.target, torch._ops.OpOverload) and wait not in out.get(user, ()):
                    out.setdefault(user, []).append(wait)
    return out


def order_readers_after_waits(gm: torch.fx.GraphModule) -> None:
    """Make each of :func:`first_readers` a ``control_deps`` that depends on its waits."""
    preserve_node_ordering(gm.graph, first_readers(gm.graph))

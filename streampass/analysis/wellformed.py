"""What makes a stream op or a ``control_deps`` node unreadable: arguments that do not fit the
op's schema, a malformed wrapper, a wrapper around work. :func:`streampass.read_streams` refuses
such nodes by name instead of reading them wrongly or failing when the graph runs."""

from __future__ import annotations

import torch.fx

from streampass import ops


def argument_problem(call: ops.SyncCall) -> str | None:
    """What is wrong with a stream op's arguments against its schema (count, names, kinds), or
    None. The stream and event indices themselves are checked by ``check_stream_index``.

    >>> g = torch.fx.Graph()
    >>> argument_problem(ops.as_sync_call(g.call_function(ops.RECORD_EVENT, (5,))))
    "misses argument 'stream_index': streams::record_event(SymInt event_index, SymInt stream_index) -> ()"
    >>> argument_problem(ops.as_sync_call(g.call_function(ops.RECORD_EVENT, (5, 1)))) is None
    True
    """
    schema = call.target._schema
    op = call.node if call.wrapper is None else _stream_op(ops.subgraph_module(call.wrapper))
    names = [a.name for a in schema.arguments]
    unknown = [k for k in op.kwargs if k not in names]
    if unknown:
        return f"has no argument {unknown[0]!r}: {schema}"
    given = len(op.args) + len(op.kwargs)
    if given > len(names) or any(k in names[: len(op.args)] for k in op.kwargs):
        return f"takes {len(names)} arguments, got {given}: {schema}"
    if len(call.args) < len(names):
        return f"misses argument {names[len(call.args)]!r}: {schema}"
    for a, v in zip(schema.arguments, call.args):
        kind = str(a.type)
        if kind == "Tensor" and not isinstance(v, torch.fx.Node):
            return f"argument {a.name!r} must be a tensor, got {v!r}: {schema}"
        if kind == "str" and not isinstance(v, str):
            return f"argument {a.name!r} must be a str, got {v!r}: {schema}"
        if kind in ("SymInt", "int") and (isinstance(v, bool) or not isinstance(v, int)):
            return f"argument {a.name!r} must be an int, got {v!r}: {schema}"
    return None


RUNTIME_INDEX = (
    "a stream op with an index known only at run time (dynamo compiled a sync body of a graph "
    "streampass.run rewrote on its own): left as it is. Compile the function, not run's result "
    "(docs/inductor.md, Known limits)"
)


def runtime_index(graph: torch.fx.Graph) -> torch.fx.Node | None:
    """The first stream op whose stream or event index is a value of the graph, not a constant,
    or None. dynamo makes such graphs when it compiles a graph :func:`streampass.run` rewrote: it
    cannot trace ``control_deps``, compiles each shared sync body on its own, and makes the
    index, an argument that changes between calls, a graph input. What the op names is then
    known only when it runs.

    >>> g = torch.fx.Graph(); index = g.placeholder("index_0")
    >>> runtime_index(g) is None
    True
    >>> record = g.call_function(ops.RECORD_EVENT, (index, 0))
    >>> runtime_index(g) is record
    True
    """
    for node in graph.nodes:
        call = ops.as_sync_call(node) if node.op == "call_function" else None
        if call is not None and any(
            isinstance(v, torch.fx.Node) and str(a.type) in ("SymInt", "int")
            for a, v in zip(call.target._schema.arguments, call.args)
        ):
            return node
    return None


def _stream_op(sub: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in sub.graph.nodes if n.op == "call_function" and id(n.target) in ops.STREAM_OP_IDS)


def control_deps_problem(node: torch.fx.Node) -> str | None:
    """What makes a ``control_deps`` node malformed (its arguments, its subgraph), or None.

    >>> g = torch.fx.Graph()
    >>> control_deps_problem(g.call_function(ops.CONTROL_DEPS, ()))
    'control_deps takes (dependencies, subgraph, *arguments), got 0 arguments'
    """
    args = node.args
    if len(args) < 2:
        return f"control_deps takes (dependencies, subgraph, *arguments), got {len(args)} arguments"
    if not isinstance(args[0], (tuple, list)):
        return f"control_deps' dependencies must be a tuple, got {args[0]!r}"
    sub = ops.subgraph_module(node)
    if sub is None:
        return f"control_deps' subgraph {args[1]!r} is not a GraphModule of the graph's module"
    if not any(n.op == "output" for n in sub.graph.nodes):
        return "control_deps' subgraph has no output node"
    return None


def control_deps_work(node: torch.fx.Node) -> str | None:
    """Why streampass cannot plan around a well-formed ``control_deps`` node whose body runs
    work besides one stream op, or None. torch's ``preserve_node_ordering`` wraps such work
    (collectives, a user's post-grad pass, random ops under ``fallback_random``): its reads
    and writes would go unseen, so a graph with streams refuses it; a graph on the ambient
    stream alone has nothing to plan and keeps it as it is (``read_streams``).
    """
    calls = [n for n in ops.subgraph_module(node).graph.nodes if n.op.startswith("call_")]
    stream_ops = [n for n in calls if n.op == "call_function" and id(n.target) in ops.STREAM_OP_IDS]
    work = [str(n.target) for n in calls if n not in stream_ops[:1]]
    if not work:
        return None
    return (
        f"control_deps runs {', '.join(work)}: streampass reads one stream op wrapped in control_deps, "
        "not other work (run it before the pass that wraps them, e.g. preserve_node_ordering)"
    )

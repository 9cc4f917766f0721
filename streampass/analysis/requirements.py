"""What must happen before what: the ordering requirements that make a multi-stream graph race-free.

Pure analysis over a :class:`~streampass.analysis.reading.StreamAssignment`. Each
:class:`Requirement` says "``before`` must complete before ``after`` starts"; a requirement
between nodes of different streams is a hazard unless happens-before holds. Kinds
(DESIGN.md §2): ``raw``, ``war``, ``waw``, ``entry``, ``exit``; ``dealloc`` is about memory
lifetime and is a :class:`CrossStreamValue` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx

from streampass import ops, values
from streampass.analysis.reading import StreamAssignment
from streampass.ops import AMBIENT

Node = torch.fx.Node


@dataclass(frozen=True)
class Requirement:
    """``before`` must complete on the device before ``after`` starts.

    ``value`` is the tensor (its storage root) the two nodes share; ``kind`` says why. For a
    side stream that must be joined at exit, ``value`` is None and ``before`` is its last node.
    """

    kind: str
    before: Node
    after: Node
    value: Node | None = None


@dataclass
class CrossStreamValue:
    """A tensor made on one stream and used (read, or written in place) on others: its memory must
    not be reused early."""

    value: Node
    stream: int
    readers: dict[int, list[Node]] = field(default_factory=dict)  # stream -> its users, in issue order


def is_tensor_value(node: Node, known: dict[Node, bool] | None = None) -> bool:
    """Whether ``node`` produces a tensor (or tensors), judged by its metadata; with none (a
    graph loaded from a pickle, a ``symbolic_trace`` graph), a size query is not one, Python
    arithmetic is one where an input is (``a.shape[0] * 2`` is a SymInt), anything else is
    assumed to be. ``known`` caches verdicts across calls.

    >>> import torch, operator
    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> n = g.call_function(operator.mul, (g.call_function(torch.ops.aten.sym_size.int, (x, 0)), 2))
    >>> is_tensor_value(n), is_tensor_value(g.call_function(operator.mul, (x, 2)))
    (False, True)
    """
    known = {} if known is None else known
    stack = [node]
    while stack:  # inputs first, without recursion: a symbolic_trace graph's chain of ``+`` is deep
        n = stack[-1]
        if n in known:
            stack.pop()
            continue
        verdict = _own_verdict(n)
        if verdict is None:
            pending = [i for i in n.all_input_nodes if i not in known]
            if pending:
                stack.extend(pending)
                continue
            verdict = any(known[i] for i in n.all_input_nodes)
        known[n] = verdict
        stack.pop()
    return known[node]


# Calls that answer a question about a tensor's shape rather than make one: aten's (make_fx
# records ``x.shape[0]`` so) and, with no schema, as symbolic_trace records them.
_SIZE_QUERIES = frozenset(
    {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
     torch.ops.aten.sym_storage_offset.default}
)  # fmt: skip
_SIZE_METHODS = frozenset({"size", "dim", "numel", "stride", "storage_offset", "nelement", "ndimension"})
_SIZE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "layout", "is_cuda", "requires_grad"})
# Arithmetic on sizes: a SymInt where its inputs are sizes, a tensor where one is a tensor.
_SYM_FUNCTIONS = frozenset(
    getattr(torch, f) for f in ("sym_max", "sym_min", "sym_int", "sym_float", "sym_not", "sym_ite", "sym_sum")
    if hasattr(torch, f)
)  # fmt: skip


def _own_verdict(node: Node) -> bool | None:
    """:func:`is_tensor_value` of ``node`` from itself alone, or None where its inputs decide
    (Python arithmetic on a node with no metadata)."""
    val = node.meta.get("val", node.meta.get("example_value"))
    if val is not None:
        if isinstance(val, (list, tuple)):
            return any(isinstance(v, torch.Tensor) for v in val)
        return isinstance(val, torch.Tensor)
    if node.op == "get_attr" and node.graph.owning_module is not None:
        held = ops.attribute(node.graph.owning_module, node.target)  # a cond's branch is no tensor
        return held is ops.MISSING or isinstance(held, torch.Tensor)
    if node.target in _SIZE_QUERIES or (node.op == "call_method" and node.target in _SIZE_METHODS):
        return False
    if node.target is getattr and len(node.args) > 1 and node.args[1] in _SIZE_ATTRIBUTES:  # ``x.shape``
        return False
    if node.op == "call_function" and (
        node.target in _SYM_FUNCTIONS or getattr(node.target, "__module__", None) in ("_operator", "math")
    ):
        return None
    return node.op != "output"  # unknown: assume a tensor (conservative)


def _read_roots(node: Node, root: dict[Node, Node], tensor: dict[Node, bool]) -> list[Node]:
    """The tensor values ``node`` reads on the device: storage roots, deduplicated, in argument
    order (a ``control_deps`` node's own result is not a value). ``tensor`` caches is_tensor_value."""
    out: list[Node] = []
    for inp in ops.input_nodes(node):
        if inp.target is not ops.CONTROL_DEPS and is_tensor_value(inp, tensor):
            r = root[inp]
            if r not in out:
                out.append(r)
    return out


def writes_of(a: StreamAssignment, node: Node) -> list[Node]:
    """Storage roots ``node`` overwrites in place (from its schema).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: x.t().add_(1))(torch.ones(2, 2))
    >>> a = sp.read_streams(gm)
    >>> [(n.name, [r.name for r in writes_of(a, n)]) for n in a.nodes if writes_of(a, n)]
    [('add_', ['x_1'])]
    """
    if not a.is_compute(node):
        return []
    out = []
    for x in values.written_arguments(node):
        if a.root[x] not in out:
            out.append(a.root[x])
    return out


Accesses = dict[Node, tuple[list[Node], list[Node]]]


def accesses(a: StreamAssignment) -> Accesses:
    """compute node or output -> (the storage roots it reads, those it writes in place): what
    :func:`requirements` derives its orderings from. It depends on the nodes and their
    arguments, not on their streams, so a caller that tries many streams for one graph
    (``streampass.assign``) computes it once.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> a = sp.read_streams(make_fx(lambda x: x.sin().add_(x))(torch.ones(2)))
    >>> {n.name: ([r.name for r in reads], [w.name for w in writes]) for n, (reads, writes) in accesses(a).items()}
    {'sin': (['x_1'], []), 'add_': (['sin', 'x_1'], ['sin']), 'output': (['sin'], [])}
    """
    root, compute, hidden = a.root, a.compute, a.hidden
    tensor: dict[Node, bool] = {}  # is_tensor_value, once per node
    table = {
        n: (_read_roots(n, root, tensor), writes_of(a, n) if n in compute else [])
        for n in a.nodes
        if n in compute or n.op == "output"
    }
    for n, (reads, writes) in hidden.items():  # a submodule's parameters and buffers
        if n in table:
            mine = table[n]
            mine[1].extend(w for w in writes if w not in mine[1])
            mine[0].extend(r for r in reads if r not in mine[0] and r not in mine[1])
    return table


def requirements(
    a: StreamAssignment, same_stream: bool = False, table: Accesses | None = None
) -> tuple[list[Requirement], list[CrossStreamValue]]:
    """Every cross-stream ordering the graph needs, and every value read across streams.

    Only pairs on different streams are returned (a stream runs its own work in order), unless
    ``same_stream``: then every ordering the program has, which is what the simulator schedules.
    ``table``: the graph's :func:`accesses`, if the caller has them (they do not depend on streams).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> reqs, values = requirements(sp.read_streams(gm))
    >>> sorted((r.kind, r.before.name, r.after.name) for r in reqs)
    [('entry', 'x_1', 'sin'), ('exit', 'sin', 'output'), ('raw', 'sin', 'add')]
    >>> [(v.value.name, v.stream, sorted(v.readers)) for v in values]
    [('sin', 1, [0])]
    """
    reqs: list[Requirement] = []
    # Only storages something writes ever get a writer other than their maker; everything
    # else is "written" by the node that made it (or is an input), hence get(r, r).
    last_writer: dict[Node, Node] = {}
    cross: dict[Node, CrossStreamValue] = {}
    s_of, root, compute = a.stream, a.root, a.compute
    made_by = a.producer  # a storage no node writes was written by the kernel that made it
    table = accesses(a) if table is None else table
    # What stands for the inputs at entry, for a submodule's tensor no node of the graph names
    entry = next((n for n in a.nodes if n.op == "placeholder"), None) or next(
        (n for n in a.nodes if n.op == "get_attr"), None
    )
    # A functional graph writes nothing: only track reads for the storages some node writes.
    reads_since_write: dict[Node, list[Node]] = {r: [] for _, ws in table.values() for r in ws}

    for node in a.nodes:
        if node not in compute:
            if node.op == "output":
                s = s_of[node]
                for r in table[node][0]:
                    w = last_writer.get(r) or made_by.get(r, r)
                    if same_stream or s_of[w] != s:
                        reqs.append(Requirement("exit", w, node, r))
                reqs += exit_joins(a, node)
            continue
        s = s_of[node]
        reads, mine = table[node]
        for r in reads:
            if r in mine:
                continue
            w = last_writer.get(r) or made_by.get(r, r)
            if w.graph is not a.graph:  # a submodule's tensor no node names: an input
                w = entry
            if w is not None and (same_stream or s_of[w] != s):
                reqs.append(Requirement("entry" if w.op in ("placeholder", "get_attr") else "raw", w, node, r))
            if r in reads_since_write:
                reads_since_write[r].append(node)
        for r in _uses(reads, mine):  # a write is a use too: the memory must outlive it
            if r.op in ops.CALL_OPS and s_of[r] != s:
                cv = cross.get(r)
                if cv is None:
                    cv = cross[r] = CrossStreamValue(r, s_of[r])
                cv.readers.setdefault(s, []).append(node)
        for r in mine:
            w = last_writer.get(r) or made_by.get(r, r)
            if w.graph is not a.graph:
                w = entry
            if w is not None and (same_stream or s_of[w] != s):
                reqs.append(Requirement("entry" if w.op in ("placeholder", "get_attr") else "waw", w, node, r))
            for reader in reads_since_write[r]:
                if same_stream or s_of[reader] != s:
                    reqs.append(Requirement("war", reader, node, r))
            reads_since_write[r] = []
            last_writer[r] = node

    outputs = {root[x] for n in a.nodes if n.op == "output" for x in ops.input_nodes(n)}
    values = [c for v, c in cross.items() if v not in outputs]
    return reqs, values


class Orderings:
    """Every ordering of one graph, whatever its streams: :func:`requirements` of any stream
    assignment of it, by filtering.

    Which nodes must precede which does not depend on streams; only which of those pairs cross
    streams does, and where each side stream ends. A search that tries many assignments of
    one graph (``streampass.assign``) builds this once and asks :meth:`for_streams` per
    candidate, for exactly what ``requirements(a)`` returns, in the same order.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> import dataclasses
    >>> a = sp.read_streams(make_fx(lambda x: x.sin() + x.cos())(torch.ones(4)))
    >>> moved = dataclasses.replace(a, stream={**a.stream, a.node_named("sin"): 1})
    >>> Orderings(a).for_streams(moved) == requirements(moved)
    True
    """

    def __init__(self, a: StreamAssignment, table: Accesses | None = None):
        table = accesses(a) if table is None else table
        reqs, _ = requirements(a, same_stream=True, table=table)
        self.all = [r for r in reqs if not (r.kind == "exit" and r.value is None)]  # exit joins: per streams
        self.reads = [  # (user, value) for every use of a value some kernel made, in order
            (n, r) for n in a.nodes if n in a.compute for r in _uses(*table[n]) if r.op in ops.CALL_OPS
        ]
        self.outputs = {a.root[x] for n in a.nodes if n.op == "output" for x in ops.input_nodes(n)}
        self.output = next((n for n in a.nodes if n.op == "output"), None)
        self.enqueued = _enqueued_before(a, self.output)  # what exit_joins looks at

    def for_streams(self, a: StreamAssignment) -> tuple[list[Requirement], list[CrossStreamValue]]:
        """``requirements(a)`` for ``a``, a reading of this graph with any streams."""
        s_of = a.stream
        reqs = [r for r in self.all if s_of[r.before] != s_of[r.after]]
        if self.output is not None:
            reqs += _joins(s_of, self.enqueued, self.output)
        cross: dict[Node, CrossStreamValue] = {}
        for n, r in self.reads:
            s, made = s_of[n], s_of[r]
            if made != s:
                cv = cross.get(r)
                if cv is None:
                    cv = cross[r] = CrossStreamValue(r, made)
                cv.readers.setdefault(s, []).append(n)
        return reqs, [c for v, c in cross.items() if v not in self.outputs]


def _uses(reads: list[Node], writes: list[Node]) -> list[Node]:
    """The storages a node uses, each once: those it only reads, then those it writes."""
    return [r for r in reads if r not in writes] + writes


def exit_joins(a: StreamAssignment, output: Node) -> list[Requirement]:
    """The ``exit`` requirements without a value: each side stream's last node before ``output``
    (work, or a record or wait: a CUDA-graph capture fails on a stream that issues anything
    after its last join) must complete before the graph returns.

    They depend only on where each stream ends, so a pass that adds syncs recomputes just these
    (:func:`streampass.run`'s region check); the rest of :func:`requirements` stays as it was.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + 1
    >>> a = sp.read_streams(make_fx(f)(torch.ones(2)))
    >>> [(r.before.name, r.after.name) for r in exit_joins(a, a.nodes[-1])]
    [('sin', 'output')]
    """
    return _joins(a.stream, _enqueued_before(a, output), output)


def _enqueued_before(a: StreamAssignment, output: Node | None) -> list[Node]:
    """The nodes before ``output`` that put something on their stream: work, and stream ops
    other than the host-side ones. Which stream each is on is left to the caller."""
    compute, syncs = a.compute, a.syncs
    out = []
    for node in a.nodes:
        if node is output:
            break
        call = syncs.get(node)
        if node in compute or (call is not None and call.target not in ops.HOST_SIDE_OPS):
            out.append(node)
    return out


def _joins(stream_of, enqueued: list[Node], output: Node) -> list[Requirement]:
    """:func:`exit_joins` from :func:`_enqueued_before`'s nodes and their streams."""
    last_on: dict[int, Node] = {}
    for node in enqueued:
        last_on[stream_of[node]] = node
    return [Requirement("exit", last, output, None) for t, last in last_on.items() if t != AMBIENT]

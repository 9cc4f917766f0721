"""Write a stream choice (:func:`streampass.assign_streams`) into a graph as ``custom.stream``
annotations, and make the cheap copies the assigner evaluates its candidates on.

These are the only edits automatic stream assignment makes; ``streampass/assign`` itself
only reads graphs (docs/assign.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx

from streampass.errors import StreamPassError
from streampass.ops import AMBIENT, check_stream_index
from streampass.transform.annotations import drop_stream, set_stream


def _check(gm: torch.fx.GraphModule, streams: Mapping[str, int]) -> dict[torch.fx.Node, int]:
    """The nodes ``streams`` names, each with its stream; refuses before anything is edited."""
    by_name = {n.name: n for n in gm.graph.nodes}
    out: dict[torch.fx.Node, int] = {}
    for name, s in streams.items():
        node = by_name.get(name)
        if node is None:
            raise StreamPassError("the stream choice names a node this graph does not have", name)
        check_stream_index(s, name)
        if node.op in ("placeholder", "get_attr", "output"):
            raise StreamPassError(f"{node.op} nodes always run on the ambient stream", name)
        custom = node.meta.get("custom")
        fixed = custom.get("stream") if isinstance(custom, dict) else None
        if fixed is not None and fixed != s:
            raise StreamPassError(f"already annotated with stream {fixed}; the choice says {s}", name)
        out[node] = s
    return out


def apply_streams(gm: torch.fx.GraphModule, streams: Mapping[str, int]) -> int:
    """Annotate each node named in ``streams`` with its stream; returns how many changed.

    Stream 0 (ambient) writes no annotation: an unannotated node outside any fork/join region
    already runs there. A node whose annotation says another stream is refused with a
    :class:`~streampass.errors.StreamPassError`, and then nothing is edited.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: x.sin() + x.cos())
    >>> apply_streams(gm, {"sin": 1, "cos": 0, "add": 0})
    1
    >>> [(n.name, n.meta.get("custom")) for n in gm.graph.nodes if n.op.startswith("call")]
    [('sin', {'stream': 1}), ('cos', None), ('add', None)]
    >>> apply_streams(gm, {"sin": 2})
    Traceback (most recent call last):
      ...
    streampass.errors.StreamPassError: node 'sin': already annotated with stream 1; the choice says 2
    """
    changed = 0
    for node, s in _check(gm, streams).items():
        if s != AMBIENT and set_stream(node, s):
            changed += 1
    return changed


def drop_streams(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Remove every ``custom.stream`` annotation from ``gm`` (other ``custom`` keys stay); returns
    ``gm``: the graph as if written without ``streampass.stream``, for comparing a hand-written
    assignment with :func:`streampass.assign_streams`.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: x.sin())
    >>> sin = gm.graph.find_nodes(op="call_method", target="sin")[0]
    >>> sin.meta["custom"] = {"stream": 1, "tag": "mine"}
    >>> drop_streams(gm) is gm, sin.meta["custom"]
    (True, {'tag': 'mine'})
    """
    for n in gm.graph.nodes:
        drop_stream(n)
    return gm


def annotated_copy(gm: torch.fx.GraphModule, streams: Mapping[str, int]) -> torch.fx.GraphModule:
    """A new GraphModule over a copy of ``gm``'s graph, annotated with ``streams``.

    The copy shares ``gm``'s parameters, buffers and submodules (nothing is deep-copied) and each
    node's ``meta`` is a shallow copy, so annotating or running ``streampass.run`` on the copy
    leaves ``gm`` as it was. Node names are kept.

    >>> import torch
    >>> gm = torch.fx.symbolic_trace(lambda x: x.sin() + x.cos())
    >>> c = annotated_copy(gm, {"sin": 1})
    >>> c.graph.find_nodes(op="call_method", target="sin")[0].meta["custom"], gm.graph.find_nodes(
    ...     op="call_method", target="sin")[0].meta.get("custom")
    ({'stream': 1}, None)
    """
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta["streampass"] = dict(gm.meta.get("streampass") or {"external_events": ()}, table=None)
    apply_streams(copy, streams)
    return copy

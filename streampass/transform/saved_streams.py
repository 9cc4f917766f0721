"""The stream annotations of a graph, carried through pickling.

Unpickling a ``GraphModule`` rebuilds it from its code: every node's ``meta`` is gone, with the
``custom.stream`` that says which side stream it runs on. The syncs survive (their indices are
arguments), so the loaded graph still runs right, but on one stream, and a second
:func:`streampass.run` plans for that. :func:`side_streams` takes the annotations down, call
by call, and :func:`restore_side_streams` puts them back (:mod:`streampass.runtime` does both for a graph :func:`streampass.run` installed).
"""

from __future__ import annotations

import difflib

import torch
import torch.fx

from streampass.ops import AMBIENT, CALL_OPS


def _stream(node: torch.fx.Node) -> int:
    custom = node.meta.get("custom")
    s = custom.get("stream") if isinstance(custom, dict) else None
    return AMBIENT if s is None else s


def _calls(module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in module.graph.nodes if n.op in CALL_OPS]


def _key(node: torch.fx.Node) -> tuple[str, str]:
    return node.op, str(node.target)


def side_streams(gm: torch.fx.GraphModule) -> dict[str, list[tuple[str, str, int]]]:
    """module path (``""`` for ``gm``, a body's for each graph under it) -> ``(op, target,
    stream)`` of each call in the graph, in order, for the graphs with a node on a side stream.
    Calls, not names: a graph rebuilt from code names its nodes anew (``mm`` becomes
    ``mm_default``), but makes the same calls in the same order.

    >>> import streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + 1
    >>> side_streams(make_fx(f)(torch.ones(2)))
    {'': [('call_function', 'aten.sin.default', 1), ('call_function', 'aten.add.Tensor', 0)]}
    """
    out = {}
    for path, module in gm.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            calls = [(*_key(n), _stream(n)) for n in _calls(module)]
            if any(s != AMBIENT for *_, s in calls):
                out[path] = calls
    return out


def restore_side_streams(gm: torch.fx.GraphModule, saved: dict[str, list[tuple[str, str, int]]]) -> None:
    """Annotate the calls of ``gm`` (and of its bodies) with the side streams ``saved``
    (:func:`side_streams` of the graph ``gm`` was rebuilt from) gives them, matching the two
    lists of calls by their targets in order (difflib): a call that has no match stays as it is.

    >>> import pickle, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + 1
    >>> gm = make_fx(f)(torch.ones(2))
    >>> loaded = pickle.loads(pickle.dumps(gm))  # no runtime installed: the annotation is lost
    >>> side_streams(loaded)
    {}
    >>> restore_side_streams(loaded, side_streams(gm)); side_streams(loaded) == side_streams(gm)
    True
    """
    modules = dict(gm.named_modules())
    for path, calls in saved.items():
        module = modules.get(path)
        if not isinstance(module, torch.fx.GraphModule):
            continue
        nodes = _calls(module)
        match = difflib.SequenceMatcher(None, [(op, t) for op, t, _ in calls], [_key(n) for n in nodes], autojunk=False)
        for i, j, size in match.get_matching_blocks():
            for (*_, s), node in zip(calls[i : i + size], nodes[j : j + size]):
                if s != AMBIENT:
                    node.meta["custom"] = {**(node.meta.get("custom") or {}), "stream": s}

"""Writing and removing a node's ``custom.stream`` annotation, the one way every edit does it.

A new ``custom`` dict each time: make_fx and AOT may share one dict between several nodes. The
ambient stream is written as no annotation, and an emptied ``custom`` is removed.

>>> import torch
>>> gm = torch.fx.symbolic_trace(lambda x: x.sin())
>>> sin = gm.graph.find_nodes(op="call_method", target="sin")[0]
>>> set_stream(sin, 2), sin.meta["custom"]
(True, {'stream': 2})
>>> drop_stream(sin), "custom" in sin.meta
(2, False)
"""

from __future__ import annotations

import torch.fx

from streampass.ops import AMBIENT


def set_stream(node: torch.fx.Node, s: int) -> bool:
    """Annotate ``node`` with stream ``s`` (other ``custom`` keys stay); returns whether it changed."""
    custom = node.meta.get("custom")
    custom = custom if isinstance(custom, dict) else {}
    want = {k: v for k, v in custom.items() if k != "stream"} | ({} if s == AMBIENT else {"stream": s})
    if want == custom:
        return False
    _write(node, want)
    return True


def drop_stream(node: torch.fx.Node) -> int | None:
    """Remove ``node``'s stream annotation; returns the stream it named (None if it had none)."""
    custom = node.meta.get("custom")
    if not (isinstance(custom, dict) and "stream" in custom):
        return None
    _write(node, {k: v for k, v in custom.items() if k != "stream"})
    return custom["stream"]


def _write(node: torch.fx.Node, custom: dict) -> None:
    if custom:
        node.meta["custom"] = custom
    else:
        node.meta.pop("custom", None)

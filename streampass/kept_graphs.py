"""The graphs ``StreamPass(keep_graphs=True)`` keeps for its reports: copies of each graph as
:func:`streampass.run` left it. A copy's higher-order op bodies (``torch.cond``'s branches, ...)
are the copies kept when inductor handed those bodies to the pass, before the graph that calls
them: the live bodies go on changing after that (the CPU lowering, and torch's own passes after
the custom ones, which wrap random ops in ``control_deps`` under ``fallback_random``), and a
kept graph must verify as the pass left it."""

from __future__ import annotations

import copy
import weakref

import torch.fx

from streampass.analysis import bodies


class KeptGraphs:
    """Copies of the graphs a pass has seen, each with the kept copies of its bodies.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda x: torch.cond(x.sum() > 0, torch.sin, torch.cos, (x,)))(torch.ones(2))
    >>> kept = KeptGraphs()
    >>> body = kept.keep(gm.true_graph_0)
    >>> outer = kept.keep(gm)
    >>> outer.true_graph_0 is body, outer.false_graph_0 is gm.false_graph_0, outer.graph is gm.graph
    (True, True, False)
    """

    def __init__(self):
        self._by_graph: weakref.WeakKeyDictionary[torch.fx.GraphModule, torch.fx.GraphModule] = (
            weakref.WeakKeyDictionary()
        )

    def keep(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """A copy of ``gm`` as it is now, its bodies as they were kept (the live ones if not),
        with streampass's record (the external events ``run`` read it with: ``verify`` of the
        copy reads them); not the record's table of stream objects, which is the live graph's."""
        kept = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
        if record := gm.meta.get("streampass"):
            kept.meta["streampass"] = dict(copy.deepcopy({k: v for k, v in record.items() if k != "table"}), table=None)
        for body in bodies.bodies(kept):
            earlier = self._by_graph.get(body.module)
            if earlier is not None and "." not in body.name:
                setattr(kept, body.name, earlier)
        self._by_graph[gm] = kept
        return kept

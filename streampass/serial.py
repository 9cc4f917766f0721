"""The program's meaning: a graph run in graph order on one stream, every stream op skipped.

This is the reference a rewritten graph is compared against (:func:`run_serial`).
"""

from __future__ import annotations

import torch
import torch.fx

from streampass import ops

_SYNC_METHODS = frozenset({"record", "record_event", "wait", "wait_event", "wait_stream", "synchronize"})


class _SerialInterpreter(torch.fx.Interpreter):
    def run_node(self, n: torch.fx.Node):
        if ops.as_sync_call(n) is not None:
            if n.target is not ops.CONTROL_DEPS:
                return None
            return (None, *self.map_nodes_to_values(tuple(ops.passthrough_values(n)), n))  # the op's result, then them
        if n.op == "call_method" and n.target in _SYNC_METHODS and n.args:
            # torch 2.11's dynamo graphs keep ``s.wait_stream(t)`` / ``s.synchronize()`` as
            # method calls on the objects, not stream ops
            owner = self.map_nodes_to_values(n.args[0], n)
            if isinstance(owner, (torch.Stream, torch.Event)):
                return None
        return super().run_node(n)


def run_serial(gm: torch.fx.GraphModule, *args):
    """Run ``gm`` in graph order on one stream, skipping every stream op: the program's meaning.

    This is the reference a rewritten graph is compared against (fork/join graphs cannot be
    called eagerly on CPU: ``fork`` switches the accelerator's current stream).

    >>> import torch
    >>> from streampass.synthetic import random_stream_graph, random_inputs
    >>> gm = random_stream_graph(10, 2, style="fork_join")
    >>> x = random_inputs(gm)
    >>> want = run_serial(gm, *[t.clone() for t in x])  # its ops may write their inputs
    >>> len(want)
    3
    >>> import streampass as sp
    >>> _ = sp.run(gm)  # syncs in control_deps, values read through them
    >>> all(torch.equal(a, b) for a, b in zip(run_serial(gm, *[t.clone() for t in x]), want))
    True
    """
    return _SerialInterpreter(gm).run(*args)

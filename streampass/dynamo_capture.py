"""A user's program as ``torch.compile`` sees it: dynamo and AOT autograd, stopped before inductor.

``make_fx`` traces below the Python level, so ``with torch.Stream(...)``, ``torch.cuda.stream``
blocks and ``Event.record()``/``wait()`` leave nothing in its graph: only ``streampass.stream(k)``
survives. dynamo records them: a ``custom.stream`` annotation on each node and the user's syncs
as ``torch.ops.streams`` calls (AOT autograd wraps each in ``control_deps``). :func:`capture`
compiles the function with a backend that keeps the forward graph AOT autograd hands on (the
graph inductor would lower, before its own passes) and runs nothing of it.

The graph's stream and event indices are moved as the inductor pass moves them
(:mod:`streampass.transform.dynamo_indices`), so that 0 is the ambient stream and each user
stream is a side stream: on a machine without an accelerator dynamo gives index 0 to the first
``torch.Stream`` the function uses.
"""

from __future__ import annotations

import torch
import torch.fx

from streampass.errors import StreamPassError
from streampass.transform import dynamo_indices


class _Captured(Exception):
    """Raised by the compiled function instead of running it: the graph is all we wanted."""


def capture(fn, *args, **kwargs) -> torch.fx.GraphModule:
    """The forward graph ``torch.compile(fn)`` would hand to inductor for ``fn(*args, **kwargs)``,
    under ``torch.no_grad()`` (an inference graph: parameters and inputs are placeholders), with
    the program's streams and syncs and 0 as the ambient stream. Nothing of ``fn`` runs.

    Raises :class:`StreamPassError` when dynamo cannot capture ``fn`` as one graph (a graph
    break, or dynamo's own error), with dynamo's reason.

    >>> import torch, streampass as sp
    >>> def f(x, side):
    ...     with side:
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = sp.capture(f, torch.ones(4), torch.Stream("cpu"))
    >>> sp.read_streams(gm).streams  # the user's stream is a side stream, whatever dynamo numbered
    [0, 1]
    >>> sp.run(gm).ok, sp.verify(gm).ok
    (True, True)
    """
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs):
        # dynamo's object table holds this frame's streams and events now, not after
        dynamo_indices.shift_indices(gm, dynamo_indices.forward_offset())
        graphs.append(gm)

        def stop(*_):
            raise _Captured

        stop._boxed_call = True  # AOT autograd calls it with one list, which it need not free
        return stop

    compiled = torch.compile(_through, backend=aot_autograd(fw_compiler=keep), fullgraph=True, dynamic=False)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    try:
        with torch.no_grad():
            compiled(fn, *args, **kwargs)
    except _Captured:
        pass
    except Exception as e:  # dynamo's Unsupported, its internal errors, a user error in fn
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StreamPassError(f"{name}: torch.compile could not capture it as one graph: {first}") from e
    finally:
        # dynamo keys its cache by code object: _through's entries are ours alone, and each
        # capture's backend is new, so dropping them keeps the recompile limit out of reach
        # without touching the user's own compiled entries for fn
        torch._dynamo.eval_frame.remove_from_cache(_through)
    if not graphs:
        raise StreamPassError(f"{name}: torch.compile produced no graph (nothing in it for dynamo to trace)")
    return graphs[-1]


def _through(fn, *args, **kwargs):
    """What :func:`capture` compiles: dynamo inlines ``fn`` into it."""
    return fn(*args, **kwargs)

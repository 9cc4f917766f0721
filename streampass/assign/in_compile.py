"""``assign="auto"`` inside ``torch.compile`` (:class:`streampass.inductor.StreamPass`): which
stream indices it may create, the cost model in the cache key, and the report's summary."""

from __future__ import annotations

import torch
import torch.fx

from streampass.assign.choose import StreamChoice, assign_streams
from streampass.ops import AMBIENT
from streampass.transform.plan import EVENT_BASE

#: Side streams ``assign="auto"`` creates take indices from here up: far above dynamo's object
#: table (the user's streams and events), below the events streampass allocates (EVENT_BASE).
AUTO_STREAMS = EVENT_BASE // 2


def cost_key(cost) -> str:
    """The cost model as it enters the cache key: a profile by its fields; a ``CostModel`` with
    overrides by the overrides' name (a dict by its items).

    >>> from streampass.sim.cost import CostModel
    >>> cost_key("h100")
    "'h100'"
    >>> cost_key(CostModel("h100", {"mm": 1e-3})) == cost_key(CostModel("h100", {"mm": 1e-3})) != cost_key("h100")
    True
    """
    from streampass.sim.cost import CostModel

    if not isinstance(cost, CostModel):
        return repr(cost)
    over = cost.overrides
    named = getattr(over, "__qualname__", None) if callable(over) else sorted(over.items()) if over else None
    return f"{cost.profile!r}/{named}"


#: why ``assign="auto"`` with the default cost places nothing on a CPU graph
CPU_SERIAL = "on CPU, streams run one after another"


def device_cost(cost, device: torch.device):
    """The cost model ``assign="auto"`` prices a graph on ``device`` with. ``cost`` as given (a
    profile name, a ``DeviceProfile`` or a ``CostModel``: also on CPU, to preview what a GPU
    would get); None, the default: the device's own, on CUDA the profile of its name (h200,
    h100, a100; h100 for others and for other accelerators), and on a CPU none at all (returns
    None). CPU streams run one after another, so a side stream cannot overlap anything there,
    and its syncs are fusion barriers in inductor's CPU code: one stream is always the fastest.

    >>> device_cost(None, torch.device("cpu")) is None, device_cost("a100", torch.device("cpu"))
    (True, 'a100')
    """
    if cost is not None:
        return cost
    if device.type in ("cpu", "meta"):
        return None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""  # other accelerators: h100
    return next((p for p in ("h200", "h100", "a100") if p.upper() in name.upper()), "h100")


def serial_summary(own_side_streams: int) -> dict:
    """The report's summary when :func:`device_cost` chose no cost model: one stream, and why."""
    return {
        "candidate": "one stream",
        "side_streams": own_side_streams,
        "new_streams": 0,
        "predicted_us": None,
        "one_stream_us": None,
        "why": CPU_SERIAL,
    }


def note(a: dict) -> str:
    own = a["side_streams"] - a["new_streams"]
    if a.get("why"):
        return f"; assign=auto placed nothing: {a['why']} (give assign_cost to price for a GPU)"
    return (
        f"; assign=auto chose {a['candidate']!r}: {a['new_streams']} new side stream(s)"
        + (f" next to the program's {own}" if own else "")
        + f", predicted {a['predicted_us']} us against {a['one_stream_us']} us on one stream"
    )


def summary(choice: StreamChoice | None) -> dict | None:
    """What ``assign="auto"`` chose for a graph, for the report (None: not asked).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> s = summary(sp.assign_streams(make_fx(lambda x, w: (x @ w).relu() + (x @ w.t()).sigmoid())(m, m)))
    >>> s["side_streams"], s["new_streams"], s["predicted_us"] < s["one_stream_us"]
    (1, 1, True)
    >>> ": 1 new side stream(s), predicted" in note(s)
    True

    ``side_streams`` counts every side stream the graph runs on after the choice, the program's
    own included; ``new_streams`` those the choice added.
    """
    if choice is None:
        return None
    own = {s for name, s in choice.streams.items() if name not in choice.free}
    return {
        "candidate": choice.candidate,
        "side_streams": len(choice.used) - 1,
        "new_streams": len(set(choice.used) - own - {AMBIENT}),
        "predicted_us": round(choice.makespan * 1e6, 1),
        "one_stream_us": round(choice.single_stream * 1e6, 1),
    }


def assign_in_place(gm: torch.fx.GraphModule, cost, max_streams: int, external_events=()) -> StreamChoice:
    """Choose streams for ``gm``'s unplaced nodes (side streams from :data:`AUTO_STREAMS` up,
    what inductor will fuse kept together) and write them as annotations; the pass then plans
    the syncs as for a user's own streams. ``external_events``: as for :func:`streampass.run`.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> m = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    >>> gm = make_fx(lambda x, w: (x @ w).relu() + (x @ w.t()).sigmoid())(m, m)
    >>> choice = assign_in_place(gm, "h100", max_streams=2)
    >>> sp.read_streams(gm).streams == [0, AUTO_STREAMS], sp.run(gm).ok
    (True, True)
    """
    choice = assign_streams(
        gm,
        cost,
        max_streams=max_streams,
        external_events=external_events,
        side_streams=range(AUTO_STREAMS, EVENT_BASE),
        keep_fusions=True,
    )
    choice.apply(gm)
    return choice

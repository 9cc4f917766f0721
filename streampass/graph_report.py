"""What :class:`streampass.inductor.StreamPass` reports for each graph it compiles: one log line
and one structured-trace artifact (``streampass_report``) per graph."""

from __future__ import annotations

import dataclasses

import torch.fx

from streampass.assign.in_compile import note
from streampass.transform.pipeline import RunResult


@dataclasses.dataclass
class GraphReport:
    """What :class:`StreamPass` did to one compiled graph (one log line, one trace artifact)."""

    graph: str  # "inference", "forward" or "backward"
    device: str
    streams: list[int]
    cross_stream_edges: int
    records_added: int
    waits_added: int
    hazards_before: dict[str, int]
    hazards_after: dict[str, int]
    changed: bool
    lowering: str  # "native" (GPU), "cpu" or "none"
    result: RunResult | None = dataclasses.field(default=None, repr=False)
    verified_graph: torch.fx.GraphModule | None = dataclasses.field(default=None, repr=False)
    #: how stream indices relate to dynamo's object table (see :mod:`streampass.transform.dynamo_indices`):
    #: "dynamo" (the same; 0 is the ambient stream), "dynamo+1" (dynamo's index i is stream i + 1,
    #: since dynamo gave index 0 to a user object) or "unknown"
    indices: str = "dynamo"
    #: with ``StreamPass(assign="auto")``: the candidate chosen, its side streams and the
    #: predicted makespan against one stream (:func:`streampass.assign_streams`)
    assigned: dict | None = None
    #: events the graph waits on that an earlier graph or eager code records
    #: (:func:`streampass.analysis.reading.events_recorded_outside`)
    external_events: list[int] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        """The report's fields as a JSON-able dict (without the run result and the kept graph)."""
        skip = ("result", "verified_graph")
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}

    def line(self) -> str:
        """The report as one log line."""
        before, after = sum(self.hazards_before.values()), sum(self.hazards_after.values())
        return (
            f"streampass [{self.graph}, {self.device}]: streams {self.streams}, "
            f"{self.cross_stream_edges} cross-stream edge(s), added {self.records_added} record(s) "
            f"and {self.waits_added} wait(s), hazards {before} before -> {after} after"
            + ("" if before == 0 else f" {nonzero(self.hazards_before)}")
            + (
                ""
                if not self.external_events
                else f"; waits on event(s) {self.external_events} recorded outside the graph"
            )
            + ("" if self.indices == "dynamo" else f"; stream indices: {_INDEX_NOTES[self.indices]}")
            + ("" if self.assigned is None else note(self.assigned))
        )


_INDEX_NOTES = {
    "dynamo+1": "dynamo's index + 1 (dynamo gave index 0 to a user object, so 0 here is the ambient stream)",
    "unknown": "as dynamo numbered them; whether index 0 is the ambient stream is not known (forward not seen)",
}


def nonzero(kinds: dict[str, int]) -> dict[str, int]:
    """``kinds`` without its zero counts."""
    return {k: v for k, v in kinds.items() if v}

"""Inductor's collective bucketing, which runs after StreamPass and merges collectives across streams.

With ``torch._inductor.config.bucket_all_reduces_fx`` (or ``bucket_reduce_scatters_fx``,
``bucket_all_gathers_fx``, or ``aten_distributed_optimizations.enable_overlap_scheduling`` with
``collective_bucketing=True``) inductor merges collectives of one kind, group and dtype into one, late
in its post-grad passes: after the custom pass. The merged collective, and the copies of every
input into its buffer, take the first collective's ``custom`` meta (torch's ``bucketing.py``,
``_populate_node_meta``), so on a GPU they run on the first one's stream. Where the merged
collectives ran on different streams, that stream reads the others' inputs, and the others'
readers read its result, with none of the waits the plan placed for them (checked on the GPU
lowering's generated code, tests/test_distributed.py). On CPU streams are one thread and
nothing races, nor on torch 2.11 and 2.12, whose GPU lowering issues every kernel on one stream;
collectives of one kind on one stream merge safely.

:func:`refuse_across_streams` turns that race into an error, before StreamPass edits the graph;
``assign="auto"`` keeps each group that may merge (:func:`merged_groups`) on one stream.
"""

from __future__ import annotations

import torch
import torch._inductor.config as inductor_config
import torch.fx

from streampass import compat
from streampass.analysis.reading import StreamAssignment
from streampass.errors import StreamPassError


def _c10d(name: str):
    return getattr(getattr(torch.ops._c10d_functional, name, None), "default", None)


#: bucketing flag -> the functional collectives it merges
_MERGED_BY = {
    "bucket_all_reduces_fx": ("all_reduce",),
    "bucket_reduce_scatters_fx": ("reduce_scatter_tensor",),
    "bucket_all_gathers_fx": ("all_gather_into_tensor",),
}
_OVERLAP = "aten_distributed_optimizations.enable_overlap_scheduling"


def bucketing_flags() -> dict[str, tuple[str, ...]]:
    """The bucketing settings on in inductor's config now -> the collectives each merges.

    >>> import torch._inductor.config as inductor_config
    >>> with inductor_config.patch(bucket_all_reduces_fx="all"):
    ...     bucketing_flags()
    {"bucket_all_reduces_fx='all'": ('all_reduce',)}
    """
    on = {
        f"{flag}={getattr(inductor_config, flag)!r}": merged
        for flag, merged in _MERGED_BY.items()
        if getattr(inductor_config, flag, "none") != "none"
    }
    overlap = getattr(inductor_config, "aten_distributed_optimizations", None)
    if getattr(overlap, "enable_overlap_scheduling", False) and getattr(overlap, "collective_bucketing", None):
        on[f"{_OVERLAP}=True with collective_bucketing=True"] = tuple(
            name for merged in _MERGED_BY.values() for name in merged
        )
    return on


def _bucket_key(node: torch.fx.Node) -> tuple:
    """What torch's bucketing keys a collective on (op, group, reduce op, dtype); more, never less."""
    val = node.meta.get("val")
    return (
        node.target,
        tuple(a for a in node.args[1:] if not isinstance(a, torch.fx.Node)),
        getattr(val, "dtype", None),
    )


class Merged(list):
    """Collectives inductor's bucketing may merge into one (their nodes, in graph order)."""

    why = "inductor's collective bucketing merges them into one, after StreamPass"


def _groups(a: StreamAssignment) -> list[tuple[str, Merged]]:
    """``(setting, collectives)`` for each bucketing setting on and each key it merges on."""
    found = []
    for setting, names in bucketing_flags().items():
        targets = {t for t in map(_c10d, names) if t is not None}
        by_key: dict[tuple, Merged] = {}
        for n in a.nodes:
            if n.op == "call_function" and n.target in targets:
                by_key.setdefault(_bucket_key(n), Merged()).append(n)
        found += [(setting, group) for group in by_key.values()]
    return found


def merged_groups(a: StreamAssignment) -> list[Merged]:
    """The collectives of ``a`` that inductor's bucketing, as configured now, may merge: each
    group of two or more (``assign="auto"`` keeps each on one stream)."""
    return [group for _, group in _groups(a) if len(group) > 1]


def across_streams(a: StreamAssignment) -> list[tuple[str, Merged]]:
    """Each bucketing setting that is on, with collectives it could merge that run on different
    streams of ``a``: ``(setting, those collectives)``."""
    return [(setting, group) for setting, group in _groups(a) if len({a.stream[n] for n in group}) > 1]


def refuse_across_streams(a: StreamAssignment) -> None:
    """Raise :class:`StreamPassError`, naming the collectives and the setting, where inductor's
    bucketing may merge collectives that run on different streams. For the GPU lowering only, and
    where inductor issues kernels on their streams (torch 2.13 on)."""
    if not (compat.INDUCTOR_ISSUES_ON_STREAMS and compat.LOWERING_ORDERS_AFTER_SYNCS):
        return
    for setting, group in across_streams(a):
        where = ", ".join(f"{n.name} (stream {a.stream[n]})" for n in group)
        raise StreamPassError(
            f"{where}: inductor's {setting} merges these collectives after StreamPass, onto the first "
            "one's stream, which would then read the others' inputs without the waits the plan placed; "
            f"turn that setting off for this compile (torch._inductor.config), or issue them on one stream",
            group[0].name,
        )

"""Inductor's collective bucketing, which runs after StreamPass and merges collectives across streams.

With ``torch._inductor.config.bucket_all_reduces_fx`` (or ``bucket_reduce_scatters_fx``,
``bucket_all_gathers_fx``, or ``aten_distributed_optimizations.enable_overlap_scheduling`` with its
``collective_bucketing`` or, by default, its FSDP pre-bucketing) inductor merges independent
collectives of one kind, group and (unless a multi-dtype mode) dtype into one, late in its post-grad
passes: after the custom pass. The merged collective, and the copies of every
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

import networkx as nx
import torch
import torch._inductor.config as inductor_config
import torch.fx

from streampass import compat
from streampass.analysis.reading import StreamAssignment
from streampass.errors import StreamPassError


def _c10d(name: str):
    return getattr(getattr(torch.ops._c10d_functional, name, None), "default", None)


#: bucketing flag -> (the functional collectives it merges, the config naming its bucket mode)
_MERGED_BY = {
    "bucket_all_reduces_fx": (("all_reduce",), None),
    "bucket_reduce_scatters_fx": (("reduce_scatter_tensor",), "bucket_reduce_scatters_bucket_mode"),
    "bucket_all_gathers_fx": (("all_gather_into_tensor",), "bucket_all_gathers_bucket_mode"),
}
_ALL = tuple(name for names, _ in _MERGED_BY.values() for name in names)
#: overlap scheduling buckets with ``collective_bucketing``, and before it, by default, merges the
#: collectives of any group with an FSDP-style all-gather (``pre_bucketing_fsdp_collectives``)
_OVERLAP = "aten_distributed_optimizations.enable_overlap_scheduling=True"


def bucketing_flags() -> dict[str, tuple[tuple[str, ...], str | None]]:
    """The bucketing settings on in inductor's config now -> (the collectives each merges, its
    bucket mode; ``"any"`` where the key is not torch's: every collective of a kind may merge).

    >>> import torch._inductor.config as inductor_config
    >>> with inductor_config.patch(bucket_all_reduces_fx="all"):
    ...     bucketing_flags()
    {"bucket_all_reduces_fx='all'": (('all_reduce',), None)}
    """
    on = {}
    for flag, (merged, mode) in _MERGED_BY.items():
        if getattr(inductor_config, flag, "none") != "none":
            on[f"{flag}={getattr(inductor_config, flag)!r}"] = (merged, mode and getattr(inductor_config, mode, None))
    overlap = getattr(inductor_config, "aten_distributed_optimizations", None)
    if getattr(overlap, "enable_overlap_scheduling", False) and (
        getattr(overlap, "collective_bucketing", None) or getattr(overlap, "pre_bucketing_fsdp_collectives", False)
    ):
        on[_OVERLAP] = (_ALL, "any")
    return on


def _bucket_key(node: torch.fx.Node, mode: str | None) -> object:
    """torch's own key for the collectives it may merge (``bucketing.bucket_key``: group, reduce
    op and, unless ``mode`` is multi-dtype, dtype); where torch cannot tell (mode ``"any"``, or a
    group it cannot resolve here), the kind of collective alone: more merges, never fewer."""
    if mode != "any":
        try:
            from torch._inductor.fx_passes.bucketing import bucket_key

            return node.target, bucket_key(node, mode)
        except Exception:  # a group or an op this torch cannot key: the kind alone
            pass
    return (node.target,)


class Merged(list):
    """Collectives inductor's bucketing may merge into one (their nodes, in graph order)."""

    why = "inductor's collective bucketing merges them into one, after StreamPass"


def _groups(a: StreamAssignment) -> list[tuple[str, Merged]]:
    """``(setting, collectives)`` for each bucketing setting on and each set of collectives it
    may merge: one key, and linked by independence (torch never merges a collective with one it
    depends on), so that two collectives in different sets always depend on one another."""
    flags = bucketing_flags()
    if not flags:
        return []
    graph = nx.DiGraph((i, n) for n in a.nodes for i in n.all_input_nodes)
    found = []
    for setting, (names, mode) in flags.items():
        targets = {t for t in map(_c10d, names) if t is not None}
        by_key: dict[object, list[torch.fx.Node]] = {}
        for n in a.nodes:
            if n.op == "call_function" and n.target in targets:
                by_key.setdefault(_bucket_key(n, mode), []).append(n)
        for same in by_key.values():
            found += [(setting, Merged(g)) for g in _independent_sets(graph, same)]
    return found


def _independent_sets(graph: nx.DiGraph, nodes: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """The connected components, in graph order, of ``nodes`` linked where neither reaches the other."""
    if len(nodes) < 2:
        return [nodes]
    below = {n: nx.descendants(graph, n) if n in graph else set() for n in nodes}
    may_merge = nx.Graph()
    may_merge.add_nodes_from(nodes)
    may_merge.add_edges_from(
        (x, y) for i, x in enumerate(nodes) for y in nodes[i + 1 :] if y not in below[x] and x not in below[y]
    )
    order = {n: i for i, n in enumerate(nodes)}
    return sorted((sorted(c, key=order.get) for c in nx.connected_components(may_merge)), key=lambda c: order[c[0]])


def merged_groups(a: StreamAssignment) -> list[Merged]:
    """The collectives of ``a`` that inductor's bucketing, as configured now, may merge: each
    set of two or more (``assign="auto"`` keeps each on one stream, on every torch and device:
    it matters where :func:`refuse_across_streams` would refuse, and costs little elsewhere)."""
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

"""What aten ops' schemas say about their arguments (which they write, which their results alias),
read once per op, and the ops whose schemas say less than they do (views with no alias annotation,
aliases that copy when they must)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SchemaFacts:
    """Alias facts of one op's schema (computed once per target: schemas do not change)."""

    writes: tuple[int, ...]  # argument positions the op writes
    alias_args: tuple[tuple[int, str], ...]  # (position, name) of arguments the output may alias
    returns_alias: bool  # whether the first return carries an alias annotation
    return_args: tuple[int | None, ...] = ()  # per return of several: the argument it is, if any


NO_FACTS = SchemaFacts((), (), False)
# Keyed by id (see STREAM_OP_IDS); the entry holds the target so its id stays unique.
_facts_cache: dict[int, tuple[Any, SchemaFacts]] = {}


def schema_facts(target: Any) -> SchemaFacts:
    """What ``target``'s schema says it does to its arguments (:data:`NO_FACTS` with no schema).

    >>> schema_facts(torch.ops.aten.add_.Tensor).writes, schema_facts(torch.ops.aten.t.default).alias_args
    ((0,), ((0, 'self'),))
    >>> schema_facts(torch.ops.aten.max.dim).return_args, schema_facts(torch.sin) is NO_FACTS
    ((None, None), True)
    """
    hit = _facts_cache.get(id(target))
    if hit is not None and hit[0] is target:
        return hit[1]
    schema = getattr(target, "_schema", None)
    if schema is None:
        return NO_FACTS  # not cached: plain Python targets can be short-lived
    writes = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    ret = schema.returns[0].alias_info if schema.returns else None
    alias_args: tuple[tuple[int, str], ...] = ()
    if ret is not None:
        # A view (`Tensor(a)`) or an in-place op's result (`Tensor(a!)`) is the argument it
        # aliases. A list of views (`Tensor(a)[]`: split, unbind) exposes no alias set on the
        # list itself in Python: it aliases the argument that has one.
        alias_args = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and (a.alias_info.before_set & ret.before_set or not ret.before_set)
        )
    return_args: tuple[int | None, ...] = ()
    if len(schema.returns) > 1:
        return_args = tuple(_same_set(schema, r.alias_info) for r in schema.returns)
    facts = SchemaFacts(writes, alias_args, ret is not None, return_args)
    _facts_cache[id(target)] = (target, facts)
    return facts


def _same_set(schema, alias) -> int | None:
    """The position of the argument in the alias set ``alias`` names (None: a new tensor)."""
    if alias is None or not alias.before_set:
        return None
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.before_set & alias.before_set:
            return i
    return None


# aten views whose schema carries no alias annotation (``atleast_2d`` returns its input, or a view of it)
UNANNOTATED_VIEWS = frozenset(
    {torch.ops.aten._unsafe_view.default, torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.unsafe_chunk.default,
     torch.ops.aten.unsafe_split_with_sizes.default, torch.ops.aten.atleast_1d.default,
     torch.ops.aten.atleast_2d.default, torch.ops.aten.atleast_3d.default}
)  # fmt: skip
# aten ops that return a view of each tensor of their list argument, though their schemas say
# nothing (``torch.export`` keeps ``meshgrid``: its results are expands of its inputs)
EACH_VIEWS = frozenset(
    {"aten::meshgrid", "aten::broadcast_tensors", "aten::atleast_1d", "aten::atleast_2d", "aten::atleast_3d"}
)  # fmt: skip


# aten ops whose schema says they return their input (``Tensor(a)``) but which copy when they must:
# ``x.t().contiguous()`` launches a kernel that reads ``x``. torch.export and pre-dispatch graphs
# keep them. Like their Python spellings (:mod:`streampass.python_calls`) they share their input's
# storage for what writes through them, and stay work. (A scan of torch's OpInfo samples, contiguous
# and not, over the ops whose schemas say they alias found ``ravel``, ``contiguous`` and ``to``
# copying; the rest are known to.)
MAYBE_VIEWS = frozenset(
    {"aten::contiguous", "aten::reshape", "aten::reshape_as", "aten::flatten", "aten::ravel", "aten::to",
     "aten::type_as", "aten::resolve_conj", "aten::resolve_neg", "aten::_autocast_to_reduced_precision",
     "aten::_autocast_to_full_precision"}
)  # fmt: skip

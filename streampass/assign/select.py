"""Which priced candidate wins (:func:`streampass.assign_streams`' selection, docs/assign.md).

Pure: it sees only the :class:`~streampass.assign.evaluate.Evaluation` of each candidate. The
fastest wins; within :data:`TIE` of it, memory decides, and within :data:`MEM_TIE` of the least
memory, the faster and then the one with fewer waits. A multi-stream candidate must be strictly
faster than one stream.
"""

from __future__ import annotations

from streampass.assign.evaluate import Evaluation

#: makespans within this share of the fastest count as equal, and then peak memory decides (1%:
#: below what the cost model can tell apart, above what a deferred free costs)
TIE = 1e-2
#: among those, peaks within this share of the least count as equal, and then the faster wins,
#: then the one with fewer waits: a megabyte saved does not buy a slower schedule
MEM_TIE = 5e-2
#: how many of the tied leaders the local search starts from
LEADERS = 3


def preference(evals: list[Evaluation]):
    """The sort key of the search's preference over ``evals``: first the candidates tied with the
    fastest (:data:`TIE`) whose peak is within :data:`MEM_TIE` of the least among those, fastest
    first, then fewer waits; then the other tied ones, least memory first; then the rest by
    makespan."""
    fastest = min(e.makespan for e in evals)
    tied = [e for e in evals if e.makespan <= fastest * (1 + TIE)]
    lean = min(e.peak_bytes for e in tied) * (1 + MEM_TIE)

    def key(e: Evaluation):
        if e.makespan > fastest * (1 + TIE):
            return (2, e.makespan, e.peak_bytes, e.waits)
        if e.peak_bytes <= lean:
            return (0, e.makespan, e.waits, e.peak_bytes)
        return (1, e.peak_bytes, e.makespan, e.waits)

    return key


def leaders(evals: list[Evaluation], single: Evaluation, budget: float) -> list[Evaluation]:
    """The multi-stream candidates the local search starts from: at most :data:`LEADERS` of
    those within ``budget`` bytes and tied with the fastest of them, in order of preference.

    >>> e = lambda name, us, mib: Evaluation(name, {}, us * 1e-6, 1, 1, mib << 20, 0.0)
    >>> one = e("one stream", 200, 10)
    >>> [x.name for x in leaders([one, e("a", 100, 20), e("b", 100.5, 10), e("c", 150, 10)], one, 2**40)]
    ['b', 'a']
    """
    ok = [e for e in evals if e.peak_bytes <= budget and e is not single]
    if not ok:
        return []
    key = preference(ok)
    return sorted((e for e in ok if key(e)[0] < 2), key=key)[:LEADERS]


def pick(evals: list[Evaluation], single: Evaluation, budget: float) -> Evaluation:
    """The winner among ``evals`` (``single``: the one-stream candidate, which wins unless another
    is strictly faster); with none within ``budget`` bytes, the one with the least memory.

    >>> e = lambda name, us, mib: Evaluation(name, {}, us * 1e-6, 1, 1, mib << 20, 0.0)
    >>> one = e("one stream", 200, 10)
    >>> pick([one, e("a", 100, 20), e("b", 100.5, 10)], one, 2**40).name  # tied: half the memory
    'b'
    >>> pick([one, e("a", 100, 20), e("b", 100.5, 20)], one, 2**40).name  # tied on memory too: faster
    'a'
    >>> pick([one, e("a", 100, 20)], one, budget=15 << 20).name
    'one stream'
    >>> one = e("one stream", 100, 20)  # b is preferred to a, but only a beats one stream
    >>> pick([one, e("a", 99.9, 15), e("b", 100, 10)], one, 2**40).name
    'a'
    """
    ok = [e for e in evals if e.peak_bytes <= budget]
    if not ok:
        return min(evals, key=lambda e: (e.peak_bytes, e.makespan), default=single)
    if single in ok:  # streams must strictly pay: the others compete only if faster than it
        ok = [single] + [e for e in ok if e is not single and e.makespan < single.makespan * (1 - 1e-9)]
    return min(ok, key=preference(ok))

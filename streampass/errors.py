"""The one exception streampass raises for input it refuses."""

from __future__ import annotations


class StreamPassError(ValueError):
    """A graph streampass cannot process, or a request it refuses.

    The message always names the offending node (when there is one) and the rule it
    breaks. Passes raise it before editing anything, so the graph is left as it was.

    >>> err = StreamPassError("join without a matching fork", node="join_1")
    >>> str(err)
    "node 'join_1': join without a matching fork"
    """

    def __init__(self, message: str, node: str | None = None):
        self.node = node
        self.rule = message
        super().__init__(f"node {node!r}: {message}" if node is not None else message)


class StreamIndexError(StreamPassError):
    """A stream index ``sp.stream`` refuses. It is raised where dynamo may be tracing, which cannot
    run :class:`StreamPassError`'s constructor: this one is ``ValueError``'s own, so that under
    ``torch.compile(fullgraph=True)`` dynamo reports "raised exception StreamIndexError('...')"
    (as it reports any exception in a full graph), and without ``fullgraph`` it reaches the caller.

    >>> err = StreamIndexError("stream index must be >= 0, got -1")
    >>> isinstance(err, StreamPassError), err.node, err.rule
    (True, None, 'stream index must be >= 0, got -1')
    """

    __init__ = ValueError.__init__
    node = None

    @property
    def rule(self) -> str:
        return str(self)


class StreamPassWarning(UserWarning):
    """A program streampass compiles as written but probably not as meant (it names the node)."""

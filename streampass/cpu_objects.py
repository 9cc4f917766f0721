"""Streams and events for devices without them (CPU): every sync on them does nothing.

torch's CPU events cannot be recorded, so a rewritten graph called on CPU gets these (subclasses,
so the stream ops' type checks pass), and its results equal the original graph's bit for bit.

>>> s = NoOpStream("cpu")
>>> e = s.record_event(); e.wait(s); s.wait_event(e); s.synchronize()
>>> type(e).__name__, e.query()
('NoOpEvent', True)
"""

from __future__ import annotations

import torch


class NoOpEvent(torch.Event):
    """An event for devices without events (CPU): recording and waiting do nothing."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class NoOpStream(torch.Stream):
    """A stream for devices without streams (CPU): waiting does nothing."""

    def record_event(self, event=None):
        # torch's own would refuse a NoOpEvent on torch 2.11 ("expected event to be a torch.Event")
        return event if event is not None else NoOpEvent("cpu")

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

"""The simulator's first player, kept as the oracle for the one-pass ``run_items``: a heap of
timed events (the CPU issues an item, an item reaches its stream, an item completes) processed
in time order. One change from the original: a CPU-blocking sync that was held returns at the
later of its own CPU time and its last gate (it used to return at the gate, its CPU time
dropped, so a later gate could make the CPU resume earlier)."""

from __future__ import annotations

import heapq


def play_events(items, streams) -> float:
    """Set each item's issue, start and end times; return when the CPU is done."""
    queues = {s: [] for s in streams}
    head = dict.fromkeys(streams, 0)
    busy = dict.fromkeys(streams)
    heap: list = []
    counter = [0]
    ISSUE, ENQUEUE, COMPLETE = 0, 1, 2
    nxt = 0
    blocked = None
    cpu_end = 0.0

    def push(t, kind, item):
        counter[0] += 1
        heapq.heappush(heap, (t, kind, counter[0], item))

    def try_start(s, now):
        if busy[s] is not None or head[s] >= len(queues[s]):
            return
        item = queues[s][head[s]]
        if not all(g.done for g in item.gates):
            return
        head[s] += 1
        busy[s] = item
        item.start = now
        item.end = now + item.dur
        push(item.end, COMPLETE, item)

    push(0.0, ISSUE, None)
    while heap:
        now, kind, _, item = heapq.heappop(heap)
        if kind == COMPLETE:
            item.done = True
            busy[item.stream] = None
            for s in streams:
                try_start(s, now)
            if blocked is not None and all(g.done for g in blocked.gates):
                now = max(now, blocked.issued + blocked.cpu)
                blocked.end = now
                blocked.done = True
                blocked = None
                push(now, ISSUE, None)
        elif kind == ENQUEUE:
            queues[item.stream].append(item)
            try_start(item.stream, now)
        else:
            if nxt >= len(items):
                cpu_end = now
                continue
            it = items[nxt]
            nxt += 1
            it.issued = now
            after = now + it.cpu
            if it.stream is not None:
                push(after, ENQUEUE, it)
                push(after, ISSUE, None)
                continue
            it.start = now
            if it.block_cpu and not all(g.done for g in it.gates):
                blocked = it
                continue
            it.end = after
            it.done = True
            push(after, ISSUE, None)
    assert blocked is None, "CPU blocked forever"
    return cpu_end

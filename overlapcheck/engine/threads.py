"""The forward thread's two host threads, run one at a time (docs/design.md §4.14).

A thread is a generator that yields at its choice points, saying what it waits for:

* ``(PUT, queue, item)``: put ``item`` on ``queue`` (never blocks);
* ``(GET, queue)``: take the oldest item of ``queue``; runnable only while it has one,
  resumed with the item;
* ``(POINT,)``: a plain choice point (before an access to a shared host object).

At every choice point the runtime's schedule picks which runnable thread goes on
(``rt.host_choice``: the sim's strategy, recorded in ``choices`` with the device's
decisions, so that a repro's choices replay the interleaving). The chosen thread's
pending operation is done and the thread runs to its next choice point; nothing
else runs meanwhile. No OS thread decides anything: the order is the schedule's.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, List, Optional

PUT, GET, POINT = "put", "get", "point"
SCHEDULER, FORWARD = "scheduler", "forward"
THREADS = (SCHEDULER, FORWARD)
# the names the schedule sees (a stream-stall schedule stalls streams, never these)
CHOICE_NAMES = ("host:scheduler", "host:forward")
_START = ("start",)


class HostQueue:
    """A FIFO between the threads; ``puts`` numbers the items put so far."""

    __slots__ = ("name", "items", "puts")

    def __init__(self, name: str):
        self.name = name
        self.items: Deque[tuple] = deque()     # (seq, item)
        self.puts = 0


class HostThreads:
    """The scheduler thread (0), one generator per engine step, and the forward thread
    (1), one generator for the run. ``on_queue(thread, queue, op, seq, item)`` is told
    of every queue operation as it happens (the engine's ``HostQueue`` events)."""

    def __init__(self, rt, on_queue: Callable[[str, str, str, int, object], None]):
        self.rt, self.on_queue = rt, on_queue
        self.input, self.output = HostQueue("input"), HostQueue("output")
        self._gens: List[Optional[object]] = [None, None]
        self._want: List[Optional[tuple]] = [None, None]

    def start_forward(self, gen) -> None:
        self._gens[1], self._want[1] = gen, _START

    def run(self, gen) -> None:
        """Run the scheduler thread's ``gen`` to its end, the forward thread interleaved
        with it at the choice points the schedule picks."""
        gens, want = self._gens, self._want
        gens[0], want[0] = gen, _START
        while gens[0] is not None:
            ready = [t for t in (0, 1) if gens[t] is not None and self._runnable(want[t])]
            if not ready:
                raise AssertionError("host threads deadlocked: each waits on an empty queue")
            if len(ready) == 1:
                t = ready[0]
                self.rt.host_choice(CHOICE_NAMES[t:t + 1])
            else:
                t = ready[self.rt.host_choice(CHOICE_NAMES)]
            self._resume(t)

    @staticmethod
    def _runnable(w: tuple) -> bool:
        return w[0] != GET or bool(w[1].items)

    def _resume(self, t: int) -> None:
        w, gen, send = self._want[t], self._gens[t], None
        op = w[0]
        if op == PUT:
            q, item = w[1], w[2]
            seq = q.puts
            q.puts += 1
            q.items.append((seq, item))
            self.on_queue(THREADS[t], q.name, PUT, seq, item)
        elif op == GET:
            q = w[1]
            seq, send = q.items.popleft()
            self.on_queue(THREADS[t], q.name, GET, seq, send)
        try:
            self._want[t] = next(gen) if op == _START[0] else gen.send(send)
        except StopIteration:
            self._gens[t] = self._want[t] = None


# the request fields both threads can reach (docs/design.md §4.14): what a launch reads
# of a request, and what the scheduler thread's batch building and result processing
# write; a read of a property counts as a read of the field it derives from
SHARED_FIELDS = ("committed", "unprocessed_decodes", "pages", "state", "output")
_READ_AS = {"committed": "committed", "unprocessed_decodes": "unprocessed_decodes",
            "pages": "pages", "state": "state", "done": "state", "output": "output",
            "tokens": "output"}


def shared_state(r) -> tuple:
    """``r``'s shared fields, compared before and after a scheduler-thread action to
    tell which it wrote (``output`` by length: it only grows in place)."""
    return (r.committed, r.unprocessed_decodes, tuple(r.pages), r.state, len(r.output))


def written(before: tuple, after: tuple) -> List[str]:
    return [f for f, a, b in zip(SHARED_FIELDS, before, after) if a != b]


class _Reading:
    """A request as the worker reads it: each read of a shared field is noted."""

    __slots__ = ("_r", "_log")

    def __init__(self, r, log: list):
        self._r, self._log = r, log

    def __getattr__(self, name):
        f = _READ_AS.get(name)
        if f is not None:
            self._log.append((self._r.spec.rid, f))
        return getattr(self._r, name)


class ReadLog:
    """The engine's requests by id, as the worker sees them with the forward thread on:
    every read of a shared field goes to ``log`` (request id, field), which the engine
    turns into ``HostAccess`` events of the thread that read."""

    def __init__(self, requests: dict):
        self.requests = requests
        self.log: List[tuple] = []

    def __getitem__(self, rid):
        return _Reading(self.requests[rid], self.log)

    def __contains__(self, rid) -> bool:
        return rid in self.requests

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)

    def take(self) -> List[tuple]:
        """The reads noted since the last call, each (request, field) once, in order."""
        log, self.log[:] = list(dict.fromkeys(self.log)), []
        return log

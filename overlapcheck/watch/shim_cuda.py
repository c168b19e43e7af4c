"""``torch.cuda`` streams and events with a CPU meaning (the shim of ``watch(device="cpu")``).

Inside the context, ``torch.cuda.Stream``, ``Event``, ``current_stream``,
``default_stream``, ``stream``, ``set_stream``, ``synchronize``, ``is_available``,
``device_count`` and ``current_device`` are replaced by the objects below. Nothing
runs asynchronously on the CPU: every op runs when it is issued. What the shim keeps
is the code's issue order, which is all the happens-before detector needs: streams
are contexts, events carry the clocks of their latest record, waits and syncs join
them, exactly as PyTorch's GPU trace callbacks report them on a GPU.

A stream's ``query()`` and an event's ``query()`` answer True (the work is done: it
ran when issued) and, as on a GPU when they answer True, order the host after it.
"""
from __future__ import annotations

import itertools
import time
from typing import Callable, List, Optional

import torch


class ShimCuda:
    """The per-session classes and functions that stand in for ``torch.cuda``'s."""

    def __init__(self, tracker, real_is_available: Callable[[], bool],
                 real_lazy_init: Callable[[], None]):
        self.tracker = tracker
        self._handles = itertools.count(1)
        self._events = itertools.count(1)
        self._real_is_available = real_is_available
        self._real_lazy_init = real_lazy_init
        self.Stream = _stream_class(self)
        self.Event = _event_class(self)
        self.StreamContext = _context_class(self)
        self.default = self.Stream._with_handle(0)
        self.current = self.default

    # -- the functions of torch.cuda -----------------------------------------------------
    def functions(self) -> dict:
        """``name -> replacement`` for the patched ``torch.cuda`` attributes."""
        shim = self

        def current_stream(device=None):
            return shim.current

        def default_stream(device=None):
            return shim.default

        def set_stream(stream):
            if stream is not None:
                shim.current = stream

        def stream(stream):
            return shim.StreamContext(stream)

        def synchronize(device=None):
            shim.tracker.sync_device()

        def _lazy_init():
            # factories with device="cuda" reach the dispatcher (where the shim gives
            # them a CPU meaning) only once torch believes CUDA is initialized
            if shim._real_is_available():
                shim._real_lazy_init()

        return {"Stream": self.Stream, "Event": self.Event, "StreamContext": self.StreamContext,
                "current_stream": current_stream, "default_stream": default_stream,
                "set_stream": set_stream, "stream": stream, "synchronize": synchronize,
                "is_available": lambda: True, "device_count": lambda: 1,
                "current_device": lambda: 0, "_lazy_init": _lazy_init}

    def new_stream_handle(self) -> int:
        return next(self._handles)

    def new_event_handle(self) -> int:
        return next(self._events)


def _stream_class(shim: ShimCuda):
    class Stream:
        """``torch.cuda.Stream`` on the CPU shim: a context of the detector."""

        def __init__(self, device=None, priority=0, **kwargs):
            self.cuda_stream = shim.new_stream_handle()
            self.priority = priority
            self.device = torch.device("cuda", 0)
            shim.tracker.stream_created(self.cuda_stream)

        @classmethod
        def _with_handle(cls, handle: int) -> "Stream":
            s = cls.__new__(cls)
            s.cuda_stream, s.priority, s.device = handle, 0, torch.device("cuda", 0)
            shim.tracker.stream_created(handle)
            return s

        def wait_event(self, event) -> None:
            event.wait(self)

        def wait_stream(self, stream) -> None:
            self.wait_event(stream.record_event())

        def record_event(self, event=None):
            if event is None:
                event = shim.Event()
            event.record(self)
            return event

        def query(self) -> bool:
            shim.tracker.sync_stream(self.cuda_stream)
            return True

        def synchronize(self) -> None:
            shim.tracker.sync_stream(self.cuda_stream)

        def __eq__(self, other) -> bool:
            return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream

        def __hash__(self) -> int:
            return hash(("shim-stream", self.cuda_stream))

        def __repr__(self) -> str:
            return f"<torch.cuda.Stream (cpu shim) cuda_stream={self.cuda_stream}>"

    return Stream


def _event_class(shim: ShimCuda):
    class Event:
        """``torch.cuda.Event`` on the CPU shim. As in CUDA, the event exists from
        its first record: waiting on or synchronizing a never-recorded event does
        nothing."""

        def __init__(self, enable_timing=False, blocking=False, interprocess=False,
                     **kwargs):
            self.cuda_event = 0
            self._time: Optional[float] = None

        def record(self, stream=None) -> None:
            stream = shim.current if stream is None else stream
            if not self.cuda_event:
                self.cuda_event = shim.new_event_handle()
                shim.tracker.event_created(self.cuda_event)
            shim.tracker.record(self.cuda_event, stream.cuda_stream)
            self._time = time.perf_counter()

        def wait(self, stream=None) -> None:
            if self.cuda_event:
                stream = shim.current if stream is None else stream
                shim.tracker.wait(self.cuda_event, stream.cuda_stream)

        def query(self) -> bool:
            if self.cuda_event:
                shim.tracker.sync_event(self.cuda_event)
            return True

        def synchronize(self) -> None:
            if self.cuda_event:
                shim.tracker.sync_event(self.cuda_event)

        def elapsed_time(self, end_event) -> float:
            if self._time is None or end_event._time is None:
                raise RuntimeError("both events must be recorded before elapsed_time")
            return (end_event._time - self._time) * 1000.0

        def __repr__(self) -> str:
            return f"<torch.cuda.Event (cpu shim) {self.cuda_event}>"

    return Event


def _context_class(shim: ShimCuda):
    class StreamContext:
        """``with torch.cuda.stream(s):`` on the CPU shim."""

        def __init__(self, stream):
            self.stream = stream
            self._prev: List = []

        def __enter__(self):
            if self.stream is not None:
                self._prev.append(shim.current)
                shim.current = self.stream

        def __exit__(self, *exc):
            if self.stream is not None:
                shim.current = self._prev.pop()

    return StreamContext

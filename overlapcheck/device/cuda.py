"""The ``cuda`` backend: real ``torch.cuda`` streams, events, pinned memory and
non-blocking copies.

``launch`` runs the closure at once with ``s`` the current stream (``_on``, what
``torch.cuda.stream(s)`` does): the kernels it issues are queued on ``s``. With the
detector off a launch is nothing but that call.
With it on, the closure's accesses — its declaration (``access="declared"``) or what
the access inference mode intercepts (``"infer"``) — are checked with the clock the
stream work was enqueued under, exactly as on the sim, so the verdict does not depend
on GPU timing. With CUDA graphs (``graphs=True``) a model call replays captured
kernels no interception sees, so the detector then takes declarations only, and every
launch must declare (docs/design.md §4.9). Index ops count as whole-buffer accesses
(their indices live on the device); annotations narrow them, unchecked here (the sim
checks them).

A device buffer freed here is dropped from the runtime; when the caching allocator
hands the same block (same address) to a later tracked allocation, the detector sees
the same memory change owner and checks the reuse.
"""
from __future__ import annotations

from time import perf_counter
from typing import Callable, Dict

import torch

from ..race import OpInfo
from .api import Event, Runtime, Stream
from .buffers import DEVICE, PAGEABLE, PINNED, Buffer, poison_value

# torch's current stream read and set as the (id, device, type) triple it keeps, without
# the ``Stream`` object ``torch.cuda.current_stream`` builds per read. Private calls: a
# torch without them gets the public ones.
_GET_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)
_SET_STREAM = getattr(torch._C, "_cuda_setStream", None)


class CudaRuntime(Runtime):
    backend = "cuda"
    gpu = True

    def __init__(self, detect: bool = True, access: str = "infer", on_race: str = "collect",
                 graphs: bool = False):
        if not torch.cuda.is_available():
            raise RuntimeError("the cuda device needs a CUDA GPU and a CUDA build of torch")
        if graphs and detect and access != "declared":
            # a graph replay is one opaque call: the ops the inference mode intercepts
            # are its input copies and output clones, never the captured kernels
            raise ValueError("CUDA graphs hide their kernels from access inference: "
                             "with graphs the race detector needs declared accesses")
        super().__init__(detect=detect, access=access, on_race=on_race)
        self.graphs = graphs
        self._dev = torch.cuda.current_device()
        self._mem = 0
        self._freed: Dict[int, object] = {}  # data_ptr of a freed block -> its memory id

    # -- streams and events ------------------------------------------------------------
    def _on(self, raw):
        """Make ``raw`` the thread's current stream; returns the one to restore (with
        ``_off``). ``torch.cuda.stream(raw)`` does the same switch, but looks the device
        up several times per use, each lookup reading the process environment: about a
        fifth of the host's time per engine step in a CUDA-graphed decode (docs/design.md
        §8.1). The runtime's device is known, and the streams go as triples
        (``_GET_STREAM``)."""
        if _GET_STREAM is None or _SET_STREAM is None:
            prev = torch.cuda.current_stream(self._dev)
            torch.cuda.set_stream(raw)
            return prev
        prev = _GET_STREAM(self._dev)
        _SET_STREAM(stream_id=raw.stream_id, device_index=raw.device_index,
                    device_type=raw.device_type)
        return prev

    @staticmethod
    def _off(prev) -> None:
        """Restore the stream ``_on`` replaced."""
        if type(prev) is tuple:
            _SET_STREAM(stream_id=prev[0], device_index=prev[1], device_type=prev[2])
        else:
            torch.cuda.set_stream(prev)

    def _raw_stream(self, name):
        return torch.cuda.Stream()

    def _raw_event(self):
        return torch.cuda.Event()

    def _raw_record(self, event: Event, stream: Stream, clock) -> bool:
        event.raw.record(stream.raw)
        return True

    def _raw_wait(self, stream: Stream, event: Event, clock) -> None:
        stream.raw.wait_event(event.raw)

    def _raw_query(self, event: Event) -> bool:
        return event.raw.query()

    # the host's blocking calls, timed into ``wait_s``
    def _blocked(self, wait: Callable[[], None]) -> None:
        t = perf_counter()
        wait()
        self.wait_s += perf_counter() - t

    def _raw_sync_event(self, event: Event) -> None:
        self._blocked(event.raw.synchronize)

    def _raw_sync_stream(self, stream: Stream, why: str) -> None:
        self._blocked(stream.raw.synchronize)

    def _raw_sync_all(self) -> None:
        self._blocked(torch.cuda.synchronize)

    # -- buffers ---------------------------------------------------------------------
    def empty(self, shape, dtype, name: str, stream: Stream) -> Buffer:
        prev = self._on(stream.raw)
        try:
            t = torch.empty(tuple(shape), dtype=dtype, device="cuda")
            mem = self._freed.pop(t.untyped_storage().data_ptr(), None)
            fresh = mem is None
            if fresh:
                # fresh memory is poison-filled; a block the caching allocator hands back
                # stays stale, as on the sim. A fill there would also be wrong on a GPU:
                # a racing reader of the block (a planted race, or the engine's own) would
                # take the poison as an index, a device-side assert that ends the process
                t.fill_(poison_value(dtype))
                self._mem += 1
                mem = self._mem
        finally:
            self._off(prev)
        buf = self._register(Buffer(name, t, DEVICE, mem, self._next_serial(), stream))
        if fresh and self.det is not None:
            self._fill(buf, stream)   # the fill kernel on the allocating stream, as on the sim
        return buf

    def host_empty(self, shape, dtype, name: str, pinned: bool = True) -> Buffer:
        t = torch.full(tuple(shape), poison_value(dtype), dtype=dtype, pin_memory=pinned)
        self._mem += 1
        buf = self._register(Buffer(name, t, PINNED if pinned else PAGEABLE, self._mem,
                                    self._next_serial()))
        if self.det is not None:
            self._fill(buf)           # filled by the host, as on the sim
        return buf

    def free(self, buf: Buffer) -> None:
        self._unregister(buf, keep_lookup=False)
        if buf.space == DEVICE:
            self._freed[buf.t.untyped_storage().data_ptr()] = buf.mem
        buf.t = None  # the caching allocator may now reuse the block

    def graph_cache(self):
        if not self.graphs:
            return super().graph_cache()
        from .graphs import GraphCache
        return GraphCache([b.t for b in self._by_storage.values()
                           if b.space == DEVICE and not b.freed])

    def _raw_record_stream(self, buf, stream):
        if buf.space == DEVICE:
            buf.t.record_stream(stream.raw)

    # -- device work -------------------------------------------------------------------
    def _raw_launch(self, stream: Stream, fn, args, kwargs, info, declared, clock) -> None:
        """Run ``fn`` now on ``stream`` (``_on``): its kernels queue there.
        With graphs and the detector, a launch is fed by its declaration alone (the
        replayed kernels are invisible to interception), so it must have one."""
        if declared is None and self.graphs and self.det is not None:
            raise ValueError(f"launch '{info.name}' declares no accesses: with CUDA graphs "
                             f"the race detector sees a launch only through its declaration")
        prev = self._on(stream.raw)
        try:
            self._run_closure(fn, args, kwargs, declared, stream.ctx, clock, info)
        finally:
            self._off(prev)

    def _raw_copy(self, dst: Buffer, src: Buffer, stream: Stream, blocking: bool,
                  info: OpInfo, table: dict, clock) -> None:
        prev = self._on(stream.raw)
        t = perf_counter()
        try:
            dst.t.copy_(src.t, non_blocking=not blocking)
        finally:
            if blocking:      # the host waited for the stream to reach the copy
                self.wait_s += perf_counter() - t
            self._off(prev)
        if self.det is not None:
            self._feed(stream.ctx, clock, info, None, table)

    def _raw_to_host(self, buf: Buffer, stream: Stream, info: OpInfo, table: dict, clock):
        prev = self._on(stream.raw)
        t = perf_counter()
        try:
            out = buf.t.to("cpu")     # blocks until the stream reaches it
        finally:
            self.wait_s += perf_counter() - t
            self._off(prev)
        if self.det is not None:
            self._feed(stream.ctx, clock, info, None, table)
        return out

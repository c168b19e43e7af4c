"""The ``cuda`` backend: real ``torch.cuda`` streams, events, pinned memory and
non-blocking copies.

``launch`` runs the closure at once under ``torch.cuda.stream(s)``: the kernels it
issues are queued on ``s``. With the detector off a launch is nothing but that call.
With it on, the closure runs under the access inference mode and its accesses are
checked with the clock the stream work was enqueued under, exactly as on the sim, so
the verdict does not depend on GPU timing. Index ops count as whole-buffer accesses
(their indices live on the device); annotations narrow them, unchecked here (the sim
checks them).

A device buffer freed here is dropped from the runtime; when the caching allocator
hands the same block (same address) to a later tracked allocation, the detector sees
the same memory change owner and checks the reuse.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..race import OpInfo
from .api import Event, Runtime, Stream, check_space, user_frame
from .buffers import DEVICE, PAGEABLE, PINNED, Buffer, poison_value


class CudaRuntime(Runtime):
    backend = "cuda"
    exact_rows = False

    def __init__(self, detect: bool = True, access: str = "infer", on_race: str = "collect",
                 graphs: bool = False):
        if not torch.cuda.is_available():
            raise RuntimeError("the cuda device needs a CUDA GPU and a CUDA build of torch")
        if graphs and detect:
            raise ValueError("CUDA graphs hide their kernels' accesses from the race "
                             "detector: turn the detector off to use them")
        super().__init__(detect=detect, access=access, on_race=on_race)
        self.graphs = graphs
        self._mem = 0
        self._freed: Dict[int, object] = {}  # data_ptr of a freed block -> its memory id

    # -- streams and events ------------------------------------------------------------
    def _raw_stream(self, name):
        return torch.cuda.Stream()

    def _raw_event(self):
        return torch.cuda.Event()

    def _record(self, event: Event, stream: Stream) -> None:
        event.raw.record(stream.raw)
        event.last = True
        if self.det is not None:
            self.det.enqueue(stream.ctx)
            self.det.record(stream.ctx, event.id)

    def _wait_event(self, stream: Stream, event: Event) -> None:
        if event.last is None:
            return  # a wait on a never-recorded event is a no-op
        stream.raw.wait_event(event.raw)
        if self.det is not None:
            self.det.enqueue(stream.ctx)
            self.det.wait(stream.ctx, event.id)

    def _query(self, event: Event) -> bool:
        done = event.raw.query()
        if done and event.last is not None and self.det is not None:
            self.det.host_sync_event(event.id)
        return done

    def _sync_event(self, event: Event) -> None:
        self.syncs += 1
        event.raw.synchronize()
        if self.det is not None:
            self.det.host_sync_event(event.id)

    def _sync_stream(self, stream: Stream) -> None:
        self.syncs += 1
        stream.raw.synchronize()
        if self.det is not None:
            self.det.host_sync_stream(stream.ctx)

    def synchronize(self) -> None:
        self.syncs += 1
        torch.cuda.synchronize()
        if self.det is not None:
            self.det.host_sync_all()

    # -- buffers ---------------------------------------------------------------------
    def _mem_for(self, t: torch.Tensor) -> object:
        ptr = t.untyped_storage().data_ptr()
        mem = self._freed.pop(ptr, None)
        if mem is None:
            self._mem += 1
            mem = self._mem
        return mem

    def empty(self, shape, dtype, name: str, stream: Stream) -> Buffer:
        with torch.cuda.stream(stream.raw):
            t = torch.empty(tuple(shape), dtype=dtype, device="cuda")
            t.fill_(poison_value(dtype))
        # The poison fill is part of the allocation, as on the sim: not an access.
        return self._register(Buffer(name, t, DEVICE, self._mem_for(t), self._next_serial(),
                                     stream))

    def host_empty(self, shape, dtype, name: str, pinned: bool = True) -> Buffer:
        t = torch.full(tuple(shape), poison_value(dtype), dtype=dtype, pin_memory=pinned)
        self._mem += 1
        return self._register(Buffer(name, t, PINNED if pinned else PAGEABLE, self._mem,
                                     self._next_serial()))

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
    def launch(self, stream: Stream, fn, *args, name: Optional[str] = None, reads=None,
               writes=None, **kwargs) -> None:
        self.launches += 1
        if self.det is None:
            with torch.cuda.stream(stream.raw):
                fn(*args, **kwargs)
            return
        clock = self.det.enqueue(stream.ctx)
        info = OpInfo(name or getattr(fn, "__name__", "kernel"), user_frame())
        with torch.cuda.stream(stream.raw):
            self._run_closure(fn, args, kwargs, info.name, self._declared(reads, writes),
                              stream.ctx, clock, info)

    def copy(self, dst: Buffer, src: Buffer, stream: Stream, non_blocking: bool = False,
             name: Optional[str] = None) -> None:
        if dst.space != DEVICE and src.space != DEVICE:
            raise ValueError("copy between two host buffers: use host_write")
        host = dst if dst.space != DEVICE else (src if src.space != DEVICE else None)
        blocking = host is not None and not (non_blocking and host.space == PINNED)
        with torch.cuda.stream(stream.raw):
            dst.t.copy_(src.t, non_blocking=not blocking)
        if self.det is not None:
            clock = self.det.enqueue(stream.ctx)
            info = OpInfo(name or f"copy {src.name}->{dst.name}", user_frame(), is_copy=True)
            if src.mem == dst.mem:
                table = {src.mem: [src, None, None]}
            else:
                table = {src.mem: [src, None, frozenset()], dst.mem: [dst, frozenset(), None]}
            self._feed(stream.ctx, clock, info, None, table)
        if blocking:
            self.syncs += 1
            stream.raw.synchronize()
            if self.det is not None:
                self.det.host_sync_stream(stream.ctx)

    # -- host accessors ----------------------------------------------------------------
    def to_host(self, buf: Buffer, stream: Stream) -> torch.Tensor:
        check_space(buf, (DEVICE,), "to_host")
        self.syncs += 1
        with torch.cuda.stream(stream.raw):
            out = buf.t.to("cpu")
        stream.raw.synchronize()
        if self.det is not None:
            clock = self.det.enqueue(stream.ctx)
            info = OpInfo(f"to_host {buf.name}", user_frame(), is_copy=True)
            self._feed(stream.ctx, clock, info, None, {buf.mem: [buf, None, frozenset()]})
            self.det.host_sync_stream(stream.ctx)
        return out

    def host_view(self, buf: Buffer, rows=None) -> torch.Tensor:
        """The host reads a pinned or pageable buffer as it is now (a copy)."""
        return self._read_rows(buf, self._host_rows(buf, rows, False, "host_view"))

    def host_write(self, buf: Buffer, values, rows=None) -> None:
        """The host writes a pinned or pageable buffer (all of it, or ``rows``)."""
        self._host_rows(buf, rows, True, "host_write")
        self._write_rows(buf, values, rows)

"""The GPU backend of ``watch``: PyTorch's GPU trace callbacks feed the tracker.

``torch.cuda._gpu_trace`` is the mechanism PyTorch's own CUDA sanitizer subscribes
to: once ``torch._C._activate_gpu_trace()`` has run, PyTorch calls the registered
callbacks on event creation, record, wait and deletion, caching-allocator
allocations and frees, and device, stream and event synchronizations. The callbacks
get raw handles (``cudaStream_t``, ``cudaEvent_t`` and block addresses as ints), which
are what the tracker keys on. Stream creation is not followed: PyTorch reports its
whole pool of streams when the first one is handed out, so a stream becomes a
context when it is first used.

What the callbacks do not cover is patched for the duration of the context:

* ``Event.query()`` and ``Stream.query()`` answering True (the host has observed the
  work finished, so it is ordered after it);
* ``Tensor.record_stream`` (the stream handle is needed; the op itself reaches the
  dispatcher with a generic stream).

The trace stays activated after the context (PyTorch has no way to turn it off); the
callbacks are removed from PyTorch's registries on leaving.
"""
from __future__ import annotations

import threading
from typing import List, Optional, Tuple

import torch
import torch.cuda._gpu_trace as gpu_trace

from .mode import host_key


class GpuBackend:
    name = "cuda"

    def __init__(self, tracker):
        self.tr = tracker
        self._registered: List[Tuple[object, object]] = []
        self.thread = threading.get_ident()  # the watched host thread

    # -- what the dispatch mode asks ------------------------------------------------------
    def current_stream(self) -> int:
        return torch.cuda.current_stream().cuda_stream

    def device_key(self, t) -> Optional[int]:
        return host_key(t) if t.is_cuda else None

    def is_pinned(self, t) -> bool:
        return bool(t.is_pinned())

    def prepare(self, plan, args, kwargs):
        dev = kwargs.get("device")
        target = None if dev is None else torch.device(dev).type
        return args, kwargs, target, False

    def new_output(self, o, target, sid) -> Optional[int]:
        return host_key(o) if o.is_cuda else None

    def pinned_outputs(self, outs) -> None:
        pass  # pinned memory is real here

    # -- the trace callbacks ------------------------------------------------------------------
    def _on_alloc(self, ptr: int) -> None:
        self.tr.device_alloc(ptr, self.current_stream())

    def _host_sync(self, handler):
        """A synchronization orders the thread that waited: only the watched one."""
        def on_sync(*args):
            if threading.get_ident() == self.thread:
                handler(*args)
        return on_sync

    def callbacks(self):
        tr = self.tr
        return (
            (gpu_trace.EventCreationCallbacks, tr.event_created),
            (gpu_trace.EventDeletionCallbacks, tr.event_deleted),
            (gpu_trace.EventRecordCallbacks, tr.record),
            (gpu_trace.EventWaitCallbacks, tr.wait),
            (gpu_trace.MemoryAllocationCallbacks, self._on_alloc),
            (gpu_trace.MemoryDeallocationCallbacks, tr.device_free),
            (gpu_trace.DeviceSynchronizationCallbacks, self._host_sync(tr.sync_device)),
            (gpu_trace.StreamSynchronizationCallbacks, self._host_sync(tr.sync_stream)),
            (gpu_trace.EventSynchronizationCallbacks, self._host_sync(tr.sync_event)),
        )

    # -- install / uninstall -------------------------------------------------------------------
    def install(self, patcher) -> None:
        torch._C._activate_gpu_trace()
        for registry, cb in self.callbacks():
            registry.add_callback(cb)
            self._registered.append((registry, cb))
        tr = self.tr

        watched = self.thread

        def event_query(self):
            done = orig_event_query(self)
            if done and self.cuda_event and threading.get_ident() == watched:
                tr.sync_event(self.cuda_event)
            return done

        def stream_query(self):
            done = orig_stream_query(self)
            if done and threading.get_ident() == watched:
                tr.sync_stream(self.cuda_stream)
            return done

        def record_stream(t, stream):
            if t.is_cuda:
                s = stream if hasattr(stream, "cuda_stream") else torch.cuda.Stream(
                    stream_id=stream.stream_id, device_index=stream.device_index,
                    device_type=stream.device_type)
                tr.record_stream(tr.device_unit(host_key(t), t), s.cuda_stream)
            return orig_record_stream(t, stream)

        orig_event_query = patcher.set(torch.cuda.Event, "query", event_query)
        orig_stream_query = patcher.set(torch.cuda.Stream, "query", stream_query)
        orig_record_stream = patcher.set(torch.Tensor, "record_stream", record_stream)

    def uninstall(self) -> None:
        for registry, cb in self._registered:
            try:
                registry.callback_list.remove(cb)
            except ValueError:
                pass
        self._registered.clear()

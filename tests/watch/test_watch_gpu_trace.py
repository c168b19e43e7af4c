"""The GPU backend's glue to PyTorch's GPU trace callbacks, checked on the CPU by
firing the callback registries by hand with the arguments PyTorch passes them
(``torch.cuda._gpu_trace``: ``(event, stream)`` for record and wait)."""
import torch
import torch.cuda._gpu_trace as gpu_trace

from overlapcheck.race import HOST
from overlapcheck.race.clocks import get
from overlapcheck.watch.gpu import GpuBackend
from overlapcheck.watch.patching import Patcher
from overlapcheck.watch.tracker import Tracker

FWD, COPY, EVENT = 0x1111, 0x2222, 0x7777


def _installed():
    tracker = Tracker(on_report=lambda *a: None)
    backend = GpuBackend(tracker)
    patcher = Patcher()
    backend.install(patcher)
    return tracker, backend, patcher


def _fire(registry, *args):
    registry.fire_callbacks(*args)


def test_callbacks_feed_the_tracker_and_are_removed_on_uninstall():
    before = [list(r.callback_list) for r in (gpu_trace.EventRecordCallbacks,
                                              gpu_trace.StreamSynchronizationCallbacks)]
    tracker, backend, patcher = _installed()
    try:
        _fire(gpu_trace.StreamCreationCallbacks, 0x3333)  # PyTorch's pool: not followed
        assert 0x3333 not in tracker.stream_ctx
        fwd, copy = tracker.ctx(FWD), tracker.ctx(COPY)  # contexts from first use
        _, work = tracker.enqueue(FWD)  # forward work, then an event recorded after it
        _fire(gpu_trace.EventCreationCallbacks, EVENT)
        _fire(gpu_trace.EventRecordCallbacks, EVENT, FWD)
        assert get(tracker.det.clock(copy), fwd) < get(work, fwd)
        _fire(gpu_trace.EventWaitCallbacks, EVENT, COPY)
        # the copy stream waited for the forward work, the host did not
        assert get(tracker.det.clock(copy), fwd) >= get(work, fwd)
        assert get(tracker.det.clock(HOST), copy) == 0
        _fire(gpu_trace.StreamSynchronizationCallbacks, COPY)
        # once the host synchronizes the copy stream, it is after the forward work too
        assert get(tracker.det.clock(HOST), fwd) >= get(work, fwd)
        _fire(gpu_trace.EventDeletionCallbacks, EVENT)
        _fire(gpu_trace.EventCreationCallbacks, EVENT)  # the handle reused: a new event
        _, later = tracker.enqueue(FWD)
        _fire(gpu_trace.EventWaitCallbacks, EVENT, COPY)  # never recorded: a no-op
        assert get(tracker.det.clock(copy), fwd) < get(later, fwd)
        _fire(gpu_trace.DeviceSynchronizationCallbacks)
        assert get(tracker.det.clock(HOST), fwd) >= get(later, fwd)
    finally:
        backend.uninstall()
        patcher.restore()
    after = [list(r.callback_list) for r in (gpu_trace.EventRecordCallbacks,
                                             gpu_trace.StreamSynchronizationCallbacks)]
    assert after == before


def test_allocation_callbacks_make_owners_of_blocks():
    tracker, backend, patcher = _installed()
    backend.current_stream = lambda: FWD  # what torch.cuda.current_stream() says on a GPU
    try:
        _fire(gpu_trace.MemoryAllocationCallbacks, 0x9000)
        first = tracker.units[0x9000].serial
        _fire(gpu_trace.MemoryDeallocationCallbacks, 0x9000)
        _fire(gpu_trace.MemoryAllocationCallbacks, 0x9000)
        unit = tracker.units[0x9000]
        assert unit.serial != first and unit.stream == FWD
        assert unit.prev_free_site and unit.prev_free_site != "?"
    finally:
        backend.uninstall()
        patcher.restore()
    assert torch.cuda.Event.query.__qualname__ == "Event.query"

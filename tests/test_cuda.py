"""The cuda backend on a real GPU: the detector's verdicts match the sim's."""
import pytest
import torch

from overlapcheck.device import is_poison, make_runtime

pytestmark = pytest.mark.gpu


def _rt(detect=True):
    rt = make_runtime("cuda", detect=detect)
    return rt, rt.new_stream("schedule"), rt.new_stream("forward"), rt.new_stream("copy")


def test_fresh_buffers_are_poison_on_gpu():
    rt, s, f, c = _rt()
    a = rt.empty((4,), torch.float32, "a", s)
    s.synchronize()
    assert is_poison(a.t.cpu()).all()
    assert is_poison(rt.host_view(rt.host_empty((4,), torch.int64, "p"))).all()


def test_a_reused_block_is_stale_not_filled_again_on_gpu():
    """As on the sim: the caching allocator's block comes back with its last owner's
    values (a racing reader of it then reads indices it can take, not poison)."""
    rt, s, f, c = _rt(detect=False)
    a = rt.empty((256,), torch.int64, "a", s)
    rt.launch(s, lambda t: t.fill_(7), a.t, name="write")
    ptr = a.t.untyped_storage().data_ptr()
    rt.free(a)
    b = rt.empty((256,), torch.int64, "b", s)
    assert b.t.untyped_storage().data_ptr() == ptr and b.mem == a.mem
    s.synchronize()
    assert (b.t.cpu() == 7).all()
    fresh = rt.empty((256,), torch.int64, "fresh", s)     # a new block: poison
    s.synchronize()
    assert is_poison(fresh.t.cpu()).all()


def test_pinned_read_before_copy_done_is_flagged_and_twin_is_not():
    for sync in (False, True):
        rt, s, f, c = _rt()
        fut = rt.empty((8,), torch.int64, "future", f)
        pin = rt.host_empty((8,), torch.int64, "accept_pinned")
        done = rt.new_event("copy_done")
        rt.launch(f, lambda t: t.fill_(3), fut.t, name="stash")
        c.wait_stream(f)
        rt.copy(pin, fut, c, non_blocking=True)
        done.record(c)
        if sync:
            done.synchronize()
        rt.host_view(pin)
        rt.synchronize()
        assert bool(rt.reports) == (not sync), [str(r) for r in rt.reports]


def test_stream_stream_race_and_event_twin():
    for ordered in (False, True):
        rt, s, f, c = _rt()
        kv = rt.empty((16, 4), torch.float32, "kv", s)   # its poison fill ordered before the write
        e = rt.new_event("written")
        rt.launch(s, lambda t: t.fill_(1.0), kv.t, name="write")
        e.record(s)
        if ordered:
            f.wait_event(e)
        rt.launch(f, lambda t: t.sum(), kv.t, name="read")
        rt.synchronize()
        assert bool(rt.reports) == (not ordered)


def test_recycled_storage_without_record_stream_is_a_reuse_race():
    for pledge in (False, True):
        rt, s, f, c = _rt()
        idx = rt.empty((1 << 16,), torch.int64, "idx", s)
        rt.launch(s, lambda t: t.fill_(1), idx.t, name="fill_idx")
        f.wait_stream(s)
        rt.launch(f, lambda t: t.sum(), idx.t, name="forward_reads_idx")
        if pledge:
            rt.record_stream(idx, f)
        rt.free(idx)
        if pledge:
            torch.cuda.current_stream().synchronize()
            f.synchronize()
        new = rt.empty((1 << 16,), torch.int64, "idx_next", s)
        rt.launch(s, lambda t: t.fill_(2), new.t, name="fill_next")
        rt.synchronize()
        kinds = [r.kind for r in rt.reports]
        if pledge:
            assert not kinds
        elif new.mem == idx.mem:   # the caching allocator handed back the same block
            assert kinds == ["reuse"]


def test_detector_off_adds_no_reports():
    rt, s, f, c = _rt(detect=False)
    a = rt.empty((4,), torch.float32, "a", s)
    rt.launch(s, lambda t: t.fill_(1.0), a.t)
    rt.launch(f, lambda t: t.fill_(2.0), a.t)
    rt.synchronize()
    assert rt.reports == []


def test_wait_s_counts_the_host_blocked_in_device_waits():
    """``rt.wait_s`` (the GPU bench's host time less waits): every blocking call adds the
    time the host spent in it; launches add none."""
    rt, s, f, c = _rt(detect=False)
    spin = 100_000_000     # cycles: 50 ms at 2 GHz, longer at a lower clock
    rt.launch(f, lambda: torch.cuda._sleep(spin), name="busy")
    assert rt.wait_s == 0.0
    ev = rt.new_event("done")
    ev.record(f)
    ev.synchronize()
    after_event = rt.wait_s
    assert after_event >= 0.02, after_event     # the host waited for most of the kernel
    buf = rt.empty((4,), torch.int64, "x", f)
    rt.launch(f, lambda: torch.cuda._sleep(spin), name="busy2")
    rt.to_host(buf, f)
    assert rt.wait_s - after_event >= 0.02, rt.wait_s
    for wait in (f.synchronize, rt.synchronize):
        before = rt.wait_s
        rt.launch(f, lambda: torch.cuda._sleep(spin), name="busy3")
        wait()
        assert rt.wait_s - before >= 0.02, (wait, rt.wait_s - before)


def test_launches_run_on_their_stream_and_restore_the_callers_with_either_stream_api(monkeypatch):
    """The runtime switches streams through torch's private (id, device, type) calls, and
    through the public ones on a torch without them: the same streams either way."""
    from overlapcheck.device import cuda as C
    from overlapcheck.device import graphs as G
    from overlapcheck.device.graphs import _stream_key
    dev = torch.cuda.current_device()
    for private in (True, False):
        if not private:
            monkeypatch.setattr(C, "_GET_STREAM", None)
            monkeypatch.setattr(C, "_SET_STREAM", None)
            monkeypatch.setattr(G, "_GET_STREAM", None)
        rt, s, f, c = _rt(detect=False)
        before, seen = torch.cuda.current_stream(), []
        rt.launch(f, lambda: seen.append(torch.cuda.current_stream()), name="where")
        buf = rt.empty((4,), torch.int64, "x", c)
        assert seen == [f.raw] and torch.cuda.current_stream() == before, private
        with torch.cuda.stream(f.raw):
            assert _stream_key(dev) == _stream_key() == ("stream", f.raw.stream_id), private
        assert _stream_key(dev) == ("stream", before.stream_id), private
        rt.free(buf)


def test_a_fresh_allocation_fill_is_an_access_on_gpu():
    """The poison fill runs on the allocating stream: a zeroing on another stream is a
    stream-stream race unless that stream waits for the allocating one (as on the sim)."""
    from overlapcheck.device.api import is_fill
    for wait in (False, True):
        rt, s, f, c = _rt()
        table = rt.empty((4, 8), torch.int64, "req_to_token", f)
        if wait:
            s.wait_stream(f)
        rt.launch(s, torch.Tensor.zero_, table.t, name="zero_table", writes=[table])
        rt.synchronize()
        fills = [r for r in rt.reports if is_fill(r.previous.op) or is_fill(r.current.op)]
        assert bool(fills) == (not wait), [str(r) for r in rt.reports]


def test_the_audit_reports_a_narrow_declaration_on_gpu():
    """On cuda index rows hide on the device: a buffer left out of a declaration is
    still reported."""
    rt = make_runtime("cuda", access="audit")
    f = rt.new_stream("forward")
    a = rt.empty((4,), torch.int64, "a", f)
    b = rt.empty((4,), torch.int64, "b", f)
    rt.launch(f, lambda x, y: y.copy_(x), a.t, b.t, name="copy_ab", writes=[b])
    rt.synchronize()
    assert [(r.op, r.buffer) for r in rt.reports if r.kind == "undeclared-access"] == [
        ("copy_ab", "a")]

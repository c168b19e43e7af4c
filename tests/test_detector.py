"""The detector core on plain events: each clock rule, each report kind, and clean
twins that must stay quiet."""
from overlapcheck.race import HOST, Detector, OpInfo
from overlapcheck.race import report as R

OP = OpInfo("op", "test:1")


def _two_streams():
    d = Detector()
    a, b = d.add_context("a"), d.add_context("b")
    d.alloc("buf", "buf", "buf#1")
    return d, a, b


def test_unordered_writes_on_two_streams_race():
    d, a, b = _two_streams()
    rep = d.access(a, "buf", True, None, OP, d.enqueue(a))
    assert rep is None
    rep = d.access(b, "buf", True, None, OP, d.enqueue(b))
    assert rep is not None and rep.kind == R.STREAM_STREAM
    assert "a" in str(rep) and "b" in str(rep)


def test_event_record_wait_orders():
    d, a, b = _two_streams()
    d.access(a, "buf", True, None, OP, d.enqueue(a))
    d.enqueue(a)
    d.record(a, "e")
    d.enqueue(b)
    d.wait(b, "e")
    assert d.access(b, "buf", False, None, OP, d.enqueue(b)) is None


def test_wait_on_never_recorded_event_is_noop():
    d, a, b = _two_streams()
    d.access(a, "buf", True, None, OP, d.enqueue(a))
    d.wait(b, "never")
    assert d.access(b, "buf", False, None, OP, d.enqueue(b)) is not None


def test_wait_binds_to_latest_record_at_wait_time():
    d, a, b = _two_streams()
    d.enqueue(a)
    d.record(a, "e")          # record #1, before the write
    d.enqueue(b)
    d.wait(b, "e")            # binds to record #1
    d.access(a, "buf", True, None, OP, d.enqueue(a))
    d.enqueue(a)
    d.record(a, "e")          # record #2, after the wait: does not order b
    assert d.access(b, "buf", False, None, OP, d.enqueue(b)) is not None


def test_host_read_of_copy_target_needs_sync():
    d, a, _ = _two_streams()
    d.access(a, "buf", True, None, OpInfo("copy", "t:1", is_copy=True), d.enqueue(a))
    rep = d.access(HOST, "buf", False, None, OP)
    assert rep is not None and rep.kind == R.HOST_READ_BEFORE_COPY


def test_host_sync_orders_host_after_stream():
    d, a, _ = _two_streams()
    d.access(a, "buf", True, None, OpInfo("copy", "t:1", is_copy=True), d.enqueue(a))
    d.host_sync_stream(a)
    assert d.access(HOST, "buf", False, None, OP) is None


def test_host_write_during_copy():
    d, a, _ = _two_streams()
    d.access(HOST, "buf", True, None, OP)
    d.access(a, "buf", False, None, OpInfo("h2d", "t:1", is_copy=True), d.enqueue(a))
    rep = d.access(HOST, "buf", True, None, OP)
    assert rep is not None and rep.kind == R.HOST_WRITE_DURING_COPY


def test_host_access_before_launch_is_ordered():
    d, a, _ = _two_streams()
    d.access(HOST, "buf", True, None, OP)
    assert d.access(a, "buf", False, None, OP, d.enqueue(a)) is None


def test_disjoint_rows_do_not_race():
    d, a, b = _two_streams()
    d.access(a, "buf", True, frozenset({0, 1}), OP, d.enqueue(a))
    assert d.access(b, "buf", True, frozenset({2}), OP, d.enqueue(b)) is None
    assert d.access(b, "buf", True, frozenset({1, 2}), OP, d.enqueue(b)) is not None


def test_stream_work_checked_late_uses_its_enqueue_clock():
    """The sim checks stream work when it retires; the order of checks must not
    matter: a read enqueued after a sync is ordered even if checked first."""
    d, a, b = _two_streams()
    ca = d.enqueue(a)           # write on a, enqueued first
    d.host_sync_stream(a)
    cb = d.enqueue(b)           # read on b, enqueued after the host synced a
    assert d.access(b, "buf", False, None, OP, cb) is None   # checked first
    assert d.access(a, "buf", True, None, OP, ca) is None    # ordered before b's read


def test_reuse_across_owners_is_reported_as_reuse():
    d, a, b = _two_streams()
    d.access(b, "buf", False, None, OP, d.enqueue(b))   # old owner reads on b
    d.free("buf")
    d.alloc("buf", "buf", "buf#2")
    rep = d.access(a, "buf", True, None, OP, d.enqueue(a))
    assert rep is not None and rep.kind == R.REUSE
    assert "buf#1" in str(rep) and "buf#2" in str(rep)


def test_reuse_with_pledged_stream_is_ordered():
    d, a, b = _two_streams()
    d.access(b, "buf", False, None, OP, d.enqueue(b))
    d.free("buf", pledged=[b])
    d.alloc("buf", "buf", "buf#2")
    assert d.access(a, "buf", True, None, OP, d.enqueue(a)) is None


def test_row_owner_is_taken_at_issue_time():
    """A transfer after a launch does not relabel that launch's accesses."""
    d, a, b = _two_streams()
    d.transfer("buf", [3], "req1")
    cb = d.enqueue(b)                 # forward of req1's batch, issued now
    d.transfer("buf", [3], None)
    d.transfer("buf", [3], "req2")
    ca = d.enqueue(a)                 # schedule stream writes req2's row
    d.access(a, "buf", True, frozenset({3}), OP, ca)
    rep = d.access(b, "buf", False, frozenset({3}), OP, cb)   # checked later
    assert rep is not None and rep.kind == R.REUSE
    assert rep.previous.owner == "req2" and rep.current.owner == "req1"


def test_same_stream_reuse_is_ordered():
    d, a, _ = _two_streams()
    d.transfer("buf", [0], "req1")
    d.access(a, "buf", False, frozenset({0}), OP, d.enqueue(a))
    d.transfer("buf", [0], "req2")
    assert d.access(a, "buf", True, frozenset({0}), OP, d.enqueue(a)) is None


def test_records_stay_bounded_on_a_long_ordered_run():
    d, a, b = _two_streams()
    for _ in range(1000):
        d.access(a, "buf", True, None, OP, d.enqueue(a))
        d.enqueue(a)
        d.record(a, "e")
        d.enqueue(b)
        d.wait(b, "e")
        d.access(b, "buf", False, None, OP, d.enqueue(b))
        d.enqueue(b)
        d.record(b, "f")
        d.enqueue(a)
        d.wait(a, "f")
    assert not d.reports
    assert len(d.mem["buf"].records) <= 2

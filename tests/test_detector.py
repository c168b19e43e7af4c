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


def _random_program(rng, n_ops=60):
    """A random op sequence over three streams and the host: enqueues, records, waits,
    host syncs, and ops of one to four accesses to three memory units."""
    prog = []
    for _ in range(n_ops):
        kind = rng.choice(("op", "op", "op", "record", "wait", "sync", "free"))
        ctx = rng.choice((1, 2, 3))
        if kind == "op":
            accs = []
            for _ in range(rng.randint(1, 4)):
                rows = (None if rng.random() < 0.3
                        else frozenset(rng.sample(range(6), rng.randint(0, 3))))
                accs.append((rng.choice(("m0", "m1", "m2")), rng.random() < 0.5, rows))
            prog.append(("op", ctx, accs))
        else:
            prog.append((kind, ctx, rng.choice(("e0", "e1"))))
    return prog


def _replay(prog, batched: bool, stop: bool):
    d = Detector()
    for name in ("a", "b", "c"):
        d.add_context(name)
    for m in ("m0", "m1", "m2"):
        d.alloc(m, m, m + "#1")
    for i, (kind, ctx, arg) in enumerate(prog):
        if kind == "op":
            op, clock = OpInfo(f"op{i}", f"t:{i}"), d.enqueue(ctx)
            if batched:
                d.access_all(ctx, clock, op, arg, stop)
            else:
                for mem, write, rows in arg:
                    if d.access(ctx, mem, write, rows, op, clock) is not None and stop:
                        break
        elif kind == "record":
            d.enqueue(ctx)
            d.record(ctx, arg)
        elif kind == "wait":
            d.enqueue(ctx)
            d.wait(ctx, arg)
        elif kind == "sync":
            d.host_sync_stream(ctx)
        else:
            d.free(arg.replace("e", "m"), [ctx])
            d.alloc(arg.replace("e", "m"), "m", f"{arg}#{i}")
    recs = {m: [(r[0], r[1], r[3], r[4], r[5].name) for r in d.mem[m].records]
            for m in ("m0", "m1", "m2")}
    return [str(r) for r in d.reports], recs, d.accesses


def test_access_all_is_each_access_in_turn():
    """A launch's accesses checked in one ``access_all`` call give the reports, records
    and access count of one ``access`` call each, in order; with ``stop`` both stop at
    the op's first race (the runtime raising on it), leaving the op's later accesses
    unrecorded."""
    import random
    rng = random.Random(7)
    raced = stopped = 0
    for _ in range(300):
        prog = _random_program(rng)
        for stop in (False, True):
            each, batched = _replay(prog, False, stop), _replay(prog, True, stop)
            assert batched == each
            raced += bool(each[0])
        stopped += _replay(prog, True, True)[2] < _replay(prog, True, False)[2]
    assert raced > 100 and stopped > 20     # races found, and some ops cut short


def test_access_all_returns_the_first_or_the_last_race():
    d, a, b = _two_streams()
    d.alloc("other", "other", "other#1")
    d.access(a, "buf", True, None, OP, d.enqueue(a))
    d.access(a, "other", True, None, OP, d.enqueue(a))
    clock = d.enqueue(b)
    first = d.access_all(b, clock, OP, (("buf", True, None), ("other", True, None)), True)
    assert first is not None and first.buffer == "buf" and len(d.reports) == 1
    assert d.accesses == 3      # the second access of the op was not checked
    last = d.access_all(b, d.enqueue(b), OP, (("buf", True, None), ("other", True, None)),
                        False)
    assert last is not None and last.buffer == "other" and len(d.reports) == 3

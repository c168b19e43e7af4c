"""What keeps a step's cost independent of the run's length and the pool's size, and the
run's memory bounded: snapshots computed as read (and before the state they describe
changes), ``Snapshot.live``, detector records pruned with no verdict changing, and the
sim's allocator reusing blocks once their pledged streams are known done."""
import dataclasses

import pytest

from overlapcheck.device import api
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.protocol.workload import Workload
from overlapcheck.run import Case, ScheduleSpec, execute

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = EngineConfig(row_width=48, pool_tokens=160, max_running=4)


def _wl(n=10, seed=2):
    return generate(seed, n, CFG, max_prompt=12, max_new=16)


class Keep:
    """A run log that keeps every snapshot, and what each read as at its step."""

    def __init__(self):
        self.snaps, self.seen = [], []

    def event(self, ev):
        if isinstance(ev, E.StepEnd):
            s = ev.snapshot
            self.snaps.append(s)
            self.seen.append((tuple(s.ledger), tuple(s.pending_slots), tuple(s.requests)))

    def violation(self, v):
        pass

    def end(self, *a):
        pass


def test_snapshots_read_later_show_their_own_step():
    keep = Keep()
    execute(Case(CFG, _wl(), ScheduleSpec("random", 3)), log=keep)
    assert len(keep.snaps) > 10
    for s, (ledger, pending, reqs) in zip(keep.snaps, keep.seen):
        assert s.ledger == ledger and s.pending_slots == pending and s.requests == reqs
        assert s.pending == len(pending) and s.owned + s.pending == len(ledger)


def test_live_holds_every_request_whose_state_can_change():
    keep = Keep()
    execute(Case(CFG, _wl(), ScheduleSpec("random", 4)), log=keep)
    before = {}
    for s in keep.snaps:
        live = {r.rid: r for r in s.live}
        assert [r.rid for r in s.live] == sorted(live)
        for r in s.requests:
            if r.rid not in live:        # settled or parked earlier: unchanged since
                assert r.state in ("finished", "aborted", "waiting") and not r.inflight
                assert r.state != "waiting" or (r.row is None and r.allocated == 0)
                assert before[r.rid] == r
            else:
                assert live[r.rid] == r
        before = {r.rid: r for r in s.requests}


def test_queued_requests_leave_the_snapshot_delta_until_they_leave_the_queue():
    """Every request arriving at step 0: the waiting ones are reported once, then parked
    (a step's snapshot costs what can change, not the queue's length), and each comes
    back the step it is admitted or torn down; every snapshot still reads every request."""
    keep = Keep()
    wl = _wl(n=60, seed=5)
    wl = Workload(tuple(dataclasses.replace(r, arrival=0) for r in wl.requests), wl.aborts)
    execute(Case(CFG, wl, ScheduleSpec("random", 4)), log=keep)
    assert max(len(s.live) for s in keep.snaps[2:]) <= 2 * CFG.max_running + 4
    states = {}
    for s, (_, _, reqs) in zip(keep.snaps, keep.seen):
        assert len(reqs) == 60 and reqs == s.requests
        for r in s.live:
            states.setdefault(r.rid, []).append(r.state)
    for rid, seen in states.items():   # every change of state is in the delta, in order
        assert seen[-1] in ("finished", "aborted"), (rid, seen)


@pytest.mark.parametrize("fault", ["no-war-barrier", "index-no-record-stream",
                                   "war-before-extend", "no-copy-done-wait"])
def test_pruning_detector_records_changes_no_verdict(fault, monkeypatch):
    case = Case(CFG, _wl(8, 5), ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),)),
                faults=(fault,))
    never = execute(case)
    monkeypatch.setattr(api, "_PRUNE_EVERY", 4)
    often = execute(case)
    assert [str(r) for r in often.races] == [str(r) for r in never.races]
    assert [f.key for f in often.findings] == [f.key for f in never.findings]
    assert often.digest == never.digest


def test_a_long_run_reuses_its_blocks_and_prunes_its_records():
    wl = _wl(120, 7)
    wl = Workload(tuple(dataclasses.replace(r, arrival=2 * r.rid) for r in wl.requests), ())
    out = execute(Case(CFG, wl, ScheduleSpec("stalls")), trace=False)
    assert out.status == "completed" and out.steps > 200
    assert sum(len(blocks) for blocks in out.rt._pool.values()) < 20
    assert max(len(m.records) for m in out.rt.det.mem.values()) < 40

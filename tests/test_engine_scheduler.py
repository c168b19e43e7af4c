"""The scheduler alone (``overlapcheck/engine/scheduler.py``), on plain Python: FCFS
admission bounded by the running cap, free rows and free KV; chunked prefill; the
decode reserve rules; retraction of the newest admitted request under memory
pressure. Its memory (``accounting.Memory``) is real; the device side is a recorder of
ownership transfers, which is all the scheduler asks of it."""
from overlapcheck.engine import EngineConfig
from overlapcheck.engine.accounting import Memory
from overlapcheck.engine.scheduler import Scheduler
from overlapcheck.engine.types import Request
from overlapcheck.protocol import events as E
from overlapcheck.protocol.types import DECODE, PREFILL, RUNNING, WAITING, RequestSpec


class Transfers:
    """The device state as the scheduler's memory sees it: ownership changes only."""

    def __init__(self):
        self.rows, self.slots = [], []

    def transfer_row(self, row, owner):
        self.rows.append((row, owner))

    def transfer_slots(self, slots, owner):
        self.slots.append((tuple(slots), owner))


def scheduler(**kw):
    cfg = EngineConfig(**{"pool_tokens": 256, "row_width": 64, "max_running": 4,
                          "chunk_size": 32, **kw})
    events, requests = [], {}
    mem = Memory(cfg, Transfers(), events.append)
    return Scheduler(cfg, mem, requests, events.append), requests, events


def arrive(s, requests, rid, arrival=0, prompt_len=4):
    r = requests[rid] = Request(RequestSpec(rid, arrival, tuple(range(prompt_len)), 8))
    s.enqueue(r)
    return r


def finish_prefill(s, requests, batch):
    """What result processing does for a prefill batch: the entries leave it."""
    for e in batch.entries:
        requests[e.rid].inflight.remove(batch.bid)


def test_admission_is_fcfs_by_arrival_then_id_and_bounded_by_the_running_cap():
    s, requests, events = scheduler(max_running=2)
    for rid, arrival in ((3, 1), (1, 0), (2, 1), (0, 2)):
        arrive(s, requests, rid, arrival)
    assert s.waiting == [1, 2, 3, 0]
    batch = s.build(0, 0)
    assert batch.kind == PREFILL and [e.rid for e in batch.entries] == [1, 2]
    assert s.admitted == [1, 2] and s.waiting == [3, 0]
    # one chunk holds each whole prompt: the prefill ends in this batch
    assert [r.state for r in (requests[1], requests[2], requests[3])] == [RUNNING, RUNNING, WAITING]
    assert events[-1] == E.Scheduled(0, 0, PREFILL, (1, 2))


def test_admission_waits_for_free_kv():
    # 5 usable pages of 4 slots; admission asks for the prompt plus two decode steps of
    # k+1 = 4: request 0 (11 tokens) holds 3 pages, request 1 (4 tokens) needs 3 of the 2 left
    s, requests, _ = scheduler(page_size=4, pool_tokens=24, row_width=20, spec_steps=3)
    arrive(s, requests, 0, prompt_len=11)
    arrive(s, requests, 1, prompt_len=4)
    batch = s.build(0, 0)
    assert [e.rid for e in batch.entries] == [0] and s.waiting == [1]
    assert s.mem.kv.free_pages == 2


def test_a_long_prompt_is_prefilled_in_chunks():
    s, requests, _ = scheduler(chunk_size=5)
    r = arrive(s, requests, 0, prompt_len=12)
    spans = []
    for it in range(3):
        b = s.build(it, it)
        (e,) = b.entries
        spans.append((e.start, e.n, e.last))
        finish_prefill(s, requests, b)
    assert spans == [(0, 5, False), (5, 5, False), (10, 2, True)]
    assert r.state == RUNNING and r.committed == 12


def test_decode_reserve_double_and_exact():
    s, requests, _ = scheduler(spec_steps=3, draft_reserve="double")
    r = arrive(s, requests, 0)
    r.committed, r.unprocessed_decodes = 10, 1
    assert s.reserve_tokens(r) == 10 + 2 * 4
    s, requests, _ = scheduler(spec_steps=3, draft_reserve="exact")
    r = arrive(s, requests, 0)
    r.committed, r.unprocessed_decodes = 10, 2
    assert s.reserve_tokens(r) == 10 + 4 * 3
    r.committed = 60
    assert s.reserve_tokens(r) == 64          # clamped at the row's end


def test_decode_batches_running_requests_and_reserves_their_kv():
    s, requests, events = scheduler(spec_steps=2)
    for rid in (0, 1):
        arrive(s, requests, rid)
    finish_prefill(s, requests, s.build(0, 0))
    b = s.build(1, 1)
    assert b.kind == DECODE and [e.rid for e in b.entries] == [0, 1]
    assert all(requests[rid].unprocessed_decodes == 1 for rid in (0, 1))
    allocs = [ev for ev in events if isinstance(ev, E.Allocated) and ev.purpose == "draft"]
    assert {ev.rid for ev in allocs} == {0, 1}


def test_memory_pressure_retracts_the_newest_admitted_request():
    # room for both prompts, not for both decode reserves
    s, requests, events = scheduler(pool_tokens=40, row_width=32, spec_steps=3, max_running=3)
    for rid in (0, 1):
        arrive(s, requests, rid, prompt_len=8)
    finish_prefill(s, requests, s.build(0, 0))
    for r in requests.values():         # both decoded a while: committed near the row's end
        r.committed = 16
    b = s.build(1, 1)
    assert [e.rid for e in b.entries] == [0]
    assert requests[1].state == WAITING and requests[1].retractions == 1
    assert s.waiting == [1] and s.admitted == [0]
    assert any(isinstance(ev, E.Retracted) and ev.rid == 1 for ev in events)


def test_forget_removes_a_request_from_both_queues():
    s, requests, _ = scheduler(max_running=1)
    arrive(s, requests, 0)
    arrive(s, requests, 1)
    s.build(0, 0)
    s.forget(requests[0])
    s.forget(requests[1])
    assert s.waiting == [] and s.admitted == []

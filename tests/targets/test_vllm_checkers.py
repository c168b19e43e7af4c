"""The vLLM target's checkers on planted event streams (no vLLM needed): each reports
its violation, and the same stream without the defect gives none."""
from invariants.base import make_checkers
from overlapcheck.protocol import events as E
from overlapcheck.protocol.types import RequestSpec
from overlapcheck.targets.vllm.events import (FrameEntry, ReqCounters, VllmCounters,
                                              VllmFrame, VllmFrameDone, VllmSessionInfo)
from overlapcheck.targets.vllm.golden import Golden

INFO = VllmSessionInfo(0, -1, "async", 2, 2, 4, True, (), 64, 70)
SPEC = RequestSpec(0, 0, (3, 1, 4, 1, 5), 6, (), 11, "greedy")


def feed(name, events):
    (c,) = make_checkers([name])
    out = []
    for ev in events:
        out += c.feed(ev)
    return out + c.finish()


def entry(rid=0, start=0, n=5, spec=0, samples=True, kind="prefill", drafts="none",
          accepted=0, tokens=(7,), blocks=(1, 2), known=5, table=2):
    return FrameEntry(rid, start, n, spec, samples, kind, drafts, accepted, tokens, blocks,
                      known, table)


def counters(it, **kw):
    base = dict(rid=0, status="RUNNING", num_computed_tokens=5, num_tokens=5,
                num_output_placeholders=1, num_in_flight_tokens=5, num_stale_output_tokens=0,
                num_spec_token_ids=2)
    base.update(kw)
    return VllmCounters(it, -1, (ReqCounters(**base),))


def test_placeholders_quiet_on_consistent_counters():
    evs = [INFO, VllmFrame(0, 0, (entry(),)), counters(0)]
    assert feed("vllm-placeholders", evs) == []


def test_placeholders_flags_placeholder_left_after_preemption():
    evs = [INFO, VllmFrame(0, 0, (entry(),)), E.Retracted(1, -1, 0, 0),
           counters(1, status="PREEMPTED", num_computed_tokens=0, num_output_placeholders=1,
                    num_stale_output_tokens=5)]
    vs = feed("vllm-placeholders", evs)
    assert [v.site for v in vs] == [("waiting-counters",)]


def test_placeholders_flags_wrong_in_flight_count_and_stale_drafts():
    bad = entry(start=5, n=3, spec=2, kind="decode", drafts="stale", known=6)
    vs = feed("vllm-placeholders", [INFO, VllmFrame(0, 0, (bad,)), counters(0, num_in_flight_tokens=9)])
    assert {v.site for v in vs} == {("stale-spec-placeholders",), ("in-flight",),
                                   ("placeholders",), ("computed",)}


def test_golden_checks_tokens_and_accept_lengths():
    g = Golden(SPEC.prompt, SPEC.seed, False, 64, 70)
    first = g.token(5)
    drafts = g.drafts(6, 2)
    good = g.verify(6, drafts)
    e = entry(start=5, n=3, spec=2, kind="decode", drafts="fresh", accepted=len(good) - 1,
              tokens=good, known=6)
    base = [INFO, E.Arrived(0, -1, 0, SPEC), E.Prefilled(0, 0, 0, first, False),
            VllmFrame(1, 1, (e,))]
    ok = base + [E.Verified(1, 1, 0, 0, len(good), good, False)]
    assert feed("vllm-golden", ok) == []
    dup = base + [E.Verified(1, 1, 0, 0, len(good), (first,) + good[1:], False)]
    assert [v.site for v in feed("vllm-golden", dup)] == [("token",)]
    acc = base + [E.Verified(1, 1, 0, 0, len(good) + 1, good, False)]
    assert [v.site for v in feed("vllm-golden", acc)] == [("accept-length",)]


def test_block_reuse_only_with_unordered_writers():
    evs = [VllmFrame(0, 0, (entry(blocks=(3,)),)), E.Allocated(1, 1, 1, "kv", (3,), 0)]
    assert [v.site for v in feed("vllm-block-reuse", [INFO] + evs)] == [("reuse-in-flight",)]
    ordered = VllmSessionInfo(0, -1, "async", 2, 2, 4, False, (), 64, 70)
    assert feed("vllm-block-reuse", [ordered] + evs) == []
    done = [INFO, evs[0], VllmFrameDone(1, 0), evs[1]]
    assert feed("vllm-block-reuse", done) == []


def test_preempt_progress_flags_a_deferred_preemption_free():
    assert feed("vllm-preempt-progress", [E.Freed(3, 2, 0, (4, 5), "retract", False, None)]) == []
    vs = feed("vllm-preempt-progress", [E.Freed(3, 2, 0, (4, 5), "retract", True, 2)])
    assert [v.site for v in vs] == [("zero-progress-preemption",)]


def test_overschedule_flags_a_batch_past_max_tokens():
    spec = RequestSpec(0, 0, (1, 2), 2, (), 0, "greedy")
    evs = [E.Arrived(0, -1, 0, spec), E.Prefilled(0, 0, 0, 9, False),
           VllmFrame(1, 1, (entry(start=2, n=1, kind="decode", known=3),))]
    assert feed("vllm-overschedule", evs) == []
    late = evs + [VllmFrame(2, 2, (entry(start=3, n=1, kind="decode", known=4),))]
    assert [v.site for v in feed("vllm-overschedule", late)] == [("past-max-tokens",)]


def test_sched_after_end():
    ok = [E.Scheduled(0, 0, "decode", (0, 1)), E.Finished(1, 0, 0, "stop", (1,))]
    assert feed("vllm-sched-after-end", ok) == []
    bad = ok + [E.Scheduled(2, 1, "decode", (1, 0))]
    assert [v.site for v in feed("vllm-sched-after-end", bad)] == [("scheduled-after-end",)]

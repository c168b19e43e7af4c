"""Each checker sees its planted violation, with the right attribution: through a tiny
engine modification made by a test-only ``Engine`` subclass, or through synthetic
events."""
import dataclasses

from fake_models import OracleModel
from invariants import make_checkers
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import RequestSpec, Workload, generate
from overlapcheck.protocol import events as E
from overlapcheck.protocol.digest import token_digest
from overlapcheck.protocol.results import RequestResult, RunResult
from overlapcheck.race import Detector, OpInfo
from overlapcheck.run import Case, reference_run, run_checked

CFG = EngineConfig(page_size=4, pool_tokens=256, row_width=64, max_running=6, chunk_size=16)


def _wl(n=6, seed=5):
    return generate(seed, n, CFG, max_new=20, abort_rate=0.0)


def _only(run, checker):
    got = [v for v in run.violations if v.checker == checker]
    assert got, f"no {checker} violation; all: {[str(v) for v in run.violations[:3]]}"
    return got


def _feed(name, events, **context):
    (chk,) = make_checkers([name], **context)
    out = []
    for ev in events:
        out += chk.feed(ev)
    return out + chk.finish()


# -- kv-accounting ---------------------------------------------------------------------------
class SkipsLastPage(Engine):
    """Tear-down that misses the last page of request 2 (a release skipping part of the
    request's range)."""

    def _teardown(self, r, state, reason, bid):
        if r.rid == 2 and r.pages:
            self.kept = (r.pages.pop(), self.mem.kv.owned[r.pages[-1] if r.pages else 0])
        super()._teardown(r, state, reason, bid)


def test_kv_accounting_names_the_leak():
    run = run_checked(CFG, _wl(), ["kv-accounting"], seed=1, engine=SkipsLastPage)
    (v,) = _only(run, "kv-accounting")
    page, _ = run.engine.kept
    own = run.engine.mem.kv.owned[page]
    d = v.details
    assert (d["rid"], d["purpose"], d["alloc_step"]) == (2, own.purpose, own.step)
    assert d["pages"] == [page] and d["slots"] == list(range(page * 4, page * 4 + 4))
    finish = [e for e in run.engine.requests.values() if e.rid == 2][0]
    assert finish.done and v.step == d["certain_step"]
    assert "request 2" in str(v) and f"step {own.step}" in str(v) and str(page) in v.seen


def test_kv_accounting_double_free_and_early_release():
    evs = [E.Allocated(0, 0, 1, "prefill", (4, 5), 0),
           E.Freed(1, 0, 1, (4, 5), "finish", True, 3),
           E.Freed(1, 0, 1, (4,), "finish", False, None),
           E.PendingReleased(2, 2, (5,))]
    got = _feed("kv-accounting", evs)
    assert [v.site[0] for v in got] == ["double-free", "early-release"]
    assert "already pending-free" in got[0].seen and "batch 3" in got[1].expected


# -- kv-lifetime / stream-race -------------------------------------------------------------
def _reuse_report():
    det = Detector()
    s, f = det.add_context("schedule"), det.add_context("forward")
    det.alloc("kv", "target_kv")
    det.transfer("kv", [8], 1)
    det.access(f, "kv", False, frozenset({8}), OpInfo("verify"), det.enqueue(f))
    det.transfer("kv", [8], 2)
    return det.access(s, "kv", True, frozenset({8}), OpInfo("write"), det.enqueue(s))


def _stream_report():
    det = Detector()
    a, b = det.add_context("forward"), det.add_context("copy")
    det.alloc("buf", "out_tokens")
    det.access(a, "buf", True, None, OpInfo("accept"), det.enqueue(a))
    return det.access(b, "buf", False, None, OpInfo("d2h", is_copy=True), det.enqueue(b))


def test_kv_lifetime_names_both_owners_and_stream_race_leaves_it():
    rep = _reuse_report()
    (v,) = _feed("kv-lifetime", [E.RaceFound(7, 3, rep)])
    assert v.step == 7 and "request 1 to request 2" in v.message and "slots {8}" in v.message
    assert "verify" in v.expected and "write" in v.seen
    assert _feed("stream-race", [E.RaceFound(7, 3, rep)]) == []


def test_stream_race_reports_an_unordered_pair():
    rep = _stream_report()
    (v,) = _feed("stream-race", [E.RaceFound(4, 2, rep)])
    assert "out_tokens" in v.message and "accept" in v.expected and "d2h" in v.seen
    assert _feed("kv-lifetime", [E.RaceFound(4, 2, rep)]) == []


# -- kv-canary ---------------------------------------------------------------------------------
class Clobbers(Engine):
    """At step 6, a device write tags request 0's first KV slot as another request's
    (``tag``) or as another token (``token``)."""

    mode = "tag"

    def step(self):
        if self.iteration == 6 and self.requests[0].pages:
            slot = self.requests[0].pages[0] * self.cfg.page_size
            self.clobbered = slot
            dev, mode = self.dev, self.mode

            def clobber(kv):
                if mode == "tag":
                    kv[slot, 2] = 99
                else:
                    kv[slot, 0] = kv[slot, 0] + 1

            self.rt.launch(dev.fwd, clobber, dev.target_kv.t, name="clobber",
                           writes=[dev.target_kv.rows([slot])])
        super().step()


def test_kv_canary_names_the_slot_and_both_tags():
    wl = Workload((RequestSpec(0, 0, (1, 2, 3, 4, 5), 30),))
    run = run_checked(CFG, wl, ["kv-canary"], seed=2, engine=Clobbers)
    v = _only(run, "kv-canary")[0]
    slot = run.engine.clobbered
    assert v.site == ("foreign-slot",) and v.details["slot"] == slot and v.details["position"] == 0
    assert "request 0, position 0, token 1" in v.expected and "request 99" in v.seen


def test_kv_canary_sees_a_wrong_token_through_the_digest():
    class WrongToken(Clobbers):
        mode = "token"

    wl = Workload((RequestSpec(0, 0, (1, 2, 3, 4, 5), 30),))
    run = run_checked(CFG, wl, ["kv-canary"], seed=2, engine=WrongToken)
    assert _only(run, "kv-canary")[0].site == ("token-digest",)


def test_kv_canary_stale_committed_length():
    evs = [E.Arrived(0, -1, 0, RequestSpec(0, 0, (1, 2, 3), 9)),
           E.Prefilled(0, 0, 0, 7, False),
           E.Verified(1, 1, 0, 0, 2, (8, 9), False),
           E.Canary(1, 1, 0, 5, 0, -1, -1, (0, 0, 0), token_digest((1, 2, 3, 7, 8)))]
    (v,) = _feed("kv-canary", evs)
    assert v.site == ("committed-length",) and "3 positions" in v.expected and "5 positions" in v.seen


# -- parity --------------------------------------------------------------------------------------
def test_parity_names_request_token_and_verify_index():
    wl = _wl()
    ref = reference_run(Case(CFG, wl))
    rid = max(ref.requests, key=lambda r: len(ref.requests[r].accept_lens))
    r = ref.requests[rid]
    bad = dataclasses.replace(r, accept_lens=r.accept_lens[:1] + (99,) + r.accept_lens[2:])
    tampered = RunResult({**ref.requests, rid: bad}, ref.summary)
    run = run_checked(CFG, wl, ["parity"], seed=3, reference=tampered)
    (v,) = _only(run, "parity")
    assert v.details["rid"] == rid and "verify #1" in v.message and "99" in v.expected
    other = min(ref.requests)
    o = ref.requests[other]
    tampered = RunResult({**ref.requests, other: dataclasses.replace(
        o, tokens=o.tokens[:2] + (o.tokens[2] + 1,) + o.tokens[3:])}, ref.summary)
    (v,) = _only(run_checked(CFG, wl, ["parity"], seed=3, reference=tampered), "parity")
    assert v.details["rid"] == other and "token 2 differs" in v.message


def test_parity_accepts_an_aborted_prefix_and_flags_a_longer_output():
    ref = RunResult({0: RequestResult(0, (4, 5), "length", (2,), 0)}, None)
    evs = [E.Prefilled(0, 0, 0, 4, False), E.Verified(1, 1, 0, 0, 2, (5, 6), False)]
    assert _feed("parity", evs, reference=ref) == []           # reported when it ends
    (v,) = _feed("parity", evs + [E.Finished(1, 1, 0, "length", (4, 5, 6))], reference=ref)
    assert v.site == ("length", "length") and "2 tokens" in v.expected and v.step == 1
    (v,) = _feed("parity", evs + [E.Aborted(2, -1, 0, (4, 5, 6))], reference=ref)
    assert v.site == ("length", "abort")
    ref = RunResult({0: RequestResult(0, (4, 5, 6, 7), "stop", (2, 1), 0)}, None)
    assert _feed("parity", evs[:1] + [E.Aborted(1, 0, 0, (4,))], reference=ref) == []


# -- metrics -------------------------------------------------------------------------------------
class MisReports(Engine):
    def result(self):
        res = super().result()
        return dataclasses.replace(res, summary=dataclasses.replace(
            res.summary, mean_accept_length=res.summary.mean_accept_length - 0.5))


def test_metrics_catch_a_misreported_summary_and_a_lagged_count():
    run = run_checked(CFG, _wl(), ["metrics"], seed=4, engine=MisReports)
    (v,) = _only(run, "metrics")
    assert v.site == ("summary-mean_accept_length",)
    assert "(counted from events)" in v.expected and "(reported)" in v.seen
    evs = [E.Prefilled(0, 0, 1, 3, False), E.Finished(1, 0, 1, "length", (3,)),
           E.Verified(2, 1, 1, 0, 2, (4, 5), False)]
    (v,) = _feed("metrics", evs)
    assert v.site == ("counted-after-end",) and v.details["batch"] == 1


# -- no-hidden-sync ------------------------------------------------------------------------------
class SyncsOnce(Engine):
    def step(self):
        if self.iteration == 5:
            self.rt.synchronize()
        super().step()


def test_no_hidden_sync_names_the_step():
    run = run_checked(CFG, _wl(), ["no-hidden-sync"], seed=5, engine=SyncsOnce)
    (v,) = _only(run, "no-hidden-sync")
    assert v.step == 5 and v.details["syncs"] == v.details["declared"] + 1


# -- lifecycle -----------------------------------------------------------------------------------
class IgnoresStop(Engine):
    """Stop tokens are not recognized (the run is cut only at the length limit)."""

    def _append(self, r, tokens):
        spec = r.spec
        r.spec = dataclasses.replace(spec, stop_ids=())
        try:
            return super()._append(r, tokens)
        finally:
            r.spec = spec


def test_lifecycle_sees_an_uncut_stop_token():
    ref = reference_run(Case(CFG, _wl(8, seed=9)))
    stopped = [rid for rid, r in ref.requests.items() if r.finish_reason == "stop"]
    assert stopped
    run = run_checked(CFG, _wl(8, seed=9), ["lifecycle"], seed=6, engine=IgnoresStop)
    got = _only(run, "lifecycle")
    assert {v.site[0] for v in got} <= {"stop-not-cut", "stop-not-finished", "tokens-after-end",
                                         "finish-reason"}
    assert stopped[0] in {v.details["rid"] for v in got}


def test_lifecycle_synthetic_stop_inside_run_and_wrong_reason():
    spec = RequestSpec(0, 0, (1,), 10, stop_ids=(5,))
    evs = [E.Arrived(0, -1, 0, spec), E.Prefilled(0, 0, 0, 2, False),
           E.Verified(1, 1, 0, 0, 3, (5, 6, 7), False), E.Finished(1, 1, 0, "length", (2, 5, 6, 7))]
    got = _feed("lifecycle", evs)
    assert [v.site[0] for v in got] == ["stop-not-cut", "finish-reason"]
    assert got[0].site == ("stop-not-cut", "length") and got[0].step == 1
    assert "stop token 5 (index 0)" in got[0].expected
    # an abort taken before the verify's result: the same symptom, another bug
    aborted = evs[:3] + [E.Aborted(1, 1, 0, (2, 5, 6, 7))]
    assert [v.site for v in _feed("lifecycle", aborted)] == [("stop-not-cut", "abort")]
    # a request that goes on after the uncut run: reported at the end of the step
    snap = E.Snapshot(total=0, free=0, owned=0, pending=0, ledger=(), pending_slots=(),
                      requests=(), inflight=(), rows_free=0, idle=False, syncs=0,
                      declared_syncs=0)
    live = evs[:3] + [E.StepEnd(1, -1, snap)]
    assert ("stop-not-cut", "live") in [v.site for v in _feed("lifecycle", live)]

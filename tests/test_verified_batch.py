"""A batch's decode results as one ``VerifiedBatch`` (docs/design.md §5.4) judge exactly
as the per-request ``Verified`` and ``Canary`` events they stand for: the same run, the
same violations in the same order, on clean runs and with bugs of the zoo planted; and
a checker's own one-loop handler agrees with the default expansion on hand-made runs."""
import pytest

from invariants import make_checkers
from invariants.base import Checker
from invariants.kv_canary import KVCanary
from overlapcheck.engine import EngineConfig, make_engine
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.protocol.canary import CANARY, C_BAD, C_DIGEST, C_LEN, C_RID, C_SLOT
from overlapcheck.protocol.digest import token_digest
from overlapcheck.protocol.types import RequestSpec
from overlapcheck.run import Case, Monitor, ScheduleSpec, execute

pytestmark = pytest.mark.usefixtures("one_thread")

# (fault, engine config changes): each bug's run has violations of the checkers that
# override on_VerifiedBatch, so the comparison is not one of two empty lists
PLANTED = [
    (None, {}),
    (None, {"kv_backup": True}),
    (None, {"overlap": False}),
    ("lagged-verify-counted", {}),
    ("stop-cut-after-length", {}),
    ("single-staging-buffer", {}),
    ("reserve-host-view", {}),
    ("no-copy-done-wait", {}),
    ("eagle-stash-batch-position", {"draft_kind": "eagle"}),
]


def _factory(batched: bool, seen: list):
    """An engine factory whose observer takes ``VerifiedBatch`` runs or not."""
    def factory(cfg, rt, model, observer):
        def obs(ev):
            seen.append(type(ev))
            observer(ev)
        obs.batched = batched
        return make_engine(cfg, rt, model, obs)
    return factory


def _compare(case) -> list:
    """Run ``case`` with and without ``VerifiedBatch`` runs: the same engine run and the
    same violations of every checker; returns the findings."""
    runs = {}
    for batched in (True, False):
        seen: list = []
        runs[batched] = (execute(case, engine=_factory(batched, seen)), seen)
    (a, seen_a), (b, seen_b) = runs[True], runs[False]
    assert E.VerifiedBatch in seen_a and E.VerifiedBatch not in seen_b
    assert E.Verified in seen_b
    # the engine ran the same; the checkers judged the same, in the same order
    assert (a.digest, a.status, a.steps) == (b.digest, b.status, b.steps)
    assert [v.to_json() for v in a.violations] == [v.to_json() for v in b.violations]
    assert [f.text for f in a.findings] == [f.text for f in b.findings]
    return a.findings


@pytest.mark.parametrize("fault,changes", PLANTED,
                         ids=[f"{f or 'clean'}-{'-'.join(c) or 'standard'}" for f, c in PLANTED])
def test_batched_results_judge_as_the_per_request_events(fault, changes):
    found = 0
    for seed in range(8):
        base = dict(page_size=(1, 4)[seed % 2], pool_tokens=(96, 512)[seed % 2],
                    row_width=64, max_running=4, chunk_size=16, spec_steps=3)
        cfg = EngineConfig(**{**base, **changes})
        wl = generate(seed, 6, cfg, max_new=20)
        case = Case(cfg, wl, ScheduleSpec(("random", "pct")[seed % 2], seed), (),
                    (fault,) if fault else ())
        findings = _compare(case)
        found += bool(findings)
        if fault is None:
            assert not findings, findings[0].text
        elif found >= 2:
            break
    if fault:   # a bug no seed caught would make the comparison one of empty lists
        assert found, f"{fault}: no finding in 8 seeds"


def _record(rid, n, digest, bad=0, found=(0, 0, 0)):
    rec = [0] * CANARY
    rec[C_LEN], rec[C_BAD], rec[C_DIGEST] = n, bad, digest
    if bad:
        rec[C_SLOT:C_RID + 1] = [7, n - 1, *found]
    return rec


def _runs():
    """Hand-made runs over two requests, good and bad, in the order a checker sees them:
    (events before, the VerifiedBatch)."""
    toks = {0: [1, 2, 3], 1: [4, 5]}
    spec = lambda rid: RequestSpec(rid, 0, tuple(toks[rid]), 8, (9,), 0)
    before = [E.Arrived(0, -1, rid, spec(rid)) for rid in toks]
    before += [E.Prefilled(1, 0, rid, 6, False) for rid in toks]
    full = {rid: toks[rid] + [6] for rid in toks}
    ok = lambda rid, n: token_digest(full[rid][:n])

    def batch(records, tokens=((7, 8), (7,)), dropped=(False, False), index=(0, 0)):
        return E.VerifiedBatch(2, 1, (0, 1), index, tuple(len(t) for t in tokens),
                               tuple(tokens), dropped, records, False)
    return before, [
        batch((_record(0, 3, ok(0, 3)), _record(1, 2, ok(1, 2)))),        # good
        batch(()),                                                          # no records
        batch((_record(0, 3, ok(0, 3) + 1), _record(1, 2, ok(1, 2)))),    # digest off
        batch((_record(0, 2, ok(0, 2)), _record(1, 2, ok(1, 2)))),        # length off
        batch((_record(0, 3, ok(0, 3), bad=1, found=(5, 2, 1)), _record(1, 2, ok(1, 2)))),
        batch((_record(0, -7, 0), _record(1, 2, ok(1, 2)))),             # garbled
        batch((_record(0, 3, ok(0, 3)), _record(1, 2, ok(1, 2))), dropped=(True, False)),
        batch((_record(0, 3, ok(0, 3)), _record(1, 2, ok(1, 2))), tokens=((7, 9), (9, 3))),
        batch((_record(0, 3, ok(0, 3)), _record(1, 2, ok(1, 2))), index=(0, 4)),
    ]


@pytest.mark.parametrize("case", range(9))
def test_each_one_loop_handler_agrees_with_the_expansion(case):
    """Every checker that overrides ``on_VerifiedBatch``, fed a run and then the same
    run again, reports what the default expansion does, and ends in the same state."""
    before, runs = _runs()
    ev = runs[case]
    overriding = [c for c in make_checkers() if type(c).on_VerifiedBatch
                  is not Checker.on_VerifiedBatch]
    assert {c.name for c in overriding} >= {"kv-canary", "lifecycle", "metrics", "liveness"}
    found_any = False
    for c in overriding:
        one, two = type(c)(), type(c)()
        for e in before:
            one.feed(e), two.feed(e)
        got = [(p, v.to_json()) for p, v in (one.on_VerifiedBatch(ev) or [])
               + (one.on_VerifiedBatch(ev) or [])]
        want = [(p, v.to_json()) for p, v in Checker.on_VerifiedBatch(two, ev)
                + Checker.on_VerifiedBatch(two, ev)]
        assert got == want, c.name
        assert vars(one).keys() == vars(two).keys()
        for k in vars(one):
            if k != "_handlers":
                assert vars(one)[k] == vars(two)[k], (c.name, k)
        found_any |= bool(got)
    if case not in (0, 1, 6):
        assert found_any, "a planted bad run that no checker reports"


def test_the_monitor_expands_for_a_checker_without_its_own_loop():
    """A checker with only ``on_Verified`` / ``on_Canary``, or with its own ``feed``, gets
    the per-request events of a ``VerifiedBatch``; the log gets them too."""
    before, runs = _runs()
    seen = []

    class Counts(Checker):
        name = "counts"

        def on_Verified(self, ev):
            seen.append(("V", ev.rid))

        def on_Canary(self, ev):
            seen.append(("C", ev.rid))

    class Fed:
        name, fatal = "fed", False

        def feed(self, ev):
            seen.append(("feed", type(ev).__name__))
            return []

        def finish(self):
            return []

    class Log:
        def __init__(self):
            self.events = []

        def event(self, ev):
            self.events.append(type(ev).__name__)

        def violation(self, v):
            self.events.append("violation")

    log = Log()
    m = Monitor([Counts(), Fed(), KVCanary()], log=log)
    for e in before + [runs[2]]:
        m(e)
    assert [s for s in seen if s[0] in "VC"] == [("V", 0), ("C", 0), ("V", 1), ("C", 1)]
    assert [s[1] for s in seen if s[0] == "feed"][-4:] == ["Verified", "Canary"] * 2
    assert log.events[-5:] == ["Verified", "Canary"] * 2 + ["violation"]
    assert [v.site for v in m.violations] == [("token-digest",)]

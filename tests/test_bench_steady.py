"""The GPU benches' timing method (bench/steady.py, bench/gpu_overlap.py's Window;
docs/design.md §8.1) on a fake timer: a run times a fixed range of windows after its
settle steps and reports each window and the whole, a row too short for the range is an
error, and balanced start orders cancel a drift that a fixed order turns into a bias. No timing is measured or asserted: every rate comes
from the fake clock."""
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(ROOT, "bench"))   # bench/ is scripts, not a package

import gpu_overlap as G  # noqa: E402
import steady  # noqa: E402
from overlapcheck.protocol.types import RUNNING  # noqa: E402


def test_balanced_order_gives_every_mode_the_same_mean_position():
    modes = ["a", "b", "c", "d"]
    assert steady.balanced_order(modes, 0) == modes and steady.balanced_order(modes, 1) == modes[::-1]
    for n in (2, 4, 6):
        pos = {m: sum(steady.balanced_order(modes, r).index(m) for r in range(n)) for m in modes}
        assert len(set(pos.values())) == 1, pos


class DriftingGpu:
    """A fake device whose rate falls by ``drift`` per run: identical modes differ
    only by when they ran."""

    def __init__(self, drift=1.0):
        self.t, self.drift, self.log = 0, drift, []

    def run(self, mode):
        self.log.append(mode)
        self.t += 1
        return {"tokens_per_s": 100.0 - self.drift * self.t}


def test_balanced_rounds_cancel_a_drift_a_fixed_order_turns_into_a_bias():
    gpu = DriftingGpu()
    runs = steady.rounds(["A", "B"], 6, gpu.run)
    assert gpu.log[:4] == ["A", "B", "B", "A"]                  # ABBA
    r = steady.paired_ratio([x["tokens_per_s"] for x in runs["A"]], [x["tokens_per_s"] for x in runs["B"]])
    assert abs(r["median"] - 1.0) < 1e-3 and r["min"] < 1.0 < r["max"]
    fixed, gpu = {"A": [], "B": []}, DriftingGpu()            # what a fixed order reports
    for _ in range(6):
        for m in "AB":
            fixed[m].append(gpu.run(m)["tokens_per_s"])
    assert steady.paired_ratio(fixed["A"], fixed["B"])["median"] > 1.005


def test_warm_up_runs_until_every_mode_agrees_with_its_previous_round():
    class Ramp:   # the first runs are slow (clocks ramping, first-time costs), then flat
        n = 0

        def run(self, mode):
            self.n += 1
            return {"tokens_per_s": {1: 40.0, 2: 60.0, 3: 98.0, 4: 98.0}.get(self.n, 100.0)}
    w = steady.warm_up(["A", "B"], Ramp().run, tol=0.03, cap=6)
    assert w["settled"] and w["rounds"] == 3 and w["rates"] == {"A": [40.0, 98.0, 100.0],
                                                                "B": [60.0, 98.0, 100.0]}
    w = steady.warm_up(["A", "B"], Ramp().run, tol=0.03, cap=2)
    assert not w["settled"] and w["rounds"] == 2


def test_joint_rounds_run_every_mode_of_a_round_in_one_call():
    calls = []

    def run_round(order):
        calls.append(list(order))
        return {m: {"tokens_per_s": 100.0 + len(calls)} for m in order}
    out = steady.rounds(["A", "B", "C"], 2, run_round, joint=True)
    assert calls == [["A", "B", "C"], ["C", "B", "A"]]
    assert out == {m: [{"tokens_per_s": 101.0}, {"tokens_per_s": 102.0}] for m in "ABC"}
    calls.clear()
    w = steady.warm_up(["A", "B"], run_round, tol=0.03, cap=5, joint=True)
    assert w["settled"] and w["rounds"] == 2 and calls == [["A", "B"], ["B", "A"]]


def test_spread_and_paired_ratio():
    assert steady.spread([3, 1, 2]) == {"median": 2, "min": 1, "max": 3}
    assert steady.paired_ratio([2.0, 4.0], [1.0, 0.0]) is None
    assert steady.fmt_spread({"median": 1.5, "min": 1.0, "max": 2.0}, ".2f") == "1.50 [1.00-2.00]"



def test_window_paired_ratio_keeps_a_slow_window_to_its_pair():
    # A is 1.2x B in every window; a slow period of the host halves one window of B in
    # round 0 and one of A in round 1: each moves its round's ratio of totals, not the
    # median of the round's window ratios
    a = [[120.0, 120.0, 120.0, 120.0], [60.0, 120.0, 120.0, 120.0], [120.0] * 4]
    b = [[100.0, 50.0, 100.0, 100.0], [100.0] * 4, [100.0] * 4]
    w = steady.window_paired_ratio(a, b)
    assert w == {"median": 1.2, "min": 1.2, "max": 1.2}
    totals = steady.paired_ratio([sum(x) for x in a], [sum(x) for x in b])
    assert totals["max"] > 1.3 and totals["min"] < 1.1       # the same rounds' totals
    # a genuine change of ratio in most windows of a round still shows
    c = [[120.0] * 4, [150.0, 150.0, 150.0, 120.0]]
    assert steady.window_paired_ratio(c, [[100.0] * 4] * 2)["max"] == 1.5
    # a missing pair or a zero rate: no figure rather than a figure from fewer pairs
    assert steady.window_paired_ratio([[1.0, 2.0]], [[1.0, 0.0]]) is None
    assert steady.window_paired_ratio([], []) is None


class FakeEngine:
    """Enough of an engine for ``Window``: every step commits one token per request and
    advances the fake clock by ``dt(step)``, a quarter of it blocked in a device wait
    (``rt.wait_s``); the window's rates come from that clock."""

    def __init__(self, n_req, dt, clock):
        self.requests = {i: types.SimpleNamespace(state=RUNNING, output=[]) for i in range(n_req)}
        self.rt = types.SimpleNamespace(syncs=0, wait_s=0.0)
        self.worker, self.dt, self.clock, self.k = None, dt, clock, 0

    def step(self):
        self.k += 1
        dt = self.dt(self.k)
        self.clock[0] += dt
        self.rt.wait_s += dt / 4
        self.rt.syncs += 1
        for r in self.requests.values():
            r.output.append(0)

    def run(self, steps):
        try:
            for _ in range(steps):
                self.step()
        except G._Done:
            pass


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(G.time, "perf_counter", lambda: now[0])
    return now


def test_window_times_a_fixed_range_and_reports_each_window(clock):
    # steps 1-10 take 2 s, later ones 1 s: 3 windows of 4 steps after 2 settle steps
    eng = FakeEngine(2, lambda k: 2.0 if k <= 10 else 1.0, clock)
    w = G.Window(eng, "sim", 2, 2, 4, 3)
    eng.run(100)
    r = w.result
    # the range is steps 3-14 whatever the rates: 3-6 and 7-10 at 2 s a step, 11-14 at 1 s
    assert (r["windows"], r["steps"], r["tokens"], eng.k) == (3, 12, 24, 14)
    assert r["seconds"] == pytest.approx(20.0)
    assert r["tokens_per_s"] == pytest.approx(24 / 20.0)
    assert r["window_tokens_per_s"] == [1.0, 1.0, 2.0]
    assert r["syncs_per_step"] == 1.0
    # the host's own work: 8 steps of 1.5 s and 4 of 0.75 s once the waits are taken out
    assert r["host_ms_per_step"] == pytest.approx((8 * 1.5 + 4 * 0.75) * 1e3 / 12)


def test_an_interleaved_window_pauses_and_leaves_the_pauses_out(clock):
    # settle 1, 2 windows of 3 steps at 1 s a step; 100 s of other runs' windows between
    eng = FakeEngine(2, lambda k: 1.0, clock)
    w = G.Window(eng, "sim", 2, 1, 3, 2, interleave=True)
    while not w.paused:
        eng.step()
    assert (eng.k, w.result) == (4, None)
    clock[0] += 100.0
    w.resume()
    eng.run(100)
    r = w.result
    assert (r["windows"], r["steps"], r["tokens"], eng.k) == (2, 6, 12, 7)
    assert r["seconds"] == pytest.approx(6.0)
    assert r["window_tokens_per_s"] == [2.0, 2.0]


def test_window_single_window_and_bad_ranges(clock):
    eng = FakeEngine(1, lambda k: 1.0, clock)
    w = G.Window(eng, "sim", 1, 1, 5)
    eng.run(100)
    assert (w.result["windows"], w.result["steps"], eng.k) == (1, 5, 6)
    with pytest.raises(ValueError):
        G.Window(FakeEngine(1, lambda k: 1.0, clock), "sim", 1, 0, 0)


def test_a_request_leaving_steady_decode_inside_the_range_is_an_error(clock):
    eng = FakeEngine(2, lambda k: 1.0, clock)
    real = eng.step

    def step():
        real()
        if eng.k == 7:
            eng.requests[1].state = "finished"
    eng.step = step
    G.Window(eng, "sim", 2, 1, 4, 3)
    with pytest.raises(G.RowTooShort, match="6 steps into a timed range of 12"):
        for _ in range(100):
            eng.step()


def test_auto_row_width_fits_the_reference_range():
    import argparse
    a = argparse.Namespace(settle=3, steps=12, windows=4, prompt=16, spec_steps=3, page_size=16)
    row = G.auto_row_width(a)
    assert row % 16 == 0
    # every step may commit spec_steps + 1 tokens; the reference runs 3 steps past the range
    assert row - 16 - (3 + 1 + 8) >= (3 + 1) * (3 + 12 * 4 + 3)



class _Args:
    windows = 4


def _slow_host_runs(monkeypatch, slow):
    """``gpu_overlap.ModeRun`` replaced by runs on a fake host: each window takes one tick
    of a shared clock; in the ticks of ``slow`` the host is slow, which moves the
    non-overlap run's window (its host work is on the step's path) and not the overlap
    run's (hidden). Returns the log of (round, mode) windows in the order they ran."""
    clock, log, made = [0], [], []

    class Run:
        def __init__(self, args, name, model, batch, mode, ref=None, interleave=False, overrides=None):
            assert interleave and overrides is None
            self.mode, self.k, self.rates = mode, len(made) // 2, []
            made.append(self)

        def window(self):
            log.append((self.k, self.mode))
            host = 1.5 if clock[0] in slow else 1.0
            self.rates.append(100.0 / (host if self.mode == "N" else 1.0))
            clock[0] += 1

        def figures(self):
            return {"window_tokens_per_s": self.rates}
    monkeypatch.setattr(G, "ModeRun", Run)
    return log


def test_rounds_run_together_share_a_slow_period_that_falls_on_one_round_run_alone(monkeypatch):
    """Two rounds of modes N and O, four windows each: the host is slow for a stretch as
    long as one round (8 ticks). Rounds one after another: it falls on the second round
    alone, whose ratio reads 1.5 against the first's 1.0. Run together
    (``steady.together``, ``lockstep`` over both orders), every round's windows take
    turns, the pairs stay back to back, and each round gets the same share of it."""
    def window_ratio(runs):
        return steady.window_paired_ratio([r["window_tokens_per_s"] for r in runs["O"]],
                                          [r["window_tokens_per_s"] for r in runs["N"]])
    _slow_host_runs(monkeypatch, range(8, 16))
    apart = steady.rounds(["N", "O"], 2, lambda order: G.lockstep(_Args, "m", None, 1, [order])[0],
                          joint=True)
    assert (window_ratio(apart)["min"], window_ratio(apart)["max"]) == (1.0, 1.5)

    log = _slow_host_runs(monkeypatch, range(8, 16))
    together = steady.together(["N", "O"], 2, lambda orders: G.lockstep(_Args, "m", None, 1, orders))
    # window w of every round in turn (backward on odd windows), each round's pair back to back
    assert log[:8] == [(0, "N"), (0, "O"), (1, "O"), (1, "N"), (1, "N"), (1, "O"), (0, "O"), (0, "N")]
    assert window_ratio(together) == {"median": 1.25, "min": 1.25, "max": 1.25}


def test_together_keeps_the_rounds_balanced_order_and_counts_them():
    seen = []

    def run(orders):
        seen.append(orders)
        return [{m: {"tokens_per_s": float(k)} for m in order} for k, order in enumerate(orders)]
    got = steady.together(["A", "B"], 4, run)
    assert seen == [[["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]]
    assert got == {m: [{"tokens_per_s": float(k)} for k in range(4)] for m in "AB"}
    with pytest.raises(ValueError, match="4 rounds asked for, 1 run"):
        steady.together(["A"], 4, lambda orders: [{"A": 1}])


def test_by_position_leaves_out_a_stall_one_round_alone_ran_into():
    """Five rounds time the same four windows; the engine is slower at later windows
    (its context grows) and pays a stall of its own in window 2 of every round. One
    round's window 1 ran into a stall of the host. The plain totals move that round by
    over 10 %; ``by_position`` reads every round alike, and the engine's own stall,
    being in every round, stays in the rate."""
    clean = [100.0, 90.0, 40.0, 80.0]          # window 2: the engine's stall, every round
    rounds = [list(clean) for _ in range(5)]
    rounds[3][1] = 45.0                          # the host's stall, round 3 only
    tokens = [10, 10, 10, 10]
    totals = [sum(tokens) / sum(t / x for t, x in zip(tokens, w)) for w in rounds]
    assert (max(totals) - min(totals)) / max(totals) > 0.1
    got = steady.by_position(rounds, tokens)
    want = sum(tokens) / sum(t / x for t, x in zip(tokens, clean))
    assert got == [pytest.approx(want)] * 5
    # a round that is slower in most of its windows is slower: its rate says so
    rounds[1] = [x * 0.9 for x in clean[:3]] + [clean[3]]
    got = steady.by_position(rounds, tokens)
    assert got[1] == pytest.approx(0.9 * want) and got[0] == pytest.approx(want)
    # tokens weigh the windows: the range's rate, not the mean of its windows' rates
    assert steady.by_position([[10.0, 30.0]], [30, 30])[0] == pytest.approx(15.0)
    assert steady.by_position([[10.0, 30.0]])[0] == pytest.approx(15.0)
    for bad in ([], [[]], [[1.0], [1.0, 2.0]], [[0.0, 1.0]]):
        with pytest.raises(ValueError):
            steady.by_position(bad)
    with pytest.raises(ValueError):
        steady.by_position([[1.0, 2.0]], [1])

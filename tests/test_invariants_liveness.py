"""liveness: a planted zombie and a planted stuck wait become violations instead of
hangs (both runs are given an effectively unbounded step budget)."""
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import RequestSpec, Workload
from overlapcheck.protocol.workload import AbortAt
from overlapcheck.run import run_checked

CFG = EngineConfig(page_size=1, pool_tokens=256, row_width=64, max_running=4, chunk_size=16)
FOREVER = 10 ** 9


class ForgetsAborts(Engine):
    """An abort only marks the request and never tears it down: a zombie that stays
    admitted forever (the abort-in-the-transition-window bug)."""

    def _teardown(self, r, state, reason, bid):
        if state != "aborted":
            super()._teardown(r, state, reason, bid)


class WaitsForLaterHost(Engine):
    """At step 3, the forward stream waits for a host flag the host sets only after
    processing the result of the batch launched behind it: a host wait on device work that waits for a later
    host action."""

    def step(self):
        if self.iteration == 3:
            self.flag, self.gated = self.rt.new_flag("result_processed"), self.batches
            self.rt.wait_flag(self.dev.fwd, self.flag)
        super().step()

    def _process(self, batch):
        super()._process(batch)
        if getattr(self, "flag", None) is not None and batch.bid >= self.gated:
            self.flag.set()


def _wl():
    return Workload((RequestSpec(0, 0, (1, 2, 3), 40), RequestSpec(1, 0, (4, 5), 12)),
                    (AbortAt(0, 4),))


def test_planted_zombie_is_reported_and_stops_the_run():
    run = run_checked(CFG, _wl(), ["liveness"], seed=1, engine=ForgetsAborts,
                      max_steps=FOREVER)
    assert run.status == "halted"
    (v,) = run.violations
    assert v.site == ("zombie",) and v.details["rid"] == 0 and "request 0" in v.message
    assert run.engine.iteration < 64 + 8 * 43 + 5
    assert run.engine.requests[1].done             # the other request was not held up


def test_planted_stuck_wait_is_reported_by_name():
    for overlap in (False, True):
        cfg = EngineConfig(**{**CFG.__dict__, "overlap": overlap})
        run = run_checked(cfg, _wl(), ["liveness"], seed=2, engine=WaitsForLaterHost,
                          max_steps=FOREVER)
        assert run.status == "stalled"
        (v,) = run.violations
        assert v.site == ("stuck-wait",)
        assert "copy_done" in v.message and "'forward'" in v.message
        assert "result_processed" in v.message


def test_liveness_bound_is_configurable_and_quiet_on_clean_runs():
    run = run_checked(CFG, _wl(), ["liveness"], seed=3, liveness_bound=(1, 0))
    assert run.status == "halted" and run.violations[0].site == ("zombie",)
    assert run_checked(CFG, _wl(), ["liveness"], seed=3).violations == []


class RetractsEveryone(Engine):
    """Every decode build first retracts every running request: each is re-admitted and
    re-prefilled, and retracted again before its decode — no token is ever kept after
    the first ones (a preempt, re-add, preempt loop)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        decode = self.sched._decode

        def retract_all(it, bid):
            for rid in list(self.sched.admitted):
                r = self.requests[rid]
                if r.state == "running" and r.output:
                    self.sched.retract(r, it, bid)
            return decode(it, bid)
        self.sched._decode = retract_all


def test_planted_livelock_is_reported_long_before_the_engines_bound():
    wl = Workload((RequestSpec(0, 0, (1, 2, 3), 40), RequestSpec(1, 0, (4, 5), 12)))
    run = run_checked(CFG, wl, ["liveness"], seed=1, engine=RetractsEveryone,
                      max_steps=FOREVER, engine_config=CFG)
    assert run.status == "halted"
    (v,) = run.violations
    assert v.site == ("livelock",) and v.details["retractions"] > 2
    assert run.engine.iteration < 64 + 2 * 2 * 4 + 10     # its bound: 2 prefill batches each


def test_livelock_rule_is_quiet_on_clean_runs_that_retract():
    """A pool of one row and a bit for six requests: retractions all along, no livelock."""
    from overlapcheck.protocol import generate
    cfg = EngineConfig(page_size=2, pool_tokens=40, row_width=32, max_running=4, chunk_size=3,
                       spec_steps=3, zero_bubble=True)
    retracted = 0
    for seed in range(4):
        run = run_checked(cfg, generate(seed, 6, cfg, max_prompt=12, max_new=20), ["liveness"],
                          seed=seed, engine_config=cfg)
        assert run.status == "completed" and run.violations == [], run.violations
        retracted += run.result.summary.retractions
    assert retracted > 0

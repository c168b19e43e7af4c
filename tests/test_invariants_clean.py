"""Clean runs report nothing: every checker on, many seeded workloads, every draft kind
and model the engine's config accepts, every sim schedule strategy."""
import dataclasses

import pytest

from fake_models import make_model
from invariants import make_checkers, names_for
from overlapcheck.engine import EngineConfig
from overlapcheck.engine import config as engine_config
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, reference_run, run_checked

STRATEGIES = ("random", "pct", "buggify", "eager")
# Every draft kind with every model the config accepts; the oracle (fast) over more
# seeds, heavier models over fewer and smaller workloads.
CASES = [(d, m, seed) for d in DRAFT_KINDS for m in engine_config.MODELS
         for seed in (range(6) if m == "oracle" else range(1))]


def _cfg(seed, **kw):
    base = dict(page_size=(1, 4)[seed % 2], pool_tokens=(72, 96, 512)[seed % 3], row_width=64,
                max_running=6, chunk_size=16)
    base.update(kw)
    return EngineConfig(**base)


class Count:
    """A checker-shaped counter of event kinds (proves the checkers were fed)."""

    def __init__(self):
        self.seen = {}

    def feed(self, ev):
        self.seen[type(ev).__name__] = self.seen.get(type(ev).__name__, 0) + 1
        return []

    def finish(self):
        return []


def clean(cfg, wl, seed, strategy, reference=None, **kw):
    run = run_checked(cfg, wl, seed=seed, strategy=strategy, reference=reference, **kw)
    assert run.status == "completed"
    assert not run.violations, "\n".join(map(str, run.violations[:5]))
    return run


@pytest.mark.parametrize("draft, model, seed", CASES)
def test_clean_runs_report_nothing(draft, model, seed):
    cfg = _cfg(seed, draft_kind=draft, model=model)
    small = model != "oracle"
    wl = generate(seed, 3 if small else 10, cfg, max_new=8 if small else 24)
    ref = reference_run(Case(cfg, wl))
    for strategy in (STRATEGIES[seed % 4],) + (() if small else (STRATEGIES[(seed + 1) % 4],)):
        run = clean(cfg, wl, seed, strategy, reference=ref)
        assert run.result.requests.keys() == ref.requests.keys()


@pytest.mark.parametrize("seed", range(6, 12))
def test_clean_variants(seed):
    """No spec, exact reserve, non-overlap; no-spec reference compared on tokens only."""
    cfg = _cfg(seed)
    wl = generate(seed, 10, cfg, max_new=24)
    variant = (dataclasses.replace(cfg, spec=False), dataclasses.replace(cfg, draft_reserve="exact"),
               dataclasses.replace(cfg, overlap=False))[seed % 3]
    clean(variant, wl, seed, STRATEGIES[seed % 4])
    nospec_ref = reference_run(Case(dataclasses.replace(cfg, spec=False), wl))
    clean(cfg, wl, seed, "random", reference=nospec_ref, parity_accept=False)


def test_every_checker_sees_its_events_on_a_clean_run():
    cfg = _cfg(3)
    wl = generate(3, 12, cfg, max_new=30)
    count = Count()
    run = run_checked(cfg, wl, seed=3, strategy="random")
    assert not run.violations
    from overlapcheck.run import Monitor
    from overlapcheck.device import make_runtime
    from overlapcheck.engine import Engine
    mon = Monitor([count] + make_checkers(reference=run.result))
    Engine(cfg, make_runtime("sim", seed=3, strategy="random", access="declared"),
           make_model(cfg.model), mon).run(wl)
    assert not mon.finish()
    for kind in ("Arrived", "Allocated", "Freed", "PendingReleased", "Verified", "Canary",
                 "Finished", "Retracted", "RunEnd", "StepEnd"):
        assert count.seen.get(kind), f"no {kind} event on this workload: {count.seen}"
    assert len(names_for("reference")) == 18
    threads = Count()    # host-race's events come from forward-thread runs
    mon = Monitor([threads] + make_checkers(reference=run.result))
    Engine(dataclasses.replace(cfg, forward_thread=True), make_runtime(
        "sim", seed=3, strategy="random", access="declared"), make_model(cfg.model), mon).run(wl)
    assert not mon.finish() and threads.seen["HostQueue"] and threads.seen["HostAccess"]
    from overlapcheck.engine import TPEngine
    ranks = Count()      # rank-agreement's events come from tensor-parallel runs
    mon = Monitor([ranks] + make_checkers(reference=run.result))
    TPEngine(dataclasses.replace(cfg, tp=2), make_runtime("sim", seed=3, strategy="random",
             access="declared"), make_model(cfg.model), mon).run(wl)
    assert not mon.finish() and ranks.seen["RankBatch"] == 2 * ranks.seen["StepEnd"]

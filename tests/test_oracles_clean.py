"""The independent oracles stay quiet on the clean engine: every draft kind, every
model, every engine variant (overlap off, spec off, each seed variant, tensor-parallel
ranks, both reserve rules), under a seeded schedule — and they are really fed (the
golden and accept checks judge every request, the backup check sees spans)."""
import dataclasses

import pytest

from overlapcheck.engine import EngineConfig
from overlapcheck.engine import config as engine_config
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

pytestmark = pytest.mark.usefixtures("one_thread")

ORACLES = ("golden", "accept-oracle", "kv-backup", "runtime-memory")
VARIANTS = {
    "standard": {}, "non-overlap": {"overlap": False}, "no-spec": {"spec": False},
    "exact-reserve": {"draft_reserve": "exact"}, "zero-bubble": {"zero_bubble": True},
    "kv-backup": {"kv_backup": True}, "verify-sync": {"verify_sync": True}, "tp2": {"tp": 2},
    "all-seeds": {"zero_bubble": True, "kv_backup": True, "verify_sync": True},
}
MODELS = engine_config.MODELS + ("trained", "random:tiny-llama")
LIGHT = ("oracle", "oracle-hostlens")


def _cfg(model, kind, variant, seed):
    base = dict(page_size=(1, 4)[seed % 2], pool_tokens=(96, 512)[seed % 2], row_width=64,
                max_running=4, chunk_size=16, spec_steps=(3, 6)[seed % 2], draft_kind=kind,
                model=model)
    return EngineConfig(**{**base, **VARIANTS[variant]})


class Seen:
    """Counts what the oracles were fed."""

    name, fatal = "seen", False

    def __init__(self):
        self.verified = self.spans = 0

    def feed(self, ev):
        if isinstance(ev, E.Verified) and not ev.dropped:
            self.verified += 1
        if isinstance(ev, E.Canary) and ev.backup and ev.backup[1] > ev.backup[0]:
            self.spans += 1
        return []

    def finish(self):
        return []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("kind", sorted(DRAFT_KINDS))
@pytest.mark.parametrize("model", MODELS)
def test_oracles_quiet_on_clean_runs(model, kind, variant):
    light = model in LIGHT
    seeds = range(2) if light else range(1)
    for seed in seeds:
        cfg = _cfg(model, kind, variant, seed)
        wl = generate(seed, 6 if light else 2, cfg, max_new=20 if light else 6)
        out = execute(Case(cfg, wl, ScheduleSpec(("random", "pct")[seed], seed), ORACLES))
        assert out.status == "completed"
        assert not out.findings, "\n".join(f.text for f in out.findings[:3])


@pytest.mark.parametrize("kind", sorted(DRAFT_KINDS))
def test_the_backup_check_runs_on_clean_runs(kind):
    """Every decode record of a kv-backup run carries the host-pool check, over spans
    that grow to the committed length (a check that saw nothing would be quiet too)."""
    from fake_models import make_model
    from invariants import make_checkers
    from overlapcheck import targets
    from overlapcheck.device import make_runtime
    from overlapcheck.engine import Engine
    from overlapcheck.run import Monitor
    cfg = _cfg("oracle", kind, "kv-backup", 1)
    wl = generate(3, 6, cfg, max_new=20)
    seen = Seen()
    mon = Monitor([seen] + make_checkers(ORACLES, **targets.get("reference").checker_context(cfg)))
    Engine(cfg, make_runtime("sim", seed=3, strategy="random", access="declared"),
           make_model(cfg.model), mon).run(wl)
    assert not mon.finish()
    assert seen.spans > 0 and seen.verified > 0

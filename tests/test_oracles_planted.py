"""The independent oracles (golden, accept-oracle, kv-backup, runtime-memory) each find
their planted bug from a cold start — a small seeded fuzz loop over configs, workloads
and schedules — while every other checker stays quiet.

Each bug is planted in every engine the test process builds, the parity reference's
too (a patched kernel), or in a test-only ``Engine`` subclass: exactly the bugs both
schedules share, which parity cannot see (docs/design.md §9.3)."""
import dataclasses
import random

import pytest

from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.engine import drafts_eagle, drafts_mtp
from overlapcheck.engine import kernels as K
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

pytestmark = pytest.mark.usefixtures("one_thread")

STRATEGIES = ("stalls", "random", "pct", "buggify")


def _case(i: int, **pin) -> Case:
    """Cold-start example ``i``: a seeded config, workload and schedule."""
    rng = random.Random(i)
    page = rng.choice((1, 2, 4))
    k = rng.randint(1, 5)
    row = -(-(2 * (k + 1) + rng.randint(10, 40)) // page) * page
    base = dict(page_size=page, row_width=row, pool_tokens=page + row * rng.randint(2, 6),
                max_running=rng.randint(1, 5), chunk_size=rng.randint(2, 24), spec_steps=k,
                draft_reserve=rng.choice(("double", "exact")), overlap=rng.random() < 0.75,
                draft_kind=rng.choice(("standalone", "eagle", "mtp")),
                model=rng.choice(("oracle", "oracle", "oracle-hostlens")),
                zero_bubble=rng.random() < 0.25, kv_backup=rng.random() < 0.25,
                verify_sync=rng.random() < 0.25)
    base.update(pin)
    cfg = EngineConfig(**base)
    wl = generate(i, rng.randint(1, 6), cfg, max_new=rng.randint(4, 24),
                  abort_rate=rng.choice((0.0, 0.2)))
    return Case(cfg, wl, ScheduleSpec(rng.choice(STRATEGIES), i))


def cold_start(checker: str, budget: int = 40, engine=None, **pin):
    """Run examples 0, 1, ... until ``checker`` reports; every other checker must stay
    quiet in every example run. Returns (examples run, the first violation)."""
    options = {"engine": engine} if engine is not None else {}
    for i in range(budget):
        out = execute(_case(i, **pin), **options)
        others = [f.text for f in out.findings if f.checker != checker]
        assert not others, f"example {i}: other checkers fired: {others[:3]}"
        assert out.status == "completed", (i, out.status)
        mine = [v for v in out.violations if v.checker == checker]
        if mine:
            return i + 1, mine[0]
    raise AssertionError(f"{checker} found nothing in {budget} examples")


class _ShiftedTarget:
    """The model with its target reading one position short: the token at ``pos`` is
    computed from the KV of ``0..pos-2`` (``pos`` read for ``pos + 1``)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def target(self, kv, table, rows, ctx_lens, seeds, seeded):
        return self.model.target(kv, table, rows, ctx_lens - 1, seeds, seeded)


def test_golden_finds_the_verify_reading_pos_for_pos_plus_one(monkeypatch):
    verify = K.verify
    monkeypatch.setattr(K, "verify", lambda model, *a: verify(_ShiftedTarget(model), *a))
    n, v = cold_start("golden", spec=True)
    assert v.site == ("token",) and "not the model's continuation" in v.message
    assert v.expected.startswith("token ") and v.seen.startswith("token ")
    assert n <= 10, n


def test_golden_finds_the_no_spec_decode_reading_pos_for_pos_plus_one(monkeypatch):
    decode = K.decode
    monkeypatch.setattr(K, "decode", lambda model, *a: decode(_ShiftedTarget(model), *a))
    n, v = cold_start("golden", spec=False)
    assert v.site == ("token",) and v.details["rid"] >= 0
    assert n <= 10, n


def test_accept_oracle_finds_the_eagle_extend_keeping_one_position_too_many(monkeypatch):
    extend = drafts_eagle.eagle_extend

    def one_more(model, head, kv, ekv, table, meta, lens, out_tok, out_acc, *rest):
        return extend(model, head, kv, ekv, table, meta, lens, out_tok, out_acc + 1, *rest)

    monkeypatch.setattr(drafts_eagle, "eagle_extend", one_more)
    n, v = cold_start("accept-oracle", spec=True, draft_kind="eagle")
    assert v.site == ("accept-length",) and "eagle drafts" in v.expected
    assert v.details["expected"] != v.details["seen"]


def test_accept_oracle_finds_the_mtp_extend_keeping_one_position_too_many(monkeypatch):
    seed = drafts_mtp.mtp_seed
    monkeypatch.setattr(drafts_mtp, "mtp_seed", lambda model, kv, table, meta, lens, out_acc, *r:
                        seed(model, kv, table, meta, lens, out_acc + 1, *r))
    n, v = cold_start("accept-oracle", spec=True, draft_kind="mtp")
    assert "mtp drafts" in v.expected and f"committed length {v.details['committed']}" in v.expected


def test_kv_backup_finds_the_backup_copying_k_positions_instead_of_k_plus_one(monkeypatch):
    backup = K.backup_kv

    def short(kv, host_kv, table, host_table, meta, lens, out_acc, width, b):
        return backup(kv, host_kv, table, host_table, meta, lens, out_acc, width - 1, b)

    monkeypatch.setattr(K, "backup_kv", short)
    n, v = cold_start("kv-backup", spec=True, kv_backup=True)
    assert v.site == ("content",) and "differ from the target KV" in v.message
    start, end = v.details["span"]
    assert start <= v.details["position"] < end


class LeaksStagedCells(Engine):
    """The worker never frees the staged request->token cells buffer of a launch."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        free = self.rt.free
        self.rt.free = lambda buf: None if buf.name == "cells" else free(buf)


def test_runtime_memory_finds_a_staged_buffer_never_freed():
    n, v = cold_start("runtime-memory", engine=LeaksStagedCells)
    assert n == 1 and "'cells'" in v.seen
    assert v.site in (("unbounded",), ("not-freed", "cells"))


def test_kv_backup_names_a_gap_when_a_decode_is_not_backed_up(monkeypatch):
    """A worker that skips the backup of every second decode leaves positions never
    copied: the span stops short of the committed length."""
    from overlapcheck.engine.worker import SpecWorker
    backup, calls = SpecWorker._backup, []

    def skipping(self, st, meta):
        calls.append(1)
        return backup(self, st, meta) if len(calls) % 2 else []

    monkeypatch.setattr(SpecWorker, "_backup", skipping)
    _, v = cold_start("kv-backup", kv_backup=True)
    assert v.site == ("gap",) and v.details["span"][1] < v.details["committed"]


@pytest.mark.parametrize("checker", ["golden", "accept-oracle", "kv-backup", "runtime-memory"])
def test_each_oracle_is_quiet_on_the_same_cold_start_examples(checker):
    """The loop above, unplanted: no checker reports in its first examples."""
    for i in range(4):
        pin = {"kv_backup": True} if checker == "kv-backup" else {}
        out = execute(dataclasses.replace(_case(i, **pin), checks=(checker,)))
        assert out.status == "completed" and not out.findings, [f.text for f in out.findings]

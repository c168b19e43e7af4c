"""The ring FutureMap (``EngineConfig(future_map="ring")``, docs/design.md §4.11): slots
handed out by a running counter, as SGLang's overlap scheduler does. The clean engine
on it equals the row-indexed one on every draft kind and mode (overlap == non-overlap,
spec == no-spec, every checker quiet, golden included); the host twins and the
declared accesses hold for its kernels; the counter wraps and never hands out a slot
whose next input is still to be read; the fuzzer draws it."""
import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from overlapcheck.engine import EngineConfig
from overlapcheck.engine.future_map import FutureRing, future_slots, padded
from overlapcheck.engine.types import Batch, Entry
from overlapcheck.fuzz.strategies import cases
from overlapcheck.protocol import generate
from overlapcheck.protocol.types import DECODE, PREFILL, RUNNING
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import ENGINE_MODES, assert_parity, run_clean, twins_agree

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = {
    **ENGINE_MODES,
    "tp2": {"tp": 2},
}
# small chunks and few rows: the counter goes round the ring many times per run
BASE = dict(page_size=2, pool_tokens=128, row_width=40, max_running=3, chunk_size=3,
            spec_steps=3, future_map="ring")
LAG = ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),))


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_ring_runs_clean_and_equals_the_row_indexed_engine(kind, mode):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, **MODES[mode]})
    row = dataclasses.replace(cfg, future_map="row", overlap=False, tp=1, zero_bubble=False,
                              kv_backup=False, verify_sync=False)
    for seed in range(2):
        wl = generate(seed, 7, cfg, max_prompt=16, max_new=20)
        ref = execute(Case(row, wl, ScheduleSpec("random", seed))).result
        for sched in (LAG, ScheduleSpec("random", seed)):
            out = execute(Case(cfg, wl, sched))
            assert out.status == "completed" and not out.findings, out.findings[0].text
            assert_parity(ref, out.result, f"{kind}/{mode} seed {seed}", accept=cfg.spec)


@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_ring_spec_equals_no_spec_and_overlap_equals_non_overlap(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind})
    wl = generate(7, 8, cfg, max_prompt=16, max_new=24)
    ref = run_clean(dataclasses.replace(cfg, overlap=False), wl, 7, "eager")
    nospec = run_clean(dataclasses.replace(cfg, overlap=False, spec=False), wl, 7, "eager")
    assert_parity(ref, nospec, f"{kind} spec vs no-spec", accept=False)
    for strategy in ("random", "pct", "buggify"):
        assert_parity(ref, run_clean(cfg, wl, 7, strategy), f"{kind} overlap/{strategy}")


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_ring_tiny_model_and_declared_accesses_under_full_inference(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "model": "tiny", "zero_bubble": True})
    wl = generate(5, 4, cfg, max_prompt=10, max_new=10)
    ref = run_clean(dataclasses.replace(cfg, overlap=False, future_map="row", zero_bubble=False),
                    wl, 5, "eager")
    assert_parity(ref, run_clean(cfg, wl, 5, "random", access="infer"), f"{kind} infer")


@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_ring_host_runs_give_the_kernels_runs(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "zero_bubble": True,
                          "model": "oracle-hostlens"})
    wl = generate(3, 6, cfg, max_prompt=12, max_new=16)
    assert not twins_agree(Case(cfg, wl, ScheduleSpec("random", 5))).findings


class _Req:
    def __init__(self, state):
        self.state = state


def _decode(bid, rids):
    return Batch(bid, bid, DECODE, [Entry(rid, rid) for rid in rids])


def test_the_counter_wraps_and_steps_over_pending_slots():
    cfg = EngineConfig(max_running=2, row_width=40, chunk_size=32, spec_steps=3)
    reqs = {0: _Req(RUNNING), 1: _Req(RUNNING)}
    ring_cfg = dataclasses.replace(cfg, future_map="ring")
    ring = FutureRing(ring_cfg, reqs)
    assert ring.limit == 2 * (3 + 1)                  # max_context 32 in one chunk
    assert future_slots(ring_cfg) == ring.limit + 1 and future_slots(cfg) == 2
    # request 0 is prefilled (its last chunk writes slot 1), then only request 1 runs
    first = ring.assign(Batch(0, 0, PREFILL, [Entry(0, 0, 0, 4, True, True)]))
    assert first == [(1, 1)] and ring.pending == {0: 1}
    held = ring.pending[0]
    seen = set()
    ring.pending[1] = 0
    for bid in range(1, 30):
        (src, dst), = ring.assign(_decode(bid, [1]))
        assert dst != held, "a pending next input was handed out again"
        assert 1 <= dst <= ring.limit and src != dst
        seen.add(dst)
    assert seen == set(range(1, ring.limit + 1)) - {held}     # the counter went round
    # request 0 reads its slot, which is free again once that batch is launched
    (src, _), = ring.assign(_decode(30, [0]))
    assert src == held
    # a request that left the running state frees its slot at once
    reqs[1].state = "finished"
    ring.assign(_decode(31, [0]))
    assert 1 not in ring.pending


def test_padding_takes_slots():
    assert [padded(n, 6) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    cfg = EngineConfig(max_running=6, row_width=40, chunk_size=32, future_map="ring")
    reqs = {r: _Req(RUNNING) for r in range(3)}
    ring = FutureRing(cfg, reqs)
    ring.pending = {r: 0 for r in range(3)}
    ring.assign(_decode(0, [0, 1, 2]))
    assert ring.counter == 4                                  # 3 entries padded to 4


def test_config_and_cli():
    with pytest.raises(ValueError, match="future_map must be one of row, ring"):
        EngineConfig(future_map="hash")
    assert EngineConfig().future_map == "row"
    from overlapcheck.cli import main
    assert main(["run", "--future-map", "ring", "--requests", "4", "--seed", "2",
                 "--chunk-size", "4", "--max-running", "2"]) == 0


def test_the_fuzzer_draws_the_ring_in_some_examples():
    drawn = []

    @settings(max_examples=200, phases=(Phase.generate,), database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(cases())
    def prop(case):
        drawn.append(case.config.future_map)

    prop()
    assert {"row", "ring"} <= set(drawn) and drawn.count("row") > drawn.count("ring")

"""The spec worker alone (``overlapcheck/engine/worker.py``): one batch on the schedule,
forward and copy streams with no host sync inside, the spec-v2 order of a decode's
launches, and result collection after the copy-done event as the only host wait."""
import pytest

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.device.sched import Stalls
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import RequestSpec

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = EngineConfig(pool_tokens=256, row_width=64, max_running=4, chunk_size=32, spec_steps=3)


def engine(cfg=CFG, strategy=None):
    rt = make_runtime("sim", strategy=strategy or Stalls(()), access="declared")
    return Engine(cfg, rt, make_model(cfg.model))


def prefilled(eng, n=2):
    """An engine whose ``n`` requests are prefilled and their results processed."""
    for rid in range(n):
        eng.add(RequestSpec(rid, 0, (3, 1, 4, 1, 5), 12))
    batch = eng.sched.build(0, 0)
    eng.worker.launch(batch)
    eng.inflight.append(batch)
    eng.end_step(None)
    return eng


def test_a_launch_makes_no_host_sync_and_queues_on_three_streams():
    eng = prefilled(engine())
    rt = eng.rt
    before = (rt.syncs, eng.worker.declared_syncs)
    batch = eng.sched.build(1, 1)
    ops = eng.worker.launch(batch)
    assert (rt.syncs, eng.worker.declared_syncs) == before
    queued = {s.name for s in rt.streams if rt._q[s.ctx].enq > 0}
    assert {"schedule", "forward", "copy"} <= queued
    # spec v2 in order: resolve, draft k, verify, accept, draft-extend, stash, copy back
    assert ops[0] == "h2d" and ops[-1] == "d2h"
    body = [o for o in ops if o in ("resolve", "draft1", "draft2", "draft3", "verify",
                                    "accept", "draft_extend", "stash")]
    assert body == ["resolve", "draft1", "draft2", "draft3", "verify", "accept",
                    "draft_extend", "stash"]


def test_collect_waits_for_copy_done_and_is_the_only_sync():
    # the copy stream stalls for the whole run: only the collect's wait may drain it
    eng = prefilled(engine(strategy=Stalls((("copy", 0, 10 ** 9),))))
    rt = eng.rt
    batch = eng.sched.build(1, 1)
    eng.worker.launch(batch)
    assert not eng.dev.done[batch.bid % 2].query()      # the copy has not landed
    syncs = rt.syncs
    toks, accs = eng.worker.collect(batch)
    assert rt.syncs == syncs + 1 and eng.worker.declared_syncs >= 1
    assert len(toks) == len(accs) == 2 and all(1 <= a <= CFG.spec_steps + 1 for a in accs)
    assert all(len(t) == CFG.spec_steps + 1 for t in toks)


def test_a_no_spec_decode_runs_one_decode_kernel():
    eng = prefilled(engine(EngineConfig(**{**CFG.__dict__, "spec": False})))
    ops = eng.worker.launch(eng.sched.build(1, 1))
    assert "decode" in ops and "verify" not in ops and not any(o.startswith("draft") for o in ops)

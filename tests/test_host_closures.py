"""The sim's host twins of the device closures (engine/kernels_host.py, fake_models/
oracle_host.py) give exactly what the torch kernels give: the same runs, digests,
decisions and findings with the twins on and off, on every draft kind, oracle variant
and engine mode; a twin that cannot run or fails leaves the work to its kernel."""
import numpy as np
import pytest
import torch

from fake_models.kv_store import kept_sources as kept_torch
from fake_models.oracle_host import kept_sources as kept_host
from overlapcheck.device import make_runtime
from overlapcheck.engine import EngineConfig, generate
from overlapcheck.run import Case, ScheduleSpec

from engine_checks import ENGINE_MODES, twins_agree

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = {
    **ENGINE_MODES,
    "pages-of-4": {"page_size": 4, "pool_tokens": 192},
    "tight-pool": {"pool_tokens": 96, "max_running": 4},
}


_same = twins_agree


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
@pytest.mark.parametrize("model", ["oracle", "oracle-hostlens"])
def test_twins_give_the_kernels_runs(mode, kind, model):
    cfg = EngineConfig(**{"row_width": 48, "pool_tokens": 256, "draft_kind": kind,
                          "model": model, **MODES[mode]})
    wl = generate(3, 6, cfg, max_prompt=12, max_new=16)
    out = _same(Case(cfg, wl, ScheduleSpec("random", 5)))
    assert out.status == "completed" and not out.findings


@pytest.mark.parametrize("fault", ["no-copy-done-wait", "single-staging-buffer",
                                   "eagle-stash-batch-position", "mtp-draft-reads-unfrozen-kv"])
def test_twins_give_the_kernels_findings_on_stale_data(fault):
    kind = {"eagle-stash-batch-position": "eagle",
            "mtp-draft-reads-unfrozen-kv": "mtp"}.get(fault, "standalone")
    cfg = EngineConfig(row_width=48, pool_tokens=256, draft_kind=kind)
    wl = generate(4, 6, cfg, max_prompt=12, max_new=16)
    lag = ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),))
    found = [_same(Case(cfg, wl, s, faults=(fault,))).findings
             for s in (lag, ScheduleSpec("random", 1))]
    assert any(found)


def test_kept_sources_twin_matches_torch():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n, slots = int(rng.integers(0, 24)), int(rng.integers(1, 10))
        s, keep = rng.integers(0, slots, n), rng.random(n) < 0.5
        want = kept_torch(slots, torch.from_numpy(s), torch.from_numpy(keep)).numpy()
        assert (kept_host(slots, s, keep) == want).all()


def test_a_failing_twin_leaves_the_work_to_its_kernel():
    rt = make_runtime("sim", strategy="eager", access="declared")
    calls = []

    def kernel(t):
        calls.append("kernel")
        t.add_(1)

    def twin(a):
        calls.append("twin")
        raise IndexError("stale index")

    kernel.host_twin = twin
    buf = rt.empty((4,), torch.int64, "x", rt.new_stream("s"))
    s = rt.streams[0]
    rt.launch(s, kernel, buf.t, name="k", writes=[buf])
    rt.synchronize()
    assert calls == ["twin", "kernel"]


def test_twins_run_only_where_nothing_intercepts():
    rt = make_runtime("sim", strategy="eager", access="infer")
    calls = []

    def kernel(t):
        calls.append("kernel")
        t.add_(1)

    kernel.host_twin = lambda a: calls.append("twin")
    s = rt.new_stream("s")
    buf = rt.empty((4,), torch.int64, "x", s)
    rt.launch(s, kernel, buf.t, name="k", writes=[buf])
    rt.synchronize()
    assert calls == ["kernel"]

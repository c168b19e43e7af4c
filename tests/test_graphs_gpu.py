"""CUDA graphs on a real GPU (skipped without one): the engine with its model calls
replayed from graphs gives the same tokens and accept lengths as the same engine
launching every kernel, for every draft kind and model, overlap and not, zero bubble
too; captures succeed and replays happen; ``run --cuda-graphs`` exits 0. With the
detector on (declared accesses) the graphed engine keeps the detector's verdicts: the
recorded race repros are flagged as without graphs, the clean engine is quiet."""
import os
import subprocess
import sys

import pytest

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import generate

from engine_checks import assert_parity
from test_draft_kinds import KINDS

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cfg, wl, model, graphs):
    rt = make_runtime("cuda", detect=False, graphs=graphs)
    eng = Engine(cfg, rt, model)
    res = eng.run(wl)
    assert eng.idle and eng.mem.is_full(), "pool not back to full at idle"
    return res, (eng.worker.model.cache.stats if graphs else None)


@pytest.mark.parametrize("model", ["oracle", "tiny", "trained"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["overlap", "non-overlap", "zero-bubble"])
def test_graphed_engine_equals_eager_engine(model, kind, variant):
    cfg = EngineConfig(page_size=4, pool_tokens=512, row_width=64, max_running=6, chunk_size=16,
                       draft_kind=kind, model=model, overlap=variant != "non-overlap",
                       zero_bubble=variant == "zero-bubble")
    wl = generate(1, 10, cfg, max_new=24)
    m = make_model(model)
    ref, _ = _run(cfg, wl, m, False)
    got, st = _run(cfg, wl, m, True)
    assert_parity(ref, got, f"graphs {model}/{kind}/{variant}")
    assert st.failed == 0, st.errors
    assert st.replayed > st.captured > 0, st


def test_run_command_with_cuda_graphs():
    r = subprocess.run([sys.executable, "-m", "overlapcheck", "run", "--device", "cuda",
                        "--cuda-graphs", "--requests", "6", "--model", "tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "summary:" in r.stdout


RACE_REPROS = ["index-no-record-stream--stream-race-0da77d2192.yaml",
               "no-war-barrier--stream-race-d8669ccfbf.yaml",
               "war-before-extend--stream-race-d8669ccfbf.yaml",
               "verify-sum-unwaited--stream-race-4da65632b5.yaml",
               "backup-not-waited--kv-lifetime-2d008e7f1c.yaml"]


def _detected(case, graphs):
    """``case`` on cuda with the detector on declared accesses: (the checkers of its
    race findings, the detector's report kinds, the engine's outputs, graph stats)."""
    from overlapcheck.run import execute
    rt = make_runtime("cuda", detect=True, access="declared", graphs=graphs)
    out = execute(case, runtime=rt, trace=False)
    race = sorted({f.checker for f in out.findings if f.checker in ("stream-race", "kv-lifetime")})
    return race, sorted({r.kind for r in rt.reports}), out


@pytest.mark.parametrize("name", RACE_REPROS)
def test_detector_verdict_with_graphs_equals_without(name):
    """The detector keeps its verdict when the model calls replay from graphs: each
    race fault's recorded case is flagged by the same checkers with the same report
    kinds, graphed or not (the graphed launches feed their declarations)."""
    from overlapcheck.repro import load
    case = load(os.path.join(ROOT, "tests", "data", "repros_v1", name)).case
    plain = _detected(case, False)
    graphed = _detected(case, True)
    assert plain[0], f"{name}: no race finding on cuda without graphs"
    assert graphed[:2] == plain[:2], (graphed[:2], plain[:2])


def test_detector_with_graphs_is_quiet_on_the_clean_engine_and_replays():
    for kind in KINDS:
        cfg = EngineConfig(page_size=2, pool_tokens=256, row_width=48, max_running=4,
                           chunk_size=8, draft_kind=kind, kv_backup=kind == "standalone")
        wl = generate(3, 8, cfg, max_prompt=12, max_new=20)
        ref, _ = _run(cfg, wl, make_model("oracle"), False)
        rt = make_runtime("cuda", detect=True, access="declared", graphs=True)
        eng = Engine(cfg, rt, make_model("oracle"))
        got = eng.run(wl)
        assert not rt.reports, str(rt.reports[0])
        assert_parity(ref, got, f"graphs+detector {kind}")
        st = eng.worker.model.cache.stats
        assert st.failed == 0 and st.replayed > st.captured > 0, st


def test_graphs_with_access_inference_is_refused():
    with pytest.raises(ValueError, match="declared accesses"):
        make_runtime("cuda", detect=True, access="infer", graphs=True)
    r = subprocess.run([sys.executable, "-m", "overlapcheck", "run", "--device", "cuda",
                        "--cuda-graphs", "--access", "infer", "--requests", "2"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "--cuda-graphs hides" in r.stderr, r.stdout + r.stderr


def test_fuzz_with_cuda_graphs_runs_the_detector():
    r = subprocess.run([sys.executable, "-m", "overlapcheck", "fuzz", "--device", "cuda",
                        "--cuda-graphs", "--model", "trained", "--examples", "4", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

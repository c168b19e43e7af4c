"""CUDA graphs on a real GPU (skipped without one): the engine with its model calls
replayed from graphs gives the same tokens and accept lengths as the same engine
launching every kernel, for every draft kind and model, overlap and not, zero bubble
too; captures succeed and replays happen; ``run --cuda-graphs`` exits 0."""
import os
import subprocess
import sys

import pytest

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig, generate

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

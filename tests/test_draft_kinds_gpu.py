"""On a CUDA device (skipped without one): every draft kind x model runs on the cuda
backend, overlap equals non-overlap per request (tokens and accept lengths), spec
equals no-spec tokens, no race reports, the pool full at the end. Exact equality with
the CPU is not required (the tiny model's floats may differ between devices)."""
import dataclasses

import pytest

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import generate

from engine_checks import assert_parity
from test_draft_kinds import KINDS

pytestmark = pytest.mark.gpu


def _run(cfg, wl, detect):
    rt = make_runtime("cuda", detect=detect, access="declared")
    eng = Engine(cfg, rt, make_model(cfg.model))
    res = eng.run(wl)
    assert not rt.reports, str(rt.reports[0])
    assert eng.idle and eng.mem.is_full(), "pool not back to full at idle"
    return res


@pytest.mark.parametrize("model", ["oracle", "tiny"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_cuda_overlap_equals_non_overlap(kind, model, seed):
    cfg = EngineConfig(page_size=(1, 4)[seed % 2], pool_tokens=(96, 512, 512)[seed], row_width=64,
                       max_running=6, chunk_size=16, draft_kind=kind, model=model)
    wl = generate(seed, 10, cfg, max_new=24)
    ref = _run(dataclasses.replace(cfg, overlap=False), wl, detect=True)
    nospec = _run(dataclasses.replace(cfg, overlap=False, spec=False), wl, detect=True)
    assert_parity(ref, nospec, f"cuda {model}/{kind} seed {seed} spec vs no-spec", accept=False)
    for detect in (True, False):
        got = _run(cfg, wl, detect)
        assert_parity(ref, got, f"cuda {model}/{kind} seed {seed} overlap (detector {detect})")
    assert ref.summary.verifies > 0

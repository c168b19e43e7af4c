"""Draft kinds (standalone, EAGLE-style, frozen-KV MTP) x models (oracle, tiny) on the
sim: parity (overlap == non-overlap per request: tokens, and accept lengths by the
request's own verify count) and lossless (spec == no-spec tokens), every run clean
(no race reports, no undeclared host syncs, the pool full at the end). Then what makes
the kinds observably different: EAGLE's next step resolves the FutureMap row its
previous step stashed, MTP reads the target KV slots of its request and owns no KV."""
import dataclasses

import pytest

from overlapcheck.engine import EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import generate

from engine_checks import assert_parity, run_clean

STRATEGIES = ("random", "pct", "buggify", "eager")
KINDS = tuple(DRAFT_KINDS)


pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(seed, kind, model, **kw):
    base = dict(page_size=(1, 4)[seed % 2], pool_tokens=(72, 96, 512)[seed % 3], row_width=64,
                max_running=6, chunk_size=16, draft_kind=kind, model=model)
    base.update(kw)
    return EngineConfig(**base)


def check(seed, kind, model, n, max_new, strategies, access="declared"):
    """Lossless and parity for one seeded workload; returns the non-overlap result."""
    cfg = _cfg(seed, kind, model)
    wl = generate(seed, n, cfg, max_new=max_new)
    ref = run_clean(dataclasses.replace(cfg, overlap=False), wl, seed, "eager")
    nospec = run_clean(dataclasses.replace(cfg, overlap=False, spec=False), wl, seed, "eager")
    assert_parity(ref, nospec, f"{model}/{kind} seed {seed} spec vs no-spec", accept=False)
    for strategy in strategies:
        got = run_clean(cfg, wl, seed, strategy, access)
        assert_parity(ref, got, f"{model}/{kind} seed {seed} overlap/{strategy}")
    return ref


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_oracle_parity_and_lossless(kind, seed):
    check(seed, kind, "oracle", 10, 30, (STRATEGIES[seed % 4], STRATEGIES[(seed + 1) % 4]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(2))
def test_tiny_parity_and_lossless(kind, seed):
    check(10 + seed, kind, "tiny", 6, 16, (STRATEGIES[seed % 4],))


@pytest.mark.parametrize("model", ["oracle", "tiny"])
@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_declared_accesses_hold_under_full_inference(kind, model):
    check(5, kind, model, 4, 12, ("random",), access="infer")


@pytest.mark.nightly
@pytest.mark.parametrize("model", ["oracle", "tiny"])
@pytest.mark.parametrize("kind", KINDS)
def test_nightly_200_workloads(kind, model):
    n, max_new = (16, 40) if model == "oracle" else (8, 20)
    for seed in range(200):
        check(2000 + seed, kind, model, n, max_new, (STRATEGIES[seed % 4],))


@pytest.mark.parametrize("kind,model", [("eagle", "tiny"), ("mtp", "oracle")])
def test_cli_runs_each_kind(kind, model, capsys):
    from overlapcheck.cli import main
    rc = main(["run", "--draft", kind, "--model", model, "--requests", "2", "--seed", "3",
               "--row-width", "64", "--pool-tokens", "256"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "summary:" in out and "races 0" in out


@pytest.mark.parametrize("argv", [["--draft", "medusa"], ["--model", "huge"]])
def test_cli_bad_draft_or_model_is_a_one_line_error(argv, capsys):
    from overlapcheck.cli import main
    with pytest.raises(SystemExit) as e:
        main(["run"] + argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1

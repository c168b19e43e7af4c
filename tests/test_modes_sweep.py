"""The engine-mode parity sweep of bench/modes.py on the sim: in every mode (standard,
verify-sync, kv-backup, tp2, and zero-bubble when the config has it) seeded workloads
run with every checker on and no finding, with the standard mode's tokens, finish
reasons and accept lengths per request. A few workloads by default; the nightly tier
runs 200. The bench's CLI, its cuda code path (run on the sim) and its figures are
smoke-tested; figures are never asserted."""
import json
import os
import subprocess
import sys

import pytest
import torch
from overlapcheck.engine.drafts import DRAFT_KINDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(ROOT, "bench"))   # bench/ is scripts, not a package

import modes as M  # noqa: E402

ALWAYS = ("standard", "verify-sync", "kv-backup", "tp2")   # modes no sweep config rejects


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def check_seed(seed, device="sim", modes=None, model="oracle", same_device_ref=False):
    rec = M.sweep_one(seed, device, modes, model, same_device_ref)
    for name, m in rec["modes"].items():
        if "skipped" in m:
            assert name not in ALWAYS, f"seed {seed} {name}: {m['skipped']}"
            continue
        assert not m["findings"], f"seed {seed} {name}: {m['findings'][0]}"
        assert m["mismatch"] is None, f"seed {seed} {name} vs standard: {m['mismatch']}"
    return rec


def test_modes_are_detected_from_the_config():
    sim, cuda = M.engine_modes("sim"), M.engine_modes("cuda")
    assert set(ALWAYS) <= set(sim) and "tp2" not in cuda
    has_zb = hasattr(M.EngineConfig(), "zero_bubble")
    assert ("zero-bubble" in sim) == ("zero-bubble" in cuda) == has_zb


def test_sweep_configs_are_varied_and_derived_from_the_seed():
    cfgs = [M.sweep_case(s)[0] for s in range(40)]
    assert M.sweep_case(7) == M.sweep_case(7)
    assert {c.page_size for c in cfgs} == {1, 2, 4} and {c.spec_steps for c in cfgs} == {1, 2, 3, 4}
    assert {c.draft_kind for c in cfgs} == set(DRAFT_KINDS)
    assert {c.pool_tokens >= 512 for c in cfgs} == {True, False}


@pytest.mark.parametrize("seed", range(6))
def test_every_mode_is_clean_and_matches_standard(seed):
    rec = check_seed(seed)
    assert set(M.engine_modes("sim")) == set(rec["modes"])


def test_sweep_exercises_retraction_and_aborts():
    recs = [check_seed(s, modes={"standard": {}}) for s in (0, 1, 2, 3)]
    assert sum(r["modes"]["standard"]["retractions"] for r in recs) > 0
    assert sum(r["modes"]["standard"]["aborts"] for r in recs) > 0


def test_cuda_code_path_on_the_sim():
    """What the cuda sweep and figures run, on the sim: a same-device reference, the
    checked runs, the steady-window throughput per mode as ratios to standard."""
    check_seed(1, modes=M.engine_modes("cuda"), same_device_ref=True)
    out = M.throughput("sim", M.engine_modes("cuda"), "oracle", [2], 2, 1, 2)
    rec = out[2]
    assert set(rec) == set(M.engine_modes("cuda")) | {"non-overlap", "_warm_up"}
    assert rec["standard"]["vs_standard"] == 1.0
    assert rec["standard"]["vs_standard_spread"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert 2 <= rec["_warm_up"]["rounds"] <= 4
    for v in rec.values():
        if "tokens_per_s" in v:    # two rounds, run together, each round's rate by position
            assert v["tokens_per_s_spread"]["median"] == v["tokens_per_s"]
            assert len(v["repeats_tokens_per_s"]) == 2 and v["tokens_per_s_totals"]["min"] > 0
    assert rec["verify-sync"]["declared_per_step"] > rec["standard"]["declared_per_step"]


def test_cli_sweep_and_figures(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "modes.py"), "--device", "sim",
                        "--workloads", "2", "--jobs", "2", "--figure-requests", "4", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "modes.json").read_text())
    assert set(doc["sweep"]) == set(doc["sim_figures"]) == set(M.engine_modes("sim"))
    for t in doc["sweep"].values():
        assert t["runs"] + t["skipped"] == 2 and t["with_findings"] == t["token_mismatches"] == 0
    assert "parity sweep (sim)" in r.stdout and "steps/s" in r.stdout


@pytest.mark.nightly
def test_nightly_200_workloads_per_mode():
    bad = []
    for seed in range(200):
        try:
            check_seed(seed)
        except AssertionError as e:
            bad.append(str(e).splitlines()[0])
    assert not bad, f"{len(bad)} workloads failed, first: {bad[:5]}"

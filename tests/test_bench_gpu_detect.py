"""Smoke test of bench/gpu_detect.py on the simulated device, one fault: the hunt finds
it through its documented checker, the replay through ``run_checked`` finds it again,
the clean runs report nothing, and a second run reuses the cached case."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT = "verify-sum-unwaited"


def _run(out):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_detect.py"),
                           "--device", "sim", "--faults", FAULT, "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_gpu_detect_bench_sim_smoke(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "gpu_detect.json").read_text())
    (row,) = doc["faults"]
    assert (row["fault"], row["checker"], row["cached"]) == (FAULT, "stream-race", False)
    assert row["sim"].startswith("yes (") and row["device_found"], row
    assert row["sanitizer"] == "n/a" and os.path.exists(row["repro"])
    assert doc["clean"]["violations"] == doc["clean"]["reports"] == 0
    assert len(doc["clean"]["runs"]) == 6 and "clean: 6 runs" in r.stdout
    assert FAULT in r.stdout and "PyTorch sanitizer" in r.stdout
    again = _run(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((tmp_path / "gpu_detect.json").read_text())["faults"][0]["cached"]

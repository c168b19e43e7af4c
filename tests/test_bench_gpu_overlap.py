"""Smoke test of bench/gpu_overlap.py on the simulated device: every mode runs a steady
window, checked runs see no violation, the JSON and the profile tables are written.
Figures are not asserted (benchmarks never are)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_overlap_bench_sim_smoke(tmp_path):
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_overlap.py"), "--device", "sim",
                        "--models", "random:tiny-qwen3", "--batch", "2", "--steps", "2", "--windows", "2", "--repeat", "2",
                        "--min-seconds", "0", "--prompt", "3", "--spec-steps", "1", "--page-size", "4",
                        "--profile", "--profile-below", "1000", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "gpu_overlap.json").read_text())
    (c,) = doc["configs"]
    assert (c["model"], c["batch"], doc["device"]) == ("random:tiny-qwen3", 2, "sim")
    assert set(c["modes"]) == {"overlap", "non-overlap", "checked", "checked+detector"}
    for mode, m in c["modes"].items():
        # every mode times the same range: two windows of 2 steps, the same tokens
        assert m["tokens_per_s"] > 0 and m["timed_steps"] == 4, (mode, m)
        assert m["timed_tokens"] == c["modes"]["overlap"]["timed_tokens"] > 0, (mode, m)
        assert [len(w) for w in m["window_tokens_per_s"]] == [2, 2], (mode, m)
        sp = m["tokens_per_s_spread"]
        assert sp["min"] <= sp["median"] == m["tokens_per_s"] <= sp["max"], (mode, m)
        assert len(m["repeats_tokens_per_s"]) == 2, (mode, m)   # both rounds, run at once
        # on the sim nothing blocks: the host's own work is all of a step's time
        assert sum(m["window_tokens"]) == m["timed_tokens"] and "window_tokens_differ" not in m, (mode, m)
        steps_per_s = [t * m["timed_steps"] / m["timed_tokens"] for t in m["repeats_tokens_per_s_totals"]]
        assert m["repeats_host_ms_per_step"] == [pytest.approx(1e3 / x, rel=1e-2) for x in steps_per_s], (mode, m)
        assert m["syncs_per_step"] >= m["declared_per_step"] > 0, (mode, m)
        assert m.get("violations", []) == [], (mode, m)
    assert c["overlap_speedup"] > 0 and c["checked_ratio"] > 0
    assert c["overlap_speedup_spread"]["median"] == c["overlap_speedup"]
    assert 2 <= c["warm_up"]["rounds"] <= 4 and doc["gpu"] is None
    assert doc["args"]["pdl"] is False       # no card: plain launches
    assert (c["window_steps"], c["windows"]) == (2, 2) and c["row_width"] % 4 == 0
    assert set(c["profiles"]) == {"overlap", "non-overlap"}
    for path in c["profiles"].values():
        assert "one steady decode step" in open(path).read()
    assert "overlap/non-overlap" in r.stdout and "windows of every round and mode interleaved" in r.stdout
    assert c["interleave"] == "repeats" and c["checked_ratio_pairs"]["median"] > 0
    assert c["checked_ratio_totals"]["median"] > 0 and "(totals " in r.stdout


def test_gpu_overlap_bench_runs_one_mode_after_another(tmp_path):
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_overlap.py"), "--device", "sim",
                        "--models", "random:tiny-qwen3", "--batch", "1", "--steps", "2", "--windows", "2",
                        "--repeat", "1", "--modes", "overlap,checked", "--interleave", "off",
                        "--min-seconds", "0", "--prompt", "3", "--spec-steps", "1", "--page-size", "4",
                        "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (c,) = json.loads((out / "gpu_overlap.json").read_text())["configs"]
    assert c["interleave"] == "off" and set(c["modes"]) == {"overlap", "checked"}
    assert "--repeat 1 is odd: the start order is not balanced" in r.stdout
    assert c["modes"]["checked"]["timed_tokens"] == c["modes"]["overlap"]["timed_tokens"] > 0
    assert c["checked_ratio"] > 0 and "windows interleaved" not in r.stdout


@pytest.mark.parametrize("windows,note", [(2, False), (3, True)])
def test_an_odd_repeat_is_unbalanced_only_where_the_windows_do_not_balance_each_round(tmp_path, windows, note):
    """Interleaved, a round's modes take turns backward on odd windows: an even
    ``--windows`` balances every round, whatever ``--repeat`` is."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_overlap.py"), "--device", "sim",
                        "--models", "random:tiny-qwen3", "--batch", "1", "--steps", "1", "--windows",
                        str(windows), "--repeat", "1", "--modes", "overlap,non-overlap",
                        "--warmup-rounds", "2", "--min-seconds", "0", "--prompt", "3", "--spec-steps", "1",
                        "--page-size", "4", "--out", str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("--repeat 1 is odd and so is --windows 3: the start order is not balanced" in r.stdout) == note, r.stdout


def test_gpu_overlap_bench_refuses_dependent_launch_without_a_card_for_it():
    """``--pdl on`` where no card can launch that way: a one-line error, exit 2, nothing
    run; ``auto`` (the default) records what it chose."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_overlap.py"), "--device", "sim",
                        "--pdl", "on"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2 and "--pdl on" in r.stderr.splitlines()[-1], r.stderr
    assert "model" not in r.stdout

"""bench/fuzz_rate.py runs one job and two and reports their ratio (figures only: the
rates themselves are not asserted)."""
import importlib.util
import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                     "fuzz_rate.py")


def test_one_and_two_jobs_give_rows_and_a_ratio():
    # a box a few times a process's start-up (torch's import): a campaign whose start-up
    # takes its whole box runs nothing and has no ratio
    p = subprocess.run([sys.executable, BENCH, "--seconds", "6", "--jobs", "1,2", "--json",
                        "--rounds", "2", "--ceiling"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)
    assert [r["jobs"] for r in rows] == [1, 2]
    assert all(r["steps"] > 0 and r["examples"] > 0 and r["findings"] == 0 for r in rows)
    assert all(r["rounds"] == 2 and len(r["ratio_rounds"]) == 2 for r in rows)
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] is not None
    assert rows[1]["ratio_min"] <= rows[1]["ratio"] <= rows[1]["ratio_max"]
    # the machine's own ratio for two processes of plain work, and the campaign's over it
    assert rows[0]["machine_ratio"] == rows[0]["machine_32mib_ratio"] == 1.0
    assert rows[1]["machine_ratio"] > 0 and rows[1]["machine_32mib_ratio"] > 0
    assert rows[1]["of_machine"] == round(rows[1]["ratio"] / rows[1]["machine_ratio"], 3)


def test_rounds_alternate_and_divide_by_their_own_one_job_rate(monkeypatch):
    """A round's ratio uses that round's one-job rate: a host that halves its speed
    between rounds moves the rates, not the ratios."""
    spec = importlib.util.spec_from_file_location("fuzz_rate", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    order, speed = [], iter([100, 180, 90, 90, 50, 50, 200, 360, 180])
    def fake_run_jobs(opts, jobs):
        order.append(jobs)
        return {"steps": next(speed) * opts.seconds, "seconds": opts.seconds,
                "cpu_seconds": opts.seconds * jobs, "examples": 7, "findings": []}
    monkeypatch.setattr(bench, "run_jobs", fake_run_jobs)
    rows = bench.run_rounds([1, 2, 4], 2.0, 0, 3)
    assert order == [1, 2, 4, 4, 2, 1, 1, 2, 4]
    one, two, four = rows
    assert one["steps_per_s_rounds"] == [100, 50, 200] and one["ratio_rounds"] == [1, 1, 1]
    assert two["ratio_rounds"] == [0.9, 0.5, 0.9] and two["ratio"] == 0.9
    assert four["ratio_rounds"] == [0.225, 0.45, 0.225] and four["ratio_max"] == 0.45
    # without one job in the list there is nothing to divide by
    order.clear()
    speed = iter([10, 10])
    assert [r["ratio"] for r in bench.run_rounds([2], 1.0, 0, 2)] == [None]


def test_bad_job_counts_exit_2():
    for bad in (["--jobs", "1,x"], ["--jobs", "0"], ["--rounds", "0"], ["--seconds", "0"]):
        p = subprocess.run([sys.executable, BENCH] + bad, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and bad[0] in p.stderr.strip().splitlines()[-1]

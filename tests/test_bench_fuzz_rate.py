"""bench/fuzz_rate.py runs one job and two and reports their ratio (figures only: the
rates themselves are not asserted)."""
import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                     "fuzz_rate.py")


def test_one_and_two_jobs_give_rows_and_a_ratio():
    p = subprocess.run([sys.executable, BENCH, "--seconds", "2", "--jobs", "1,2", "--json",
                        "--ceiling"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout)
    assert [r["jobs"] for r in rows] == [1, 2]
    assert all(r["steps"] > 0 and r["examples"] > 0 and r["findings"] == 0 for r in rows)
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] is not None
    # the machine's own ratio for two processes of plain work, and the campaign's over it
    assert rows[0]["machine_ratio"] == rows[0]["machine_32mib_ratio"] == 1.0
    assert rows[1]["machine_ratio"] > 0 and rows[1]["machine_32mib_ratio"] > 0
    assert rows[1]["of_machine"] == round(rows[1]["ratio"] / rows[1]["machine_ratio"], 3)


def test_bad_job_counts_exit_2():
    for bad in ("1,x", "0"):
        p = subprocess.run([sys.executable, BENCH, "--jobs", bad], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and "--jobs" in p.stderr.strip().splitlines()[-1]

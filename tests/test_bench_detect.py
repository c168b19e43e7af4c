"""Smoke test of bench/detect.py: two faults (one of them rerun with the race checkers
off) and the clean engine, one short campaign each: the table, the clean line and the
JSON it writes, each fault with its zoo class."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_detect_bench_smoke(tmp_path):
    out = tmp_path / "detect.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "detect.py"),
                        "--fault", "backup-not-waited", "--fault", "no-war-barrier",
                        "--runs", "1", "--seconds", "4", "--shrink", "2", "--jobs", "1",
                        "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    rows = {row["fault"]: row for row in doc["faults"]}
    assert set(rows) == {"backup-not-waited", "no-war-barrier"}
    assert all(row["found"] == 1 and isinstance(row["cls"], int) for row in rows.values()), rows
    [off] = doc["race_off"]
    assert off["fault"] == "no-war-barrier" and isinstance(off["cls"], int)
    assert doc["clean"]["findings_total"] == 0
    assert "clean engine: 0 finding(s) in 1 campaigns" in r.stdout
    assert "stream-race and kv-lifetime off" in r.stdout

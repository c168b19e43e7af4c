"""The nightly job on a shared example database: every campaign gets the Redis server
beside its local folder, what it found lands on the server, and a server that does not
answer stops the job before it starts (one line, exit 2)."""
import json
import os
import subprocess
import sys

from fleet_redis import free_port, redis_server  # noqa: F401 - a fixture
from overlapcheck.fuzz.db import KEY_PREFIX, connect_redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "ci", "nightly_gpu.py")


def nightly(*args, env=None):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=240, env=env)


def test_campaigns_save_to_the_shared_database(tmp_path, redis_server):
    out = str(tmp_path / "out")
    env = dict(os.environ, OVERLAPCHECK_SHARED_DB=redis_server.url)
    r = nightly("--device", "sim", "--minutes", "1", "--campaign-seconds", "10",
                "--max-campaigns", "1", "--models", "oracle", "--fault", "unaligned-tail-free",
                "--shrink-seconds", "2", "--seed", "7", "--out", out, "--no-sanitizer", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    with open(os.path.join(out, "summary.json")) as fh:
        s = json.load(fh)
    assert s["shared_db"] == redis_server.url
    c = s["campaigns"][0]
    assert f"--db {os.path.join(out, 'hypothesis-db')} --db {redis_server.url}" in c["command"]
    assert c["status"] == "findings" and c["findings"]
    saved = connect_redis(redis_server.url).keys(KEY_PREFIX + b"*")
    assert saved, "nothing reached the shared database"
    assert os.listdir(os.path.join(out, "hypothesis-db"))      # and the local folder too


def test_an_unreachable_shared_database_stops_the_job_with_one_line(tmp_path):
    r = nightly("--device", "sim", "--minutes", "1", "--out", str(tmp_path / "out"),
                "--shared-db", f"redis://127.0.0.1:{free_port()}/0")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot reach the Redis server" in r.stderr

"""``fuzz --ray``: campaign slices on a local Ray cluster of 2 worker processes find what
``-j 2`` finds for the same seed and example budget; a slice whose worker is killed is
rerun, and reported as lost when that dies too, within the time box; an address that
does not answer is one line and exit 2."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from fleet_redis import free_port

FUZZ = [sys.executable, "-m", "overlapcheck", "fuzz"]
FAULT = ["--fault", "lagged-verify-counted"]     # three metrics findings, shrunk in seconds


def _fuzz(tmp_path, *args, timeout=300):
    tmp_path.mkdir()
    p = subprocess.run(FUZZ + list(args) + ["--json", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return json.loads(p.stdout)


def test_ray_slices_find_what_the_local_pool_finds(tmp_path):
    pool = _fuzz(tmp_path / "pool", "-j", "2", "--examples", "24", "--seed", "11", *FAULT)
    ray = _fuzz(tmp_path / "ray", "--ray", "local:2", "--examples", "24", "--seed", "11", *FAULT)
    ids = sorted(f["id"] for f in pool["findings"])
    assert ids and sorted(f["id"] for f in ray["findings"]) == ids
    assert ray["examples"] == pool["examples"] == 24 and ray["lost"] == []
    assert [s["attempts"] for s in ray["ray"]["slices"]] == [1, 1]
    # each repro written once, by the driver, and it reproduces
    for f in ray["findings"]:
        assert f["repro"].startswith(str(tmp_path / "ray" / "out"))
        assert subprocess.run([sys.executable, "-m", "overlapcheck", "replay", f["repro"]],
                              capture_output=True, timeout=120).returncode == 1


STARTED = re.compile(r"^\[slice 0\] started on \S+ \(pid (\d+)\)")


def test_a_killed_worker_is_rerun_then_reported_and_nothing_hangs(tmp_path):
    box = 40.0
    t0 = time.monotonic()
    p = subprocess.Popen(FUZZ + ["--ray", "local:2", "--time", str(box), "--seed", "3",
                                 "--out", str(tmp_path / "out")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    lines, killed = [], []

    def watch():      # kill slice 0's worker each time it starts: the run, then its rerun
        for line in p.stderr:
            lines.append(line)
            m = STARTED.match(line)
            if m:     # at once: a rerun started late in the box could finish in a wait
                time.sleep(0.5)
                killed.append(int(m.group(1)))
                try:
                    os.kill(killed[-1], signal.SIGKILL)
                except ProcessLookupError:
                    pass

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        p.wait(timeout=box + 60)     # stderr is the reader's alone; stdout is a few lines
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the campaign hung past its time box:\n" + "".join(lines[-20:]))
    wall = time.monotonic() - t0
    reader.join(10)
    out = p.stdout.read()
    text = "".join(lines) + out
    # on a loaded machine Ray may start the rerun when the box has ended: it then runs
    # nothing (a campaign's box holds whatever its start-up took) and ends before the kill
    late = re.search(r"\[slice 0\] \[ *[\d.]+s\] examples 0,", text)
    if late and "(rerun: its worker was lost)" in text and "[slice 0] lost: " not in text:
        assert p.returncode == 0 and wall < box + 30, (p.returncode, wall)
        return
    assert "[slice 0] lost: " in text, text
    if len(killed) == 1:
        # on a loaded machine Ray may not start the rerun's worker before the box ends:
        # then the slice is cancelled at the box's grace, which is a loss reported too
        assert "[slice 0] lost: still running" in text, text
    else:
        assert len(killed) == 2 and "(rerun: its worker was lost)" in text, text
    assert p.returncode == 1 and "lost: slice 0" in out, out
    assert re.search(r"\[slice 1\] \[ *\d", text), text         # the other slice worked on
    assert wall < box + 30, wall     # the box, the command's own start and the cluster's stop


def test_an_unreachable_ray_address_is_one_line_exit_2(capsys):
    from overlapcheck.cli import main
    for address, says in ((f"127.0.0.1:{free_port()}", "cannot reach the Ray cluster"),
                          ("local:x", "local:N"), ("nowhere", "HOST:PORT")):
        assert main(["fuzz", "--examples", "1", "--ray", address]) == 2, address
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err, (address, err)

"""A campaign loses nothing: each finding is on disk when it is first reported, replaced
by smaller cases as Hypothesis shrinks it; SIGINT and SIGTERM stop a campaign with its
summary and its findings, a second SIGINT exits at once, ``kill -9`` loses at most the
example in flight; campaigns sharing ``--out`` keep each other's repros; ``fuzz --time
T`` ends by T + 1 s, one job or several (with a tolerance here: the machine is shared)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from overlapcheck.fuzz.campaign import Campaign, Options
from overlapcheck.repro import load, replay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT = ("lagged-verify-counted",)       # metrics findings in the first examples
LOUD = ["--fault", "no-war-barrier"]     # dozens of findings in the first seconds
SLACK = 3.0     # on top of the promised second: other work shares this machine's 2 cores

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_finding_is_on_disk_when_reported_and_replaced_by_its_smaller_cases(tmp_path):
    seen = {}

    def on_finding(found):
        assert os.path.exists(found.repro)       # written before anyone hears of it
        r = load(found.repro)
        assert r.finding.key == found.finding.key
        seen.setdefault(found.finding.ident, []).append(len(r.case.workload.requests))

    out = str(tmp_path / "out")
    s = Campaign(Options(seconds=None, examples=12, seed=2, faults=FAULT, out=out,
                         on_finding=on_finding)).run().summary()
    assert s["findings"] and set(seen) == {f["id"] for f in s["findings"]}
    for f in s["findings"]:
        sizes = seen[f["id"]]
        assert sizes == sorted(sizes, reverse=True)          # only ever replaced by smaller
        assert sizes[-1] == f["repro_requests"] == len(load(f["repro"]).case.workload.requests)
        assert replay(load(f["repro"])).verdict == "reproduced"
    assert not [n for n in os.listdir(out) if n.startswith(".tmp")]


def test_campaigns_sharing_an_out_folder_keep_each_others_repros(tmp_path):
    out = str(tmp_path / "out")
    first = Campaign(Options(seconds=None, examples=6, seed=2, faults=FAULT, out=out)).run()
    kept = {f.repro: open(f.repro).read() for f in first.found.values()}
    second = Campaign(Options(seconds=None, examples=6, seed=5, faults=FAULT, out=out)).run()
    assert {path: open(path).read() for path in kept} == kept       # untouched
    ids = {f.finding.ident for f in first.found.values()}
    both = [f for f in second.found.values() if f.finding.ident in ids]
    assert both, "the second campaign finds a bug the first one found"
    for f in both:
        assert f.repro not in kept and re.search(r"-\d+\.yaml$", f.repro), f.repro
        assert load(f.repro).finding.key == f.finding.key
        assert os.path.exists(f.repro[:-5] + ".trace.json")


class Fuzz:
    """``overlapcheck fuzz ARGS`` in a child process, its stderr read as it comes."""

    def __init__(self, tmp_path, *args):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.out = str(tmp_path / "out")
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([sys.executable, "-m", "overlapcheck", "fuzz", "--out",
                                   self.out, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines, self.found = [], threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line)
            if re.match(r"(\[job \d+\] )?finding ", line):
                self.found.set()

    def wait_for_a_finding(self, timeout=120):
        assert self.found.wait(timeout), "".join(self.lines[-20:])

    def end(self, timeout=60):
        out = []
        drain = threading.Thread(target=lambda: out.append(self.p.stdout.read()), daemon=True)
        drain.start()
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail("the campaign did not end:\n" + "".join(self.lines[-20:]))
        wall = time.monotonic() - self.t0
        drain.join(30)
        self.reader.join(10)
        return self.p.returncode, "".join(out), wall

    def reported(self):
        """The repro paths of the findings the campaign reported on stderr."""
        return [m.group(1) for m in (re.search(r" -> (\S+\.yaml)$", line)
                                     for line in self.lines) if m]


def _all_load(paths):
    assert paths
    for path in paths:
        assert load(path).finding.checker      # whole and valid


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigint_stops_the_campaign_with_its_summary_and_keeps_every_finding(tmp_path, jobs):
    f = Fuzz(tmp_path, "-j", jobs, "--time", "120", *LOUD)
    f.wait_for_a_finding()
    stopped = time.monotonic()
    f.p.send_signal(signal.SIGINT)
    rc, out, _ = f.end()
    assert rc == 1 and "stopped early (SIGINT)" in out, out + "".join(f.lines[-5:])
    assert time.monotonic() - stopped < 1.0 + SLACK
    listed = re.findall(r" -> (\S+\.yaml)", out)
    assert set(f.reported()) <= set(listed)
    _all_load(listed)
    assert "Traceback" not in "".join(f.lines)


def test_sigterm_stops_like_sigint(tmp_path):
    f = Fuzz(tmp_path, "--time", "120", *LOUD)
    f.wait_for_a_finding()
    f.p.send_signal(signal.SIGTERM)
    rc, out, _ = f.end()
    assert rc == 1 and "stopped early (SIGTERM)" in out, out
    _all_load(re.findall(r" -> (\S+\.yaml)", out))


def test_a_second_sigint_exits_at_once_keeping_what_was_written(tmp_path):
    f = Fuzz(tmp_path, "--time", "120", *LOUD)
    f.wait_for_a_finding()
    f.p.send_signal(signal.SIGINT)
    t0 = time.monotonic()     # (two signals before the handler runs are one: wait for it)
    while not any("stopping" in line for line in f.lines) and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    f.p.send_signal(signal.SIGINT)
    rc, _, _ = f.end(timeout=10)
    assert rc == 130, "".join(f.lines[-5:])
    assert any("exiting now" in line for line in f.lines)
    _all_load(f.reported())


def test_kill_9_loses_at_most_the_example_in_flight(tmp_path):
    f = Fuzz(tmp_path, "--time", "120", *LOUD)
    f.wait_for_a_finding()
    time.sleep(1.0)
    f.p.kill()
    f.end()
    reported = f.reported()
    _all_load(reported)      # every finding it had reported is on disk, whole
    assert replay(load(reported[0])).verdict == "reproduced"
    # the write in flight may have left its part file, named by the killed process;
    # the next campaign on the folder removes it and keeps every repro
    parts = [n for n in os.listdir(f.out) if n.startswith(".tmp")]
    assert all(f"-{f.p.pid}-" in n and n.endswith(".part") for n in parts), parts
    before = {n: open(os.path.join(f.out, n)).read() for n in os.listdir(f.out)
              if n.endswith(".yaml")}
    said = []
    Campaign(Options(seconds=None, examples=1, seed=3, faults=FAULT, out=f.out,
                     progress=said.append)).run()
    assert not [n for n in os.listdir(f.out) if n.startswith(".tmp")]
    assert all(open(os.path.join(f.out, n)).read() == text for n, text in before.items())
    assert bool(parts) == any("killed campaign" in line for line in said), said


def test_a_live_writers_part_file_is_kept(tmp_path):
    """Two campaigns share ``--out``: one's sweep never takes the other's file in flight."""
    from overlapcheck.repro.format import _temp_prefix, sweep_stale
    live = tmp_path / (_temp_prefix() + "abc.part")
    live.write_text("half")
    dead = tmp_path / (_temp_prefix().rsplit("-", 2)[0] + "-999999999-abc.part")
    dead.write_text("half")
    other_host = tmp_path / ".tmp-elsewhere-999999999-abc.part"
    other_host.write_text("half")
    assert sweep_stale(str(tmp_path)) == [dead.name]
    assert live.exists() and other_host.exists() and not dead.exists()


def _boot() -> float:
    """Seconds this machine takes now to start a Python process (before the command's
    own clock starts)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=120)
    return time.monotonic() - t0


@pytest.mark.parametrize("args", [[], [*LOUD], ["-j", "2", *LOUD]])
def test_the_time_box_holds(tmp_path, args):
    """The box counts from the command's start, start-up included: on a loaded machine
    whose imports take longer than the box, start-up stops at the box's end."""
    box = 8.0
    f = Fuzz(tmp_path, "--time", str(box), "--json", *args)
    rc, out, wall = f.end(timeout=180)
    assert rc in (0, 1), "".join(f.lines[-10:])
    s = json.loads(out)
    assert wall <= box + 1 + _boot() + SLACK, (wall, s)


@pytest.mark.parametrize("args", [[], ["-j", "2"]])
def test_a_box_shorter_than_start_up_ends_with_it(tmp_path, args):
    """A box shorter than importing the engine: the command says start-up took the box,
    runs nothing, writes nothing, exits 0 by the box's end, or right after its flags
    are checked where that took longer (usage errors come first)."""
    box = 0.3
    f = Fuzz(tmp_path, "--time", str(box), "--json", *args)
    rc, out, wall = f.end(timeout=120)
    s = json.loads(out)
    assert rc == 0 and s["examples"] == 0 and s["findings"] == [], (rc, s)
    assert "start-up took the whole time box" in "".join(f.lines)
    assert wall <= max(box, s["flags_checked_seconds"]) + 1 + _boot() + SLACK, (wall, s)
    assert not os.path.exists(f.out) or not os.listdir(f.out)

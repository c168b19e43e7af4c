"""The ``overlapcheck_watch`` fixture, loaded as a plugin in a separate pytest run."""
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

TESTS = """
import pytest
import torch

from overlapcheck.watch import RaceFound


def racy():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(4, device="cuda")
        pinned = torch.empty(4, pin_memory=True)
        pinned.copy_(x, non_blocking=True)
    return pinned.tolist()


@pytest.mark.overlapcheck_watch(device="cpu")
def test_raise_mode_fails_at_the_racy_line(overlapcheck_watch):
    racy()


@pytest.mark.overlapcheck_watch(device="cpu")
def test_the_watch_is_active_in_the_body(overlapcheck_watch):
    assert overlapcheck_watch.device == "cpu"
    with pytest.raises(RaceFound):
        racy()


@pytest.mark.overlapcheck_watch(device="cpu", mode="log")
def test_log_mode_fails_at_teardown(overlapcheck_watch):
    racy()


@pytest.mark.overlapcheck_watch(device="cpu", mode="log")
def test_clean_body_passes(overlapcheck_watch):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(4, device="cuda")
    s.synchronize()
    assert x.tolist() == [1.0] * 4
"""


def test_fixture_verdicts(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(TESTS))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "overlapcheck.watch.fixture", "-rA", "test_user.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    out = p.stdout
    assert "FAILED test_user.py::test_raise_mode_fails_at_the_racy_line" in out, out
    assert "RaceFound" in out and "return pinned.tolist()" in out, out
    assert "PASSED test_user.py::test_the_watch_is_active_in_the_body" in out, out
    assert "ERROR test_user.py::test_log_mode_fails_at_teardown" in out, out
    assert "overlapcheck watch found 1 race" in out, out
    assert "PASSED test_user.py::test_clean_body_passes" in out, out

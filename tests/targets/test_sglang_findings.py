"""The SGLang finding pages (docs/findings/): each standalone reproduction shows the bug
on the pinned engine, its fix's test fails on the engine and passes with the fix, and
its overlapcheck repro replays as reproduced (skipped where SGLang is missing)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "findings", "sglang-abort-keeps-tokens-past-stop")



def _py(args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, **(env or {})))


def test_the_page_and_its_files_exist():
    for name in ("repro.py", "repro.yaml", "fix.diff", "test_fix.py"):
        assert os.path.exists(os.path.join(PAGE, name)), name
    assert os.path.exists(PAGE + ".md")
    with open(os.path.join(ROOT, "docs", "findings", "README.md"), encoding="utf-8") as f:
        assert "sglang-abort-keeps-tokens-past-stop.md" in f.read()


def test_the_standalone_reproduction_prints_the_wrong_tokens(sglang):
    out = _py([os.path.join(PAGE, "repro.py")])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "sends [17, 2, 10, 9]" in out.stdout and "BUG" in out.stdout
    # it imports SGLang, never overlapcheck
    with open(os.path.join(PAGE, "repro.py"), encoding="utf-8") as f:
        assert "overlapcheck" not in f.read()


def test_the_fix_test_fails_before_and_passes_after(sglang):
    test = os.path.join(PAGE, "test_fix.py")
    before = _py(["-m", "pytest", "-q", "-p", "no:cacheprovider", test])
    assert before.returncode == 1 and "3 failed, 1 passed" in before.stdout, before.stdout[-800:]
    after = _py(["-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                env={"SGLANG_FINDING_APPLY_FIX": "1"})
    assert after.returncode == 0 and "4 passed" in after.stdout, after.stdout[-800:]


def test_the_overlapcheck_repro_reproduces(sglang):
    from overlapcheck.repro import load, replay
    r = load(os.path.join(PAGE, "repro.yaml"))
    assert replay(r).verdict == "reproduced"

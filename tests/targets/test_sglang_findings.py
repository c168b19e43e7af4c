"""The SGLang finding pages (docs/findings/): each standalone reproduction shows the bug
on the pinned engine, its fix's test fails on the engine and passes with the fix, and
its overlapcheck repro replays as reproduced (skipped where SGLang is missing)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "findings", "sglang-abort-keeps-tokens-past-stop")
OVERFLOW = os.path.join(ROOT, "docs", "findings", "sglang-draft-kv-indices-overflow")
INTERPRETED = {"TRITON_INTERPRET": "1"}



def _py(args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, **(env or {})))


def test_the_pages_and_their_files_exist():
    with open(os.path.join(ROOT, "docs", "findings", "README.md"), encoding="utf-8") as f:
        index = f.read()
    for page in (PAGE, OVERFLOW):
        for name in ("repro.py", "repro.yaml", "fix.diff", "test_fix.py"):
            assert os.path.exists(os.path.join(page, name)), (page, name)
        assert os.path.exists(page + ".md")
        assert os.path.basename(page) + ".md" in index


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


def test_the_overflow_reproduction_shows_the_kernel_storing_past_its_buffer(sglang):
    out = _py([os.path.join(OVERFLOW, "repro.py")], env=INTERPRETED)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "step 3: stores 17 entries: past the end of the buffer" in out.stdout
    assert "BUG" in out.stdout
    with open(os.path.join(OVERFLOW, "repro.py"), encoding="utf-8") as f:
        assert "overlapcheck" not in f.read()


def test_the_overflow_fix_test_fails_before_and_passes_after(sglang):
    test = os.path.join(OVERFLOW, "test_fix.py")
    before = _py(["-m", "pytest", "-q", "-p", "no:cacheprovider", test], env=INTERPRETED)
    assert before.returncode == 1 and "3 failed" in before.stdout, before.stdout[-800:]
    after = _py(["-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                env=dict(INTERPRETED, SGLANG_FINDING_APPLY_FIX="1"))
    assert after.returncode == 0 and "3 passed" in after.stdout, after.stdout[-800:]


def test_the_overflow_repro_reproduces(sglang):
    from overlapcheck.repro import load, replay
    r = load(os.path.join(OVERFLOW, "repro.yaml"))
    assert replay(r).verdict == "reproduced"

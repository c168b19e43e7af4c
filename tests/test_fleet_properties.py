"""The fuzz properties as Hypothesis tests: one per target and draft kind, collected by
HypoFuzz (same database as the default, not derandomized), failing on a zoo fault with
repros named by (checker, site) that replay, under pytest and under ``hypothesis fuzz``."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROPERTIES = os.path.join(ROOT, "overlapcheck", "fuzz", "properties.py")
HYPOTHESIS = shutil.which("hypothesis", path=os.path.dirname(sys.executable)) or "hypothesis"
FAULT = ["--overlapcheck-fault", "lagged-verify-counted"]    # three metrics findings, at once


def _env(*drop: str) -> dict:
    """The subprocesses import this tree's package, as ``PROPERTIES`` is this tree's
    file (not one an install elsewhere points at); without the variables in ``drop``."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _repros(folder) -> list:
    return sorted(f for f in os.listdir(folder) if f.endswith(".yaml"))


def _replays(folder) -> None:
    for name in _repros(folder):
        r = subprocess.run([sys.executable, "-m", "overlapcheck", "replay",
                            os.path.join(folder, name)], capture_output=True, text=True,
                           timeout=120, env=_env())
        assert r.returncode == 1, (name, r.stdout + r.stderr)     # reproduced


def test_a_property_fails_on_a_fault_with_repros_named_by_checker_and_site(tmp_path):
    repros = tmp_path / "repros"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        PROPERTIES, "-k", "standalone", *FAULT,
                        "--overlapcheck-repro-dir", str(repros)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300, env=_env())
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    names = _repros(repros)
    assert names and all(n.startswith("metrics-") for n in names), names
    _replays(str(repros))


_COLLECT = textwrap.dedent("""
    import json, sys
    from hypofuzz.collection import collect_tests
    got = collect_tests(sys.argv[1:])
    print(json.dumps([t.nodeid.rsplit("::", 1)[1] for t in got.fuzz_targets]))
    print(json.dumps({n.rsplit("::", 1)[1]: r["status_reason"] for n, r in got.not_collected.items()}))
""")


def test_hypofuzz_collects_a_test_per_target_and_draft_kind(tmp_path):
    from overlapcheck.engine.drafts import DRAFT_KINDS
    from overlapcheck.fuzz.properties import families
    for extra in ([], ["--overlapcheck-db", str(tmp_path / "db")]):
        r = subprocess.run([sys.executable, "-c", _COLLECT, PROPERTIES, "-p", "no:cacheprovider",
                            *extra], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                           env=_env())
        assert r.returncode == 0, r.stdout + r.stderr
        fuzzed, skipped = (json.loads(x) for x in r.stdout.strip().splitlines()[-2:])
        assert sorted(fuzzed + list(skipped)) == sorted(
            f"test_{t}" + (f"_{f}" if f else "") for t, f in families())
        assert {f"test_reference_{k}" for k in DRAFT_KINDS} <= set(fuzzed), r.stdout
        assert set(skipped.values()) <= {"skip"}, skipped    # engines not installed


def test_hypofuzz_finds_a_zoo_fault_and_writes_its_repros(tmp_path):
    repros = tmp_path / "repros"
    # as on a developer's machine: where CI is set, Hypothesis's CI profile has no example
    # database, which HypoFuzz needs (a CI job gives one with --overlapcheck-db)
    env = _env("CI")
    r = subprocess.run([HYPOTHESIS, "fuzz", "-n", "1", "--no-dashboard",
                        "--", PROPERTIES, "-k", "standalone", "-p", "no:cacheprovider", *FAULT,
                        "--overlapcheck-repro-dir", str(repros)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert "Found a failing input for every test!" in r.stderr, r.stdout + r.stderr[-3000:]
    assert "overlapcheck: finding metrics-" in r.stderr
    assert _repros(repros)
    _replays(str(repros))

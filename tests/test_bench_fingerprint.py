"""bench/fingerprint.py: a campaign's runs recorded and compared across trees. The same
tree gives the same rows; an engine that runs a case differently, a checker that
judges it differently and a fuzzer that draws differently each show as the first row
that differs; bad input is one line and exit 2."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location("fingerprint",
                                                  os.path.join(ROOT, "bench", "fingerprint.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FP = _tool()
ARGS = ["--examples", "8", "--seed", "3"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fp") / "base.jsonl")
    assert FP.main(ARGS + ["--out", path]) == 0
    return path


def test_same_tree_same_rows(base, capsys):
    head, rows = FP.read(base)
    assert head["examples"] == 8 and len(rows) >= 8
    assert all(r[3] == "completed" and r[2] > 0 for r in rows)
    capsys.readouterr()
    assert FP.main(ARGS + ["--against", base]) == 0
    assert "SAME as" in capsys.readouterr().out


def test_an_engine_change_shows_as_a_digest(base, capsys, monkeypatch):
    # a runtime that retires one op more per run: the same cases, other traces
    from overlapcheck.run import driver
    real = driver.digest_of
    monkeypatch.setattr(driver, "digest_of", lambda result, retired: real(
        result, list(retired) + [("forward", "planted", None)]))
    capsys.readouterr()
    assert FP.main(ARGS + ["--against", base]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and "first at run 0: digest:" in out


def test_a_checker_change_shows_as_findings(base, capsys, monkeypatch):
    from invariants.base import Checker, Violation
    from invariants.metrics import Metrics
    real = Metrics.on_Verified

    def judged_otherwise(self, ev):   # a planted verdict on the first request's 3rd verify
        if ev.rid == 0 and ev.index == 2:
            return [Violation(self.name, ev.iteration, "planted", site=("planted",))]
        return real(self, ev)
    monkeypatch.setattr(Metrics, "on_Verified", judged_otherwise)
    # a batch's results then reach it through on_Verified (the default expansion)
    monkeypatch.setattr(Metrics, "on_VerifiedBatch", Checker.on_VerifiedBatch)
    capsys.readouterr()
    assert FP.main(ARGS + ["--against", base]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and ": findings: [] here" not in out and "findings:" in out


def test_another_draw_shows_as_a_case(base, tmp_path, capsys):
    head, rows = FP.read(base)
    other = tmp_path / "other.jsonl"
    rows[2][0] = "0" * 16
    other.write_text("\n".join(json.dumps(x) for x in [head] + rows) + "\n")
    capsys.readouterr()
    assert FP.main(ARGS + ["--against", str(other)]) == 1
    assert "first at run 2: case:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--examples", "5", "--fault", "no-such-fault", "--out", "x"], "unknown fault"),
    (["--examples", "5", "--model", "no-such-model", "--out", "x"], "unknown model"),
    (["--examples", "5", "--against", "/nonexistent/fp.jsonl"], "No such file"),
    (["--examples", "5", "--against", "BAD"], "not a overlapcheck.fingerprint/1 file"),
    (["--examples", "9", "--seed", "3", "--against", "BASE"], "of another campaign"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, base, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": "something else"}\n')
    argv = [str(bad) if a == "BAD" else base if a == "BASE" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        FP.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_no_output_asked_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        FP.main(["--examples", "5"])
    assert e.value.code == 2

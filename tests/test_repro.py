"""Repro files: round trip, safe loading of hostile input, replay verdicts."""
import functools
import os
import subprocess
import sys

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import generate
from overlapcheck.protocol.finding import Finding
from overlapcheck.repro import Repro, ReproError, load, loads, replay, save
from overlapcheck.repro.format import dumps
from overlapcheck.run import Case, ScheduleSpec, execute

CFG = EngineConfig(pool_tokens=256, row_width=64, max_running=4)


def _repro(schedule=ScheduleSpec("random", 3), n=4) -> Repro:
    case = Case(CFG, generate(5, n, CFG), schedule)
    out = execute(case)
    fake = Finding("lifecycle", ("planted",), 3, "[lifecycle] planted")
    return Repro(case, out.choices, fake, out.digest, steps=out.steps)


def test_round_trip(tmp_path):
    r = _repro()
    path = str(tmp_path / "r.yaml")
    save(r, path)
    back = load(path)
    assert back.case == r.case and back.choices == r.choices
    assert back.finding.key == r.finding.key and back.digest == r.digest


def test_replay_verdicts(tmp_path):
    r = _repro()
    res = replay(r)
    assert res.verdict == "fixed" and res.digest_match        # the planted finding is absent
    r.choices = r.choices[:-3]
    assert replay(r).verdict == "diverged"
    r.choices = r.choices + [0] * 50
    assert replay(r).verdict == "diverged"


def test_cli_replay_exit_codes(tmp_path):
    r = _repro()
    path = str(tmp_path / "r.yaml")
    save(r, path)
    run = lambda *a: subprocess.run([sys.executable, "-m", "overlapcheck", *a],
                                    capture_output=True, text=True)
    ok = run("replay", path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    r.choices = r.choices[:5]
    save(r, path)
    assert run("replay", path).returncode == 3
    # a diverging run's trace is not the repro's run: said, exit 3, nothing written
    trace = run("trace", path, "-o", str(tmp_path / "t.json"))
    assert trace.returncode == 3 and "diverged" in trace.stdout
    assert not os.path.exists(tmp_path / "t.json")


def _one_line_exit_2(path, capsys):
    from overlapcheck.cli import main
    assert main(["replay", path]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_hostile_files_exit_2_one_line(tmp_path, capsys):
    good = dumps(_repro())
    cases = {
        "empty": "",
        "garbage": "\x00\x01\x02 not yaml: [",
        "tag": "!!python/object/apply:os.system ['touch " + str(tmp_path / "pwned") + "']",
        "truncated": good[: len(good) // 2],
        "schema": good.replace("schema: 2", "schema: 99"),
        "unknown": good + "surprise: 1\n",
        "negative": good.replace("max_new_tokens: ", "max_new_tokens: -", 1),
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        _one_line_exit_2(str(path), capsys)
    assert not (tmp_path / "pwned").exists()
    _one_line_exit_2(str(tmp_path / "missing.yaml"), capsys)
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "replay", str(tmp_path / "tag.yaml")],
                       capture_output=True, text=True)   # the same through a fresh process
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


@functools.lru_cache(maxsize=None)
def _good_text():
    return dumps(_repro(n=2))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_loader_never_tracebacks_or_executes(data):
    """Random and corrupted YAML, and YAML tags that would construct objects: the
    loader gives a Repro or a ReproError, nothing else."""
    good = _good_text()
    kind = data.draw(st.sampled_from(["mutate", "random", "tag", "splice"]))
    if kind == "mutate":
        i = data.draw(st.integers(0, len(good) - 1))
        text = good[:i] + data.draw(st.text(max_size=8)) + good[i + data.draw(st.integers(0, 8)):]
    elif kind == "random":
        text = data.draw(st.text(max_size=200))
    elif kind == "tag":
        tag = data.draw(st.sampled_from(["!!python/object/apply:os.system", "!!python/name:os.system",
                                         "!!python/object:overlapcheck.fuzz.Case", "!!binary",
                                         "!!set", "!custom"]))
        text = good.replace("choices:", f"choices: {tag} ", 1)
    else:
        doc = yaml.safe_load(good)
        path = data.draw(st.sampled_from(["case", "finding", "choices", "schema"]))
        doc[path] = data.draw(st.one_of(st.none(), st.integers(), st.text(max_size=5),
                                        st.lists(st.integers(), max_size=3),
                                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
        text = yaml.safe_dump(doc)
    try:
        r = loads(text)
    except ReproError as e:
        assert "\n" not in str(e)
    else:
        assert isinstance(r, Repro)


def test_emit_pytest_writes_a_runnable_regression_test(tmp_path):
    r = _repro()
    path = tmp_path / "r.yaml"
    save(r, str(path))
    from overlapcheck.cli import main
    assert main(["replay", str(path), "--emit-pytest", str(tmp_path / "test_regression.py")]) == 0
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path / "test_regression.py")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr   # the planted finding is absent: "fixed"


def test_minimize_shrinks_and_keeps_what_the_repro_names():
    """A minimized repro still shows its finding, is no larger, and keeps the engine
    version it was found on (a target's repro replays against that version only)."""
    import dataclasses
    from overlapcheck.repro.minimize import minimize
    data = os.path.join(os.path.dirname(__file__), "data", "repros_v1")
    r = load(os.path.join(data, "abort-zombie--liveness-cc7b063be5.yaml"))
    r = dataclasses.replace(r, engine_version="9.9.9")
    small, runs = minimize(r, max_runs=40)
    assert small is not None and 0 < runs <= 40
    assert small.finding.key == r.finding.key and small.engine_version == "9.9.9"
    assert len(small.case.workload.requests) <= len(r.case.workload.requests)
    assert replay(small).verdict == "reproduced"

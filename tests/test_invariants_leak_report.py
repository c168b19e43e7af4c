"""Run logs and ``overlapcheck leak-report``; ``run --check`` / ``--log``."""
import json

import pytest

from invariants.runlog import RunLog, read_log
from overlapcheck.cli import main
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import run_checked

CFG = EngineConfig(page_size=4, pool_tokens=256, row_width=64, max_running=6, chunk_size=16)


class SkipsLastPage(Engine):
    def _teardown(self, r, state, reason, bid):
        if r.rid == 1 and r.pages:
            self.kept = r.pages.pop()
        super()._teardown(r, state, reason, bid)


def _log(tmp_path, engine=Engine, name="run.jsonl"):
    path = str(tmp_path / name)
    wl = generate(5, 6, CFG, max_new=20, abort_rate=0.0)
    run = run_checked(CFG, wl, ["kv-accounting"], seed=1, engine=engine,
                      log=RunLog(path, {"seed": 1}))
    return path, run


def test_log_round_trips_events(tmp_path):
    path, run = _log(tmp_path)
    log = read_log(path)
    assert log.end["status"] == "completed" and log.run == {"seed": 1}
    steps = [e for e in log.events if isinstance(e, E.StepEnd)]
    assert len(steps) == run.engine.iteration
    snap = steps[len(steps) // 2].snapshot
    assert snap.free + snap.owned + snap.pending == snap.total
    assert len(snap.ledger) == snap.owned + snap.pending
    arrived = next(e for e in log.events if isinstance(e, E.Arrived))
    assert arrived.spec == run.engine.requests[arrived.rid].spec


def test_leak_report_names_request_and_allocating_step(tmp_path, capsys):
    path, run = _log(tmp_path, SkipsLastPage)
    page = run.engine.kept
    own = run.engine.mem.kv.owned[page]
    assert main(["leak-report", path]) == 1
    out = capsys.readouterr().out
    assert f"request 1: 4 {own.purpose} slot(s) allocated at step {own.step}" in out
    assert f"pages {page}" in out and "pool occupancy" in out
    assert main(["leak-report", path, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (leak,) = doc["leaks"]
    assert (leak["rid"], leak["alloc_step"], leak["pages"]) == (1, own.step, [page])
    assert leak["certain_step"] >= own.step and doc["timeline"]


def test_clean_log_has_no_leak(tmp_path, capsys):
    path, _ = _log(tmp_path)
    assert main(["leak-report", path]) == 0
    assert capsys.readouterr().out.startswith("no leaks")


def _bad(tmp_path, capsys, data: bytes, *flags):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(data)
    rc = main(["leak-report", str(p), *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_logs_are_one_line_exit_2(tmp_path, capsys):
    path, _ = _log(tmp_path)
    good = open(path, "rb").read()
    assert "empty" in _bad(tmp_path, capsys, b"")
    assert "truncated" in _bad(tmp_path, capsys, good[: len(good) // 2])
    cut = good[: good.rfind(b"\n", 0, len(good) // 2) + 1]           # a killed run's prefix
    assert "without its end record" in _bad(tmp_path, capsys, cut)
    _bad(tmp_path, capsys, b"\x00\xff\xfe garbage \x80\n")
    assert "not an overlapcheck run log" in _bad(tmp_path, capsys, b'{"a": 1}\n')
    assert "not JSON" in _bad(tmp_path, capsys, b"hello world\n")
    assert "unknown record type" in _bad(tmp_path, capsys, good.split(b"\n")[0] + b'\n{"t": "Nope"}\n')
    p = tmp_path / "cut.jsonl"
    p.write_bytes(cut)
    assert main(["leak-report", str(p), "--partial"]) == 0


def test_missing_file_and_plot_without_matplotlib(tmp_path, capsys):
    assert main(["leak-report", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    path, _ = _log(tmp_path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert main(["leak-report", path, "--plot", str(tmp_path / "o.png")]) == 2
        err = capsys.readouterr().err
        assert "matplotlib" in err and err.count("\n") == 1
    else:  # pragma: no cover - depends on the environment
        assert main(["leak-report", path, "--plot", str(tmp_path / "o.png")]) == 0
        assert (tmp_path / "o.png").exists()


def test_run_check_and_log_flags(tmp_path, capsys):
    assert main(["run", "--requests", "3", "--check", "kv-accounting,nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown checker 'nope'" in err and "liveness" in err and err.count("\n") == 1
    log = str(tmp_path / "r.jsonl")
    assert main(["run", "--requests", "5", "--seed", "2", "--log", log, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["violations"] == [] and doc["run"]["status"] == "completed"
    assert read_log(log).end["status"] == "completed"
    assert main(["run", "--requests", "5", "--check", "metrics,liveness"]) == 0

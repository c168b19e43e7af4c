"""The fuzzer on the clean engine, its determinism, the state machine, the plugin's
fixtures, and crash safety of repro writing."""
import json
import os
import signal
import subprocess
import sys
import time

from hypothesis import settings

from overlapcheck.engine import EngineConfig
from overlapcheck.fuzz.campaign import Campaign, Options
from overlapcheck.fuzz.machine import machine_for
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

CFG = EngineConfig(page_size=2, pool_tokens=98, row_width=48, max_running=4, chunk_size=8)


def test_clean_campaign_finds_nothing_and_is_deterministic():
    a = Campaign(Options(seconds=None, examples=30, seed=4)).run().summary()
    b = Campaign(Options(seconds=None, examples=30, seed=4)).run().summary()
    assert a["findings"] == [], a["findings"]
    assert (a["examples"], a["steps"]) == (b["examples"], b["steps"])


def test_replaying_recorded_choices_gives_the_same_digest():
    case = Case(CFG, generate(2, 6, CFG), ScheduleSpec("pct", 9))
    first = execute(case)
    again = execute(case, choices=first.choices)
    assert again.digest == first.digest and not again.diverged
    other = execute(Case(CFG, case.workload, ScheduleSpec("pct", 10)))
    assert other.choices != first.choices


def test_stalls_schedule_changes_interleaving_not_results():
    case = Case(CFG, generate(3, 6, CFG), ScheduleSpec("stalls", 0, (("forward", 2, 30),)))
    eager = execute(Case(CFG, case.workload, ScheduleSpec("stalls")))
    stalled = execute(case)
    assert not stalled.findings and not eager.findings
    assert stalled.result.requests == eager.result.requests
    assert stalled.choices != eager.choices


TestEngineMachine = machine_for(CFG).TestCase
TestEngineMachine.settings = settings(max_examples=15, stateful_step_count=25, deadline=None)


def test_cli_fuzz_clean_json(tmp_path):
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "fuzz", "--examples", "12",
                        "--json", "--out", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["examples"] == 12 and s["findings"] == []


def test_cli_fuzz_bad_flags_exit_2(capsys):
    from overlapcheck.cli import main
    for argv in (["--device", "tpu"], ["--model", "nope"], ["--check", "no-such-check"],
                 ["--jobs", "0"], ["--time", "0"], ["--fault", "no-such-fault"]):
        assert main(["fuzz", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


_WRITER = r"""
import sys
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import Finding, generate
from overlapcheck.run import Case, execute
from overlapcheck.repro import Repro, save
cfg = EngineConfig(pool_tokens=256, row_width=64)
case = Case(cfg, generate(1, 40, cfg))
r = Repro(case, list(range(20000)), Finding("lifecycle", ("x",), 1, "t"), "d")
print("ready", flush=True)
i = 0
while True:
    save(r, f"{sys.argv[1]}/r{i % 7}.yaml")
    i += 1
"""


def test_sigkill_leaves_written_repros_intact(tmp_path):
    from overlapcheck.repro import load
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while len([f for f in os.listdir(tmp_path) if f.endswith(".yaml")]) < 3:
        assert time.monotonic() < deadline, "the writer wrote nothing"
        time.sleep(0.05)
    time.sleep(0.3)   # let it get into the middle of further writes
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    written = [f for f in os.listdir(tmp_path) if f.endswith(".yaml")]
    assert written
    for name in written:
        assert len(load(str(tmp_path / name)).choices) == 20000


def test_plugin_fixtures_on_a_clean_config(overlapcheck_run, overlapcheck_fuzz):
    out = overlapcheck_run(CFG, generate(8, 5, CFG))
    assert out.result.summary.finished + out.result.summary.aborts == 5
    overlapcheck_fuzz(CFG, examples=8)


def test_known_findings_are_not_reported_again(tmp_path):
    """``fuzz --known REPROS``: a campaign skips the (checker, site) of findings already
    filed, so a night looks for other bugs; other findings still show."""
    from overlapcheck.cli import main
    from overlapcheck.fuzz.campaign import Campaign, Options
    opts = dict(seconds=None, examples=8, faults=("teardown-skips-draft",))
    first = Campaign(Options(out=str(tmp_path / "a"), **opts)).run().summary()
    keys = {(f["checker"],) + tuple(f["site"]) for f in first["findings"]}
    assert keys
    again = Campaign(Options(known=frozenset(keys), **opts)).run().summary()
    assert not keys & {(f["checker"],) + tuple(f["site"]) for f in again["findings"]}
    assert main(["fuzz", "--known", str(tmp_path / "missing"), "--examples", "1"]) == 2


def test_a_device_without_logical_ranks_draws_one_rank_from_the_same_draws():
    """Off the sim (no host flags: a GPU) a campaign's cases have one rank: logical
    ranks exist on the sim only (a GPU runs real ranks with ``run --dist``)."""
    import dataclasses
    from hypothesis import HealthCheck, given, settings
    from overlapcheck.fuzz.campaign import Options, case_strategy
    from overlapcheck.fuzz.strategies import cases
    seen = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(), cases(logical_ranks=False))
    def prop(a, b):
        seen.append(a.config.tp)
        assert b.config.tp == 1
    prop()
    assert 2 in seen
    assert "logical_ranks" not in repr(case_strategy(Options(device="sim")))
    import overlapcheck.device as D
    if "cuda" in D.DEVICES:
        assert "logical_ranks=False" in repr(case_strategy(Options(device="cuda")))


def test_cli_fuzz_in_two_processes(tmp_path):
    """``fuzz -j 2``: two campaigns whose fork server starts before the parent checks its
    flags; their summaries merged."""
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "fuzz", "-j", "2", "--examples", "8",
                        "--json", "--out", str(tmp_path / "f")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(p.stdout)
    assert s["jobs"] == 2 and s["examples"] >= 8 and s["steps"] > 0 and s["findings"] == []


def test_jobs_module_starts_the_server_before_the_engine_is_imported():
    """The fork server is started from a module that has not imported the engine, torch
    or Hypothesis yet: the server imports them while the parent does (a second call is
    a no-op)."""
    code = ("import sys\nimport overlapcheck.fuzz.jobs as J\n"
            "heavy = [m for m in ('torch', 'hypothesis', 'overlapcheck.fuzz.campaign') if m in sys.modules]\n"
            "assert not heavy, heavy\nJ.start_server()\nJ.start_server()\n"
            "from multiprocessing import forkserver\n"
            "assert forkserver._forkserver._forkserver_pid is not None\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_unwrapped_strategies_draw_what_the_lazy_ones_drew(monkeypatch):
    """The case strategies are made of Hypothesis' unwrapped strategies (a draw of a lazy
    one unwraps it again each time): the cases drawn, and so the choices behind them, are
    those of the same module built from the lazy strategies (Hypothesis without the
    unwrapping helper: its fallback)."""
    import importlib.util
    import json
    import types
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    import overlapcheck.fuzz.strategies as S
    lazy_mod = "hypothesis.strategies._internal.lazy"
    stub = types.ModuleType(lazy_mod)     # the module without the helper
    stub.__dict__.update({k: v for k, v in vars(sys.modules[lazy_mod]).items()
                          if k != "unwrap_strategies"})
    monkeypatch.setitem(sys.modules, lazy_mod, stub)
    spec = importlib.util.spec_from_file_location("overlapcheck.fuzz._lazy_strategies", S.__file__)
    L = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, L)    # its dataclasses look it up there
    spec.loader.exec_module(L)
    monkeypatch.undo()
    names = [n for n, v in vars(S).items()
             if n.startswith("_") and n.isupper() and isinstance(v, st.SearchStrategy)]
    assert "_BOOL" in names and "_STALLS" in names
    assert not any(hasattr(getattr(S, n), "wrapped_strategy") for n in names)
    assert hasattr(L._BOOL, "wrapped_strategy") and hasattr(L._STALLS, "wrapped_strategy")

    def drawn(module):
        out = []

        @settings(max_examples=80, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(module.cases())
        def prop(case):
            out.append(json.dumps(case.to_dict(), sort_keys=True))
        prop()
        return out

    bare = drawn(S)
    assert drawn(L) == bare and len(set(bare)) > 40

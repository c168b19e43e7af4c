"""Adding a target is one package and one registry line: the toy target of
``tests/toy_target`` (an engine, its config, faults and its own checker), registered
with the one line ``TARGETS["toy"] = "toy_target:ToyTarget"``, runs through the run
driver with the shared checkers and its own, replays, round-trips as a repro case and
lists its faults, with nothing else changed."""
import json

import pytest

from overlapcheck import targets
from overlapcheck.run import Case, ScheduleSpec, execute
from overlapcheck.run.driver import checker_names


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(targets.TARGETS, "toy", "toy_target:ToyTarget")   # the registry line
    from toy_target import ToyConfig
    return targets.get("toy"), ToyConfig()


def _case(toy, seed, **kw):
    target, cfg = toy
    return Case(cfg, target.generate(seed, 6, cfg), ScheduleSpec("random", seed), target="toy",
                **kw)


def test_the_shared_checkers_and_its_own_run_on_it(toy):
    names = checker_names(_case(toy, 0))
    assert {"kv-accounting", "lifecycle", "liveness", "metrics", "parity", "toy-budget"} <= set(names)
    assert not {"kv-canary", "stream-race", "vllm-golden", "sglang-golden"} & set(names)
    for seed in range(6):
        out = execute(_case(toy, seed))
        assert out.status == "completed" and out.findings == [], [f.text for f in out.findings]
        assert out.result.summary.finished + out.result.summary.aborts == 6


def test_its_runs_replay_exactly(toy):
    first = execute(_case(toy, 3))
    assert first.choices
    again = execute(_case(toy, 3), choices=first.choices)
    assert again.diverged is None and again.digest == first.digest


@pytest.mark.parametrize("fault,checker", [("keep-last-slot", "kv-accounting"),
                                           ("decode-twice", "toy-budget")])
def test_its_faults_are_found_by_the_checker_they_name(toy, fault, checker):
    out = execute(_case(toy, 1, faults=(fault,)))
    assert checker in {f.checker for f in out.findings}, [f.text for f in out.findings]


def test_a_case_of_it_round_trips_as_a_repro_would(toy):
    case = _case(toy, 2, faults=("decode-twice",))
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case


def test_its_faults_are_listed_with_their_own_fields(toy, capsys):
    from overlapcheck.cli import main
    assert main(["faults", "--target", "toy", "--json"]) == 0
    doc = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert doc["keep-last-slot"]["seed"] == 7 and doc["decode-twice"]["layer"] == "scheduler"
    assert doc["keep-last-slot"]["kind"] == "guarded-site" and doc["decode-twice"]["checker"] == "toy-budget"
    assert main(["faults", "--target", "toy"]) == 0
    assert "keep-last-slot" in capsys.readouterr().out


def test_the_checker_registry_follows_the_target_registry(toy):
    from invariants.base import REGISTRY
    assert REGISTRY["toy-budget"] == "toy_target.checkers:ToyBudget"
    del targets.TARGETS["toy"]
    assert "toy-budget" not in REGISTRY and "vllm-golden" in REGISTRY

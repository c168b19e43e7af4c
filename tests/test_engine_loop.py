"""The engine loop alone (``overlapcheck/engine/loop.py``): under overlap a batch's
result is processed one step after its launch (non-overlap: the same step); a finish is
known one step late, so the finished request's result in the batch already in flight
is dropped; an abort only marks a request that rides an in-flight batch and tears it
down when that batch is processed."""
import pytest

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import RequestSpec, Workload
from overlapcheck.protocol import events as E
from overlapcheck.protocol.workload import AbortAt

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = EngineConfig(pool_tokens=256, row_width=64, max_running=4, chunk_size=32, spec_steps=2)


def run(wl, **kw):
    cfg = EngineConfig(**{**CFG.__dict__, **kw})
    events = []
    eng = Engine(cfg, make_runtime("sim", strategy="eager", access="declared"),
                 make_model(cfg.model), events.append, strict=True)
    res = eng.run(wl)
    return events, res


def launched_at(events):
    return {ev.batch: ev.iteration for ev in events if isinstance(ev, E.Launched)}


def test_overlap_processes_a_result_one_step_after_its_launch():
    wl = Workload((RequestSpec(0, 0, (5, 6, 7), 6),))
    for overlap, lag in ((True, 1), (False, 0)):
        events, _ = run(wl, overlap=overlap)
        launched = launched_at(events)
        done = [(ev.batch, ev.iteration) for ev in events if isinstance(ev, (E.Prefilled, E.Verified))]
        assert done and all(it - launched[b] == lag for b, it in done), (overlap, done)


def test_a_finish_is_known_one_step_late_and_the_lagged_result_is_dropped():
    events, res = run(Workload((RequestSpec(0, 0, (5, 6, 7), 4),)))
    fin = next(ev for ev in events if isinstance(ev, E.Finished))
    dropped = [ev for ev in events if isinstance(ev, E.Verified) and ev.dropped]
    assert dropped and all(ev.rid == 0 and ev.iteration > fin.iteration for ev in dropped)
    assert len(res.requests[0].tokens) == 4 and res.requests[0].finish_reason == "length"


def test_an_abort_of_a_request_in_flight_waits_for_its_batch():
    # aborted at step 2: its decode launched at step 1 is still in flight under overlap
    events, res = run(Workload((RequestSpec(0, 0, (5, 6, 7), 30),), (AbortAt(0, 2),)))
    ab = next(ev for ev in events if isinstance(ev, E.Aborted))
    launched = launched_at(events)
    assert ab.batch >= 0 and ab.iteration == launched[ab.batch] + 1
    assert res.requests[0].finish_reason == "abort"


def test_an_abort_before_arrival_ends_the_request_when_it_comes():
    events, res = run(Workload((RequestSpec(0, 3, (5, 6, 7), 8),), (AbortAt(0, 1),)))
    assert res.requests[0].finish_reason == "abort" and res.requests[0].tokens == ()
    assert not any(isinstance(ev, E.Launched) for ev in events)


def test_run_result_json_is_asdict():
    """``RunResult.to_json`` (every run's digest reads it) builds the dicts ``asdict``
    builds, field for field and in order; a record with a value that is no atom or
    tuple of atoms goes through ``asdict`` itself."""
    import dataclasses
    import json
    import random
    from overlapcheck.protocol.results import RequestResult, RunResult, Summary, _fields
    rng = random.Random(3)
    for _ in range(200):
        reqs = {rid: RequestResult(rid, tuple(rng.randrange(-2 ** 63, 2 ** 63)
                                              for _ in range(rng.randint(0, 40))),
                                   rng.choice(("length", "stop", "abort")),
                                   tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 9))),
                                   rng.randint(0, 3))
                for rid in rng.sample(range(20), rng.randint(0, 6))}
        summ = Summary(*(rng.randint(0, 99) for _ in range(4)), rng.random(),
                       *(rng.randint(0, 99) for _ in range(6)))
        res = RunResult(reqs, summ)
        want = {"requests": [dataclasses.asdict(reqs[r]) for r in sorted(reqs)],
                "summary": dataclasses.asdict(summ)}
        got = res.to_json()
        assert got == want
        assert json.dumps(got) == json.dumps(want)      # the same keys in the same order

    @dataclasses.dataclass(frozen=True)
    class Inner:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Nested:
        a: tuple
        b: list

    odd = Nested((Inner(1), 2), [Inner(3)])
    assert _fields(odd) == dataclasses.asdict(odd) == {"a": ({"x": 1}, 2), "b": [{"x": 3}]}

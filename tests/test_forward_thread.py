"""The forward thread (``EngineConfig(forward_thread=True)``, docs/design.md §4.14): the
engine loop as a scheduler thread and a forward thread joined by two queues, their
interleaving decided by the sim's seeded schedule. The clean engine on it equals the
standard engine on every draft kind and mode (overlap == non-overlap, spec == no-spec,
golden and every checker quiet, host-race included); the interleaving is recorded
with the device's choices and replays from them; host-race sees an access pair that no
handoff orders (and only then); the option is validated, on the ``run`` command and in
the fuzzer's draws."""
import dataclasses
import subprocess
import sys

import pytest

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import ENGINE_MODES, assert_parity, run_clean

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = {**ENGINE_MODES, "ring": {"future_map": "ring"}}
BASE = dict(page_size=2, pool_tokens=128, row_width=40, max_running=3, chunk_size=5,
            spec_steps=3, forward_thread=True)
LAG = ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),))
FAULT = "sched-mutates-during-forward"


def standard(cfg):
    return dataclasses.replace(cfg, forward_thread=False, overlap=False, zero_bubble=False,
                               kv_backup=False, verify_sync=False, future_map="row")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_forward_thread_runs_clean_and_equals_the_standard_engine(kind, mode):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, **MODES[mode]})
    for seed in range(2):
        wl = generate(seed, 7, cfg, max_prompt=16, max_new=20)
        ref = execute(Case(standard(cfg), wl, ScheduleSpec("random", seed))).result
        for sched in (LAG, ScheduleSpec("random", seed), ScheduleSpec("pct", seed)):
            out = execute(Case(cfg, wl, sched))
            assert out.status == "completed" and not out.findings, out.findings[0].text
            assert_parity(ref, out.result, f"{kind}/{mode} seed {seed}", accept=cfg.spec)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_tree_drafts_on_the_forward_thread(kind, overlap):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "topk": 2, "overlap": overlap,
                          "row_width": 48, "pool_tokens": 160})
    for seed in range(2):
        wl = generate(seed, 7, cfg, max_prompt=16, max_new=20)
        ref = execute(Case(standard(cfg), wl, ScheduleSpec("random", seed))).result
        for sched in (LAG, ScheduleSpec("random", seed)):
            out = execute(Case(cfg, wl, sched))
            assert out.status == "completed" and not out.findings, out.findings[0].text
            assert_parity(ref, out.result, f"tree {kind} seed {seed}")


@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_spec_equals_no_spec_and_overlap_equals_non_overlap(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind})
    wl = generate(7, 8, cfg, max_prompt=16, max_new=24)
    ref = run_clean(dataclasses.replace(cfg, overlap=False), wl, 7, "eager")
    nospec = run_clean(dataclasses.replace(cfg, overlap=False, spec=False), wl, 7, "eager")
    assert_parity(ref, nospec, f"{kind} spec vs no-spec", accept=False)
    plain = run_clean(standard(cfg), wl, 7, "eager")
    assert_parity(plain, ref, f"{kind} forward thread vs one thread, non-overlap")
    for strategy in ("random", "pct", "buggify"):
        assert_parity(ref, run_clean(cfg, wl, 7, strategy), f"{kind} overlap/{strategy}")


def _interleaving(cfg, wl, seed):
    """A checked-free run on the sim's random schedule: its choices, result and the
    order in which the threads' handoffs, launches and result processing happened."""
    seen = []

    def note(ev):
        if isinstance(ev, E.HostQueue):
            seen.append((ev.thread, ev.queue, ev.op, ev.seq))
        elif isinstance(ev, (E.Launched, E.Verified, E.Prefilled)):
            seen.append((type(ev).__name__, ev.batch))

    rt = make_runtime("sim", seed=seed, strategy="random")
    res = Engine(cfg, rt, make_model(cfg.model), note).run(wl)
    return list(rt.choices), res.to_json(), seen


def test_the_schedule_decides_the_interleaving_and_replays_it(tmp_path):
    """Same seed: the same choices, interleaving and digest; other seeds interleave the
    threads otherwise; a repro of the run replays it from its recorded choices alone."""
    from overlapcheck.repro.format import Repro, save
    cfg = EngineConfig(**BASE)
    wl = generate(3, 7, cfg, max_prompt=16, max_new=20)
    runs = {}
    for seed in range(4):
        a = _interleaving(cfg, wl, seed)
        assert a == _interleaving(cfg, wl, seed)
        runs[seed] = tuple(a[2])
    assert len(set(runs.values())) > 1, "every seed interleaved the threads alike"
    case = Case(cfg, wl, ScheduleSpec("random", 1), faults=(FAULT,))
    out = execute(case)
    assert out.findings and out.findings[0].checker == "host-race"
    again = execute(case)
    assert (again.digest, again.choices) == (out.digest, out.choices)
    path = tmp_path / "repro.yaml"
    save(Repro(case, out.choices, out.findings[0], out.digest, "sim", out.steps), str(path))
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "replay", str(path)],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "reproduced" in p.stdout, p.stdout + p.stderr


def _events(cfg, wl, seed, faults=()):
    evs = []
    rt = make_runtime("sim", seed=seed, strategy="random")
    Engine(dataclasses.replace(cfg, faults=faults), rt, make_model(cfg.model), evs.append).run(wl)
    return evs


def _host_race(events):
    from invariants.host_race import HostRace
    checker, out = HostRace(), []
    for ev in events:
        out += checker.feed(ev)
    return out


def test_host_race_orders_accesses_by_the_queue_handoffs_only():
    """On the clean engine both threads touch every batch object (the scheduler writes
    its entries and snapshot, the forward thread reads them and writes its launch, the
    scheduler reads that back): the handoffs order all of it. Without the queue events
    the same accesses race."""
    cfg = EngineConfig(**BASE)
    wl = generate(5, 7, cfg, max_prompt=16, max_new=20)
    for seed in range(3):
        evs = _events(cfg, wl, seed)
        shared = {(ev.obj, ev.field) for ev in evs if isinstance(ev, E.HostAccess)
                  and ev.thread == "forward"}
        assert shared and not _host_race(evs)
        cut = _host_race([ev for ev in evs if not isinstance(ev, E.HostQueue)])
        assert cut and {v.site for v in cut} == {("batch", "entries"), ("batch", "inputs"),
                                                  ("batch", "launch")}


def test_host_race_reads_a_put_and_its_get():
    from invariants.host_race import HostRace

    def acc(thread, field, write, it=0):
        return E.HostAccess(it, 0, thread, ("request", 1), field, write)

    def q(thread, op, seq):
        return E.HostQueue(0, 0, thread, "input", op, seq)

    c = HostRace()
    assert not c.feed(acc("scheduler", "output", True))
    assert not c.feed(q("scheduler", "put", 0)) and not c.feed(q("forward", "get", 0))
    assert not c.feed(acc("forward", "output", False))          # ordered by the handoff
    got = c.feed(acc("scheduler", "output", True, 1))           # after its put: unordered
    assert len(got) == 1 and got[0].site == ("request", "output")
    assert "forward thread's read" in got[0].message and "scheduler thread's write" in got[0].message
    assert not c.feed(acc("scheduler", "committed", False))     # one thread: never a race


@pytest.mark.parametrize("mode", ["overlap", "zero-bubble", "verify-sync", "ring"])
def test_the_fault_is_a_host_race_on_every_interleaving(mode):
    """The forward thread reads the live requests: whichever thread the schedule runs
    first, no handoff orders its reads with the scheduler thread's result processing
    (host-race sees it on every schedule); without overlap the scheduler waits for
    each result, and nothing races."""
    cfg = EngineConfig(**{**BASE, **MODES[mode]})
    wl = generate(2, 7, cfg, max_prompt=16, max_new=20)
    for sched in (LAG, ScheduleSpec("eager", 0), ScheduleSpec("random", 2),
                  ScheduleSpec("pct", 2)):
        out = execute(Case(cfg, wl, sched, faults=(FAULT,)))
        assert "host-race" in {f.checker for f in out.findings}, (mode, sched)
        quiet = execute(Case(dataclasses.replace(cfg, overlap=False), wl, sched, faults=(FAULT,)))
        assert not quiet.findings, quiet.findings[0].text


def test_config_cli_and_fuzzer_draws():
    from hypothesis import HealthCheck, Phase, given, settings

    from overlapcheck.cli import main
    from overlapcheck.fuzz.strategies import cases
    assert EngineConfig().forward_thread is False
    with pytest.raises(ValueError, match="forward_thread runs one rank: it needs tp 1"):
        EngineConfig(forward_thread=True, tp=2)
    with pytest.raises(ValueError, match="forward_thread must be true or false"):
        EngineConfig(forward_thread="yes")
    assert main(["run", "--forward-thread", "--requests", "4", "--seed", "2"]) == 0
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "run", "--forward-thread",
                        "--tp", "2"], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "needs tp 1" in p.stderr
    drawn = []

    @settings(max_examples=60, phases=(Phase.generate,), database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(cases())
    def prop(case):
        drawn.append((case.config.forward_thread, case.config.tp))

    prop()
    assert (True, 1) in drawn and (False, 1) in drawn and (True, 2) not in drawn

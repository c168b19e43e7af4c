"""Semantics of the simulated device: deferred closures, CUDA's event rules,
copies, poison, allocator reuse, annotations, choices and replay."""
import re

import pytest
import torch

from overlapcheck.device import (AnnotationError, Diverged, Replay, is_poison, make_runtime)
from overlapcheck.device.sched import Script


def _rt(strategy="eager", seed=0, **kw):
    rt = make_runtime("sim", seed=seed, strategy=strategy, **kw)
    return rt, rt.new_stream("s"), rt.new_stream("f")


def test_closure_runs_later_and_reads_contents_then():
    rt, s, f = _rt(Script([0] * 50))   # Script: never retire at free points
    a = rt.empty((1,), torch.int64, "a", s)
    b = rt.empty((1,), torch.int64, "b", s)
    rt.launch(s, lambda x: x.fill_(1), a.t)
    rt.launch(s, lambda x, y: y.copy_(x + 1), a.t, b.t)
    assert is_poison(a.t).all()         # nothing ran yet
    s.synchronize()
    assert b.t.item() == 2


def test_fresh_buffers_are_poison():
    rt, s, _ = _rt()
    assert is_poison(rt.empty((3,), torch.float32, "x", s).t).all()
    assert is_poison(rt.host_empty((3,), torch.int32, "p").t).all()


def test_pageable_copy_is_synchronous_and_pinned_async():
    rt, s, _ = _rt(Script([0] * 50))
    d = rt.empty((2,), torch.int64, "d", s)
    rt.launch(s, lambda x: x.fill_(7), d.t)
    page = rt.host_empty((2,), torch.int64, "page", pinned=False)
    rt.copy(page, d, s, non_blocking=True)     # pageable: synchronous anyway
    assert rt.host_view(page).tolist() == [7, 7]
    pin = rt.host_empty((2,), torch.int64, "pin")
    rt.launch(s, lambda x: x.fill_(8), d.t)
    rt.copy(pin, d, s, non_blocking=True)
    assert is_poison(rt.host_view(pin)).all()  # not landed, and a race
    rt.synchronize()                           # reported once the copy retires
    assert rt.reports and rt.reports[-1].kind == "host-read-before-copy"


def test_host_list_is_host_view_as_lists_with_the_same_report():
    views, lists = [], []
    for read, out in ((lambda rt, b, rows=None: rt.host_view(b, rows).tolist(), views),
                      (lambda rt, b, rows=None: rt.host_list(b, rows), lists)):
        rt, s, _ = _rt(Script([0] * 50))
        d = rt.empty((3, 2), torch.int64, "d", s)
        rt.launch(s, lambda x: x.fill_(5), d.t)
        pin = rt.host_empty((3, 2), torch.int64, "pin")
        flags = rt.host_empty((2,), torch.bool, "flags", pinned=False)
        rt.host_write(flags, [True, False])
        rt.copy(pin, d, s, non_blocking=True)
        out.append(read(rt, pin))                  # before the copy landed: poison, a race
        rt.synchronize()
        out += [read(rt, pin), read(rt, pin, [2, 0]), read(rt, flags)]
        out.append([re.sub(r"test_sim.py:\d+", "here", str(r)) for r in rt.reports])
    assert lists == views
    assert lists[1] == [[5, 5]] * 3 and lists[3] == [True, False]
    assert lists[4] and "read by host in 'host_view pin' at here" in lists[4][0]


def test_query_of_never_recorded_event_is_true():
    rt, s, _ = _rt()
    assert rt.new_event("e").query()


def test_wait_on_never_recorded_event_is_noop_and_no_hang():
    rt, s, f = _rt("random", seed=3)
    e = rt.new_event("e")
    f.wait_event(e)
    rt.launch(f, lambda: None, name="noop")
    f.synchronize()


def test_allocator_reuses_freed_block_on_same_stream_stale():
    rt, s, f = _rt()
    a = rt.empty((4,), torch.int64, "idx", s)
    rt.launch(s, lambda x: x.fill_(5), a.t)
    rt.free(a)
    b = rt.empty((4,), torch.int64, "idx2", s)
    s.synchronize()
    assert b.mem == a.mem and b.t.tolist() == [5, 5, 5, 5]
    c = rt.empty((4,), torch.int64, "other_stream", f)
    assert c.mem != a.mem


def test_record_stream_delays_reuse_until_host_knows():
    rt, s, f = _rt()
    a = rt.empty((4,), torch.int64, "idx", s)
    rt.record_stream(a, f)
    rt.launch(f, lambda x: x.sum(), a.t)
    rt.free(a)
    b = rt.empty((4,), torch.int64, "idx2", s)
    assert b.mem != a.mem
    f.synchronize()
    rt.free(b)
    c = rt.empty((4,), torch.int64, "idx3", s)
    assert c.mem in (a.mem, b.mem)


def test_double_free_is_an_error():
    rt, s, _ = _rt()
    a = rt.empty((1,), torch.int64, "a", s)
    rt.free(a)
    with pytest.raises(ValueError, match="double free"):
        rt.free(a)


def test_wrong_annotation_raises():
    rt, s, _ = _rt()
    kv = rt.empty((8, 2), torch.int64, "kv", s)
    idx = torch.tensor([3])
    rt.launch(s, lambda t, i: t.index_fill_(0, i, 0), kv.t, idx, writes=[kv.rows([0, 1])])
    with pytest.raises(AnnotationError, match="rows"):
        s.synchronize()


def test_annotation_narrows_index_access():
    rt, s, f = _rt()
    kv = rt.empty((8, 2), torch.int64, "kv", s)
    f.wait_stream(s)                    # after the allocation's poison fill on s
    rt.launch(s, lambda t, i: t.index_fill_(0, i, 1), kv.t, torch.tensor([0, 1]),
              writes=[kv.rows([0, 1])])
    rt.launch(f, lambda t, i: t.index_fill_(0, i, 2), kv.t, torch.tensor([5]),
              writes=[kv.rows([5])])
    rt.synchronize()
    assert not rt.reports


def test_undeclared_buffer_raises():
    rt, s, _ = _rt()
    a = rt.empty((2,), torch.int64, "a", s)
    b = rt.empty((2,), torch.int64, "b", s)
    rt.launch(s, lambda x, y: y.copy_(x), a.t, b.t, writes=[b])
    with pytest.raises(AnnotationError, match="did not declare"):
        s.synchronize()


def test_view_geometry_narrows_without_annotation():
    rt, s, f = _rt()
    t = rt.empty((4, 3), torch.int64, "table", s)
    f.wait_stream(s)                    # after the allocation's poison fill on s
    rt.launch(s, lambda x: x.fill_(1), t.t[0:2])
    rt.launch(f, lambda x: x.fill_(2), t.t[2:4])
    rt.synchronize()
    assert not rt.reports


def _program(rt):
    s, f = rt.new_stream("s"), rt.new_stream("f")
    a = rt.empty((1,), torch.int64, "a", s)
    pin = rt.host_empty((1,), torch.int64, "pin")
    rt.launch(s, lambda x: x.fill_(1), a.t)
    rt.launch(f, lambda x: x.add_(10), a.t)
    rt.copy(pin, a, f, non_blocking=True)
    seen = rt.host_view(pin).item()
    rt.synchronize()
    return seen, rt.host_view(pin).item()


def test_replay_reproduces_exactly_and_detects_divergence():
    rt = make_runtime("sim", seed=11, strategy="random")
    first = _program(rt)
    again = make_runtime("sim", strategy=Replay(rt.choices))
    assert _program(again) == first and again.choices == rt.choices
    bad = make_runtime("sim", strategy=Replay(rt.choices[:1]))
    with pytest.raises(Diverged):
        _program(bad)


def test_unknown_names_are_errors():
    with pytest.raises(ValueError, match="unknown device"):
        make_runtime("tpu")
    with pytest.raises(ValueError, match="unknown schedule strategy"):
        make_runtime("sim", strategy="chaos")
    with pytest.raises(ValueError, match="unknown access mode"):
        make_runtime("sim", access="guess")


def test_race_on_a_row_that_kept_its_owner_is_not_reuse():
    rt, s, f = _rt()
    kv = rt.empty((8, 2), torch.float32, "kv_cache", f)
    rt.transfer(kv, [4, 5], "req-A")
    rt.launch(f, lambda k, i: k.index_select(0, i), kv.t, torch.tensor([4, 5]))
    rt.launch(s, lambda k: k[4].fill_(1.0), kv.t)
    rt.synchronize()
    assert [r.kind for r in rt.reports] == ["stream-stream"]


def test_index_rows_unseen_on_cuda_still_check_membership():
    rt, s, f = _rt()
    rt.exact_rows = False   # as on cuda: index values live on the device
    kv = rt.empty((8, 2), torch.float32, "kv", f)
    out = rt.empty((2, 2), torch.float32, "out", f)
    rt.launch(f, lambda o, k, i: o.copy_(k.index_select(0, i)), out.t, kv.t,
              torch.tensor([4, 5]), reads=[kv.rows([4, 5])], writes=[out])
    f.synchronize()
    assert not rt.reports
    rt.launch(f, lambda k, i: k.index_fill_(0, i, 0.0), kv.t, torch.tensor([1]),
              reads=[kv.rows([1])])
    with pytest.raises(AnnotationError, match="declared only as read"):
        f.synchronize()


def test_host_flag_wait_released_by_the_host():
    rt, s, _ = _rt()
    flag = rt.new_flag("ready")
    a = rt.empty((1,), torch.int64, "a", s)
    rt.wait_flag(s, flag)
    rt.launch(s, lambda x: x.fill_(3), a.t)
    assert is_poison(a.t).all()          # eager, but held behind the flag
    flag.set()
    s.synchronize()
    assert a.t.item() == 3


def test_sync_on_work_behind_an_unset_flag_is_a_stuck_wait_not_a_hang():
    from overlapcheck.device import StuckWait
    rt, s, f = _rt("random", seed=3)
    flag = rt.new_flag("later_host_action")
    rt.wait_flag(s, flag)
    ev = rt.new_event("done")
    ev.record(s)
    f.wait_event(ev)                     # f depends on s through the event
    with pytest.raises(StuckWait) as e:
        f.synchronize()
    assert e.value.stream == "s" and e.value.waits_for == "later_host_action"
    assert "host synchronize on stream 'f'" in str(e.value)


def test_work_run_at_once_is_the_deferred_run():
    """Direct execution (work queued while nothing else is runs at once where the next
    choice point would retire it first) changes nothing: engine runs under a stalls
    schedule, and parity's eager detector-less reference run, give with it and with the
    same strategy made to defer everything the same decisions, retire trace (host-call
    stamps included), digest, findings and race reports."""
    from overlapcheck.device.sched import Eager, Stalls
    from overlapcheck.device.sim import SimRuntime
    from overlapcheck.engine import EngineConfig
    from overlapcheck.protocol import generate
    from overlapcheck.run import Case, ScheduleSpec, execute

    class DeferredStalls(Stalls):
        early = False

    class DeferredEager(Eager):
        early = False

    assert Stalls().early and Eager().early     # the strategies direct execution serves
    cfg = EngineConfig(page_size=2, pool_tokens=96, row_width=32, max_running=4,
                       chunk_size=8, spec_steps=3)
    stalls = (("forward", 5, 40), ("copy", 50, 90))
    raced = False
    for seed, faults in ((0, ()), (1, ("index-no-record-stream",)), (2, ("single-staging-buffer",))):
        case = Case(cfg, generate(seed, 6, cfg, max_prompt=10, max_new=16),
                    ScheduleSpec("stalls", 0, stalls), faults=faults)
        runs = []
        for strategy in (Stalls(stalls), DeferredStalls(stalls)):
            rt = SimRuntime(strategy, access="declared")
            out = execute(case, runtime=rt)
            runs.append((list(out.choices), out.retired, out.marks, out.digest, out.status,
                         [f.text for f in out.findings], [str(r) for r in out.races], rt.calls))
        assert runs[0] == runs[1]
        raced = raced or bool(runs[0][6])
        refs = []
        for strategy in (Eager(), DeferredEager()):
            rt = SimRuntime(strategy, detect=False, access="declared")
            out = execute(Case(cfg, case.workload, ScheduleSpec("stalls", 0, ()), ("parity",)),
                          runtime=rt)
            refs.append((list(out.choices), out.digest, out.result.summary, rt.calls))
        assert refs[0] == refs[1]
    assert raced            # race reports were compared, not only empty lists


class _PlainSim:
    """The sim as it was before ``launch``/``copy`` inlined their steps and a choice
    point kept its ready list across decisions: ``Runtime.launch`` and ``copy`` through
    ``_raw_launch``/``_raw_copy`` (an overridden ``_point`` turns the inlining off), and
    a choice point that scans every stream again after each retire."""

    @staticmethod
    def make(strategy, **kw):
        from overlapcheck.device.sim import WAIT, SimRuntime

        class Plain(SimRuntime):
            def _point(self):
                self.calls += 1
                if self._owed:
                    self._owed = False
                    self.choices.append(1)
                    if self._owed_exc is not None:
                        self._settle_exc()
                if not self._pending:
                    return
                strategy = self.strategy
                if self._started:
                    self._started = False
                else:
                    strategy.new_point()
                if strategy.eager():
                    return self._point_eager_rest()
                while True:
                    ready = [q for q in self._queues if q.ops and (
                        q.ops[0].kind != WAIT or q.ops[0].bound.retired)]
                    if not ready:
                        return
                    c = strategy.choose(len(ready) + 1, [q.name for q in ready], False)
                    self.choices.append(c)
                    if c == 0:
                        return
                    self._retire(ready[c - 1])

            def _point_eager_rest(self):
                # the eager scan from the first stream again after every retire
                while True:
                    for q in self._queues:
                        if q.ops and (q.ops[0].kind != WAIT or q.ops[0].bound.retired):
                            self.choices.append(1)
                            self._retire(q)
                            break
                    else:
                        return

        rt = Plain(strategy, **kw)
        assert not rt._inline and SimRuntime(strategy, **kw)._inline
        return rt


@pytest.mark.parametrize("schedule", [("random", 3, ()), ("pct", 4, ()), ("buggify", 5, ()),
                                      ("stalls", 0, (("forward", 3, 30), ("forward", 120, 180),
                                                     ("schedule", 200, 260), ("copy", 300, 340))),
                                      ("stalls", 0, (("copy", 20, 2000),)),
                                      ("stalls", 0, ())])
def test_inlined_launch_and_kept_ready_list_are_the_plain_sim(schedule):
    """``SimRuntime.launch``/``copy``, event records and waits, ``empty``/``free`` (the
    choice point's start, the op site's lookup, the ``_raw_*`` steps and direct
    execution inlined) and a choice point that updates its ready list after a retire
    instead of scanning again make the runs the plain sim makes: the same decisions,
    retire trace, digest, findings and race reports, under every schedule kind, with
    overlap, logical ranks (host flags), the forward thread (host choices), faults that
    race, and the detector-less reference run."""
    from overlapcheck.device.sim import SimRuntime
    from overlapcheck.engine import EngineConfig
    from overlapcheck.protocol import generate
    from overlapcheck.run import Case, ScheduleSpec, execute

    base = dict(page_size=2, pool_tokens=96, row_width=32, max_running=4, chunk_size=8,
                spec_steps=3)
    configs = [EngineConfig(**base), EngineConfig(**base, tp=2),
               EngineConfig(**base, forward_thread=True, kv_backup=True),
               EngineConfig(**base, overlap=False, draft_kind="eagle")]
    spec = ScheduleSpec(*schedule)
    raced = decided = 0
    for i, cfg in enumerate(configs):
        for faults in ((), ("index-no-record-stream",), ("single-staging-buffer",)):
            case = Case(cfg, generate(i, 5, cfg, max_prompt=10, max_new=12), spec, faults=faults)
            runs = []
            for make in (SimRuntime, _PlainSim.make):
                rt = make(spec.make(), access="declared")
                out = execute(case, runtime=rt)
                runs.append((list(out.choices), out.retired, out.marks, out.digest, out.status,
                             [f.text for f in out.findings], [str(r) for r in out.races],
                             rt.calls, rt.launches, rt.syncs))
            assert runs[0] == runs[1]
            raced += bool(runs[0][6])
            decided += sum(1 for c in runs[0][0] if c != 1)
        refs = []
        for make in (SimRuntime, _PlainSim.make):
            rt = make(ScheduleSpec("eager", 0).make(), detect=False, access="declared")
            out = execute(Case(cfg, case.workload, ScheduleSpec("eager", 0), ("parity",)),
                          runtime=rt)
            refs.append((list(out.choices), out.digest, out.result.summary, rt.calls))
        assert refs[0] == refs[1]
    assert raced and decided     # races and real decisions were compared, not only empties


def test_pct_takes_the_first_ready_stream_of_the_highest_priority():
    """PCT's pick (a loop over the ready streams, each unseen one drawing its priority in
    turn) is ``max`` over (priority, -index), with the same draws of its generator: the
    same decisions and the same random state after each, over many random point shapes,
    ties and priority drops included."""
    import random
    from overlapcheck.device.sched import PCT

    class MaxPCT(PCT):
        def choose(self, n, ready, forced):
            self.count += 1
            if not forced and self.rng.random() < self.p_stop:
                return 0
            best = max(range(len(ready)), key=lambda i: (self._prio(ready[i]), -i))
            if self.count in self.changes:
                self.low -= 1.0
                self.prio[ready[best]] = self.low
            return best if forced else best + 1

    names = ["schedule", "forward", "copy", "backup", "s4"]
    picks = set()
    for seed in range(40):
        a, b = PCT(random.Random(seed), horizon=20), MaxPCT(random.Random(seed), horizon=20)
        shape = random.Random(1000 + seed)
        if seed % 4 == 0:           # ties: every stream at one priority
            a.prio = dict.fromkeys(names, 1.5)
            b.prio = dict.fromkeys(names, 1.5)
        for _ in range(60):
            ready = sorted(shape.sample(names, shape.randint(1, 5)), key=names.index)
            forced = shape.random() < 0.3
            n = len(ready) if forced else len(ready) + 1
            c = a.choose(n, ready, forced)
            assert c == b.choose(n, ready, forced)
            assert a.rng.getstate() == b.rng.getstate() and a.prio == b.prio
            picks.add(c)
    assert len(picks) >= 4      # stops and several streams were picked


def _reference_trace(case, rt):
    """Parity's reference run of ``case`` on ``rt``: its result (or the exception it
    raised), the runtime's counts, and every device allocation's name, memory and shape
    (which block the allocator handed out: the same ones hold the same stale values)."""
    from overlapcheck import targets
    from overlapcheck.device.sched import Eager
    target = targets.get(case.target)
    allocs = []
    empty = rt.empty

    def spy(shape, dtype, name, stream):
        buf = empty(shape, dtype, name, stream)
        allocs.append((name, buf.mem, tuple(buf.t.shape)))
        return buf

    rt.empty = spy
    session = target.open(target.reference_config(case.config), Eager(), None, detect=False,
                          trace=False, runtime=rt)
    try:
        result = session.run(case.workload)
    except Exception as e:  # noqa: BLE001 - compared as it is
        result = f"{type(e).__name__}: {e}"
    return result, rt.syncs, rt.launches, allocs


def test_straight_runtime_is_the_eager_sim_on_reference_runs():
    """Parity's reference run on ``StraightRuntime`` (each op at its host call, no choice
    points) gives what the sim under the eager schedule without a detector gives, on the
    fuzzer's cases of every model: the same result, syncs and launches, and every
    allocation gets the same block (so the same stale contents); ``reference_run`` uses
    it by default."""
    from hypothesis import HealthCheck, Phase, given, settings

    from overlapcheck.device.sched import Eager
    from overlapcheck.device.sim import SimRuntime, StraightRuntime
    from overlapcheck.fuzz.strategies import cases
    from overlapcheck.run import driver
    seen = {"runs": 0, "reused": 0, "failed": 0, "models": set()}

    @settings(max_examples=120, phases=(Phase.generate,), database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(cases(models=("oracle", "tiny")))
    def prop(case):
        plain = _reference_trace(case, SimRuntime(Eager(), detect=False, access="declared"))
        straight = _reference_trace(case, StraightRuntime())
        assert straight == plain
        assert driver.reference_run(case) == driver.reference_run(case, straight=False)
        seen["runs"] += 1
        seen["failed"] += isinstance(plain[0], str)
        allocs = plain[3]
        seen["reused"] += len(allocs) - len({mem for _, mem, _ in allocs})
        seen["models"].add(case.config.model)

    prop()
    assert seen["runs"] == 120 and seen["reused"] > 1000   # stale blocks were compared
    assert {"oracle", "tiny"} <= seen["models"]


def test_straight_runtime_raises_a_closure_error_at_the_next_host_call_as_the_sim():
    """A closure's exception comes out at the next host call, as under the eager sim's
    direct execution; a blocking copy's at the copy; counts and allocator knowledge as
    the sim's."""
    from overlapcheck.device.sched import Eager
    from overlapcheck.device.sim import SimRuntime, StraightRuntime

    def boom(t):
        raise ZeroDivisionError("boom")

    def run(rt):
        seen = []
        s, c = rt.new_stream("s"), rt.new_stream("c")
        dev = rt.empty((4,), torch.int64, "d", s)
        pin = rt.host_empty((4,), torch.int64, "p")
        rt.launch(s, boom, dev.t)
        seen.append("launched")
        try:
            rt.host_write(pin, [1, 2, 3, 4])
        except ZeroDivisionError as e:
            seen.append(str(e))
        rt.host_write(pin, [1, 2, 3, 4])                # the failed call wrote nothing
        rt.copy(dev, pin, s, non_blocking=True)
        c.wait_stream(s)
        rt.record_stream(dev, c)
        rt.free(dev)
        again = rt.empty((4,), torch.int64, "d", s)     # c's work is not known done: fresh
        c.synchronize()
        third = rt.empty((4,), torch.int64, "d", s)     # now it is: the stale block
        rt.copy(pin, third, s)                          # blocking
        seen.append((again.mem != dev.mem, third.mem == dev.mem, rt.host_list(pin),
                     rt.syncs, rt.launches))
        return seen

    plain = run(SimRuntime(Eager(), detect=False, access="declared"))
    assert plain == ["launched", "boom", (True, True, [1, 2, 3, 4], 2, 1)]
    assert run(StraightRuntime()) == plain


def test_a_fresh_allocation_fill_is_a_write_of_the_allocating_stream():
    """The poison fill of fresh memory is the allocating stream's write (a fill kernel
    there on a GPU): a zeroing on another stream races with it unless that stream waits
    for the allocating one; a block the allocator hands back is not filled again, and
    pinned memory is filled by the host, before anything can touch it."""
    from overlapcheck.device.api import is_fill
    for wait in (False, True):
        rt, s, f = _rt()
        table = rt.empty((4, 8), torch.int64, "req_to_token", f)
        if wait:
            s.wait_stream(f)
        rt.launch(s, torch.Tensor.zero_, table.t, name="zero_table", writes=[table])
        rt.synchronize()
        if wait:
            assert not rt.reports
        else:
            (r,) = rt.reports
            assert r.kind == "stream-stream" and is_fill(r.previous.op)
            assert (r.previous.op.name, r.current.op.name) == ("fill req_to_token", "zero_table")
            assert r.previous.ctx_name == "f" and r.current.ctx_name == "s"
    rt, s, f = _rt()
    a = rt.empty((4,), torch.int64, "a", s)
    rt.free(a)
    s.synchronize()
    b = rt.empty((4,), torch.int64, "b", s)     # the same block, stale: no fill
    rt.launch(f, lambda x: x.fill_(3), b.t, name="w", writes=[b])
    pin = rt.host_empty((4,), torch.int64, "pin")
    rt.copy(pin, b, f, non_blocking=True)
    rt.synchronize()
    assert not [r for r in rt.reports if is_fill(r.previous.op) or is_fill(r.current.op)]

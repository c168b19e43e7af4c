"""One run of vLLM's scheduler under overlapcheck: the engine-core loop of
``EngineCore.step_with_batch_queue`` (upstream ``vllm/v1/engine/core.py``), with the
fake runner in place of the executor and the ``Chooser`` at the points a real
deployment leaves to timing.

A host step (``iteration``):

1. arrivals due now are added (``add_request``);
2. aborts due now: each is a point on lane ``abort`` — taken now (the input queue,
   before scheduling) or left for the ``late`` slot (vLLM's aborts queue, processed
   right before the next ``update_from_output``);
3. if the scheduler has requests and the batch queue has room: ``schedule()``, and the
   runner runs the batch at once (batches run in issue order);
4. the oldest batch's output is applied (``update_from_output``) when the queue is
   full or nothing more can be scheduled — the real engine's rule — or earlier when
   the strategy declines lane ``ahead`` (keep the batch in flight and schedule ahead);
   the sync scheduler applies it at once and then takes the drafts (``post_step``);
5. the scheduler's state is read back into events; ``StepEnd``.

The eager strategy advances every lane: aborts at once, the queue kept full — the
behaviour of a real async engine. ``Stalls`` on ``ahead`` applies outputs early; on
``abort`` delays aborts into the batch-transition window.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional

from ...protocol import events as E
from ...protocol.results import RequestResult, RunResult, summarize
from ...protocol.target import Chooser, Session
from ...protocol.types import SEEDED
from ...protocol.workload import Workload
from .events import ReqCounters, VllmCounters, VllmFrame, VllmFrameDone, VllmSessionInfo
from .faults import patches_for
from .golden import Golden
from .observe import Tracker
from .runner import FakeRunner

_REASONS = {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH_CAPPED": "length",
            "FINISHED_ABORTED": "abort"}


class _Batch:
    __slots__ = ("bid", "so", "out", "entries")

    def __init__(self, bid, so, out, entries):
        self.bid, self.so, self.out, self.entries = bid, so, out, entries


class VllmSession(Session):
    """One run of ``cfg`` on scheduler ``sched`` (built for it, faults already in
    ``cfg.faults``): ``run`` drives it, ``close`` undoes the faults' patches.
    ``engine`` is the vLLM scheduler; there is no device runtime."""

    runtime = None

    def __init__(self, V, cfg, sched, strategy, observer, trace: bool = False,
                 detect: bool = True):
        self.V, self.cfg, self.sched = V, cfg, sched
        self.chooser = Chooser(strategy)
        self.observer = observer
        self.trace = trace
        self.iteration = 0
        self.clock = 0                             # scheduler calls so far (trace time)
        self._retired: List[tuple] = []
        self.goldens: Dict[int, Golden] = {}
        self.real = cfg.runner == "real"
        self.detect = detect
        self.watch = None                          # the real runner's watch block
        self._races: List[object] = []             # its reports not yet emitted
        self.race_reports: List[object] = []
        self.launches = None                       # the real runner's Triton launches
        self.syncs = None
        self.runner = None if self.real else FakeRunner(V, cfg, self.goldens)
        self.reqs: Dict[int, object] = {}          # rid -> vLLM Request (kept after it ends)
        self.tracker = None if self.real else Tracker(sched, self._emit, cfg.max_num_seqs,
                                                      cfg.block_size)
        self.queue: deque = deque()
        self.next_bid = 0
        self.accepts: Dict[int, List[int]] = {}
        self.verifies: Dict[int, int] = {}
        self.ended: Dict[int, str] = {}
        self.late: List[int] = []
        self.progress = 0                          # the last step a token was kept or a request ended
        self.patches = patches_for(cfg.faults)
        self._open = True
        if sched is not None:
            self._attach(sched)

    def _attach(self, sched) -> None:
        self.sched = sched
        if self.tracker is None:
            self.tracker = Tracker(sched, self._emit, self.cfg.max_num_seqs,
                                   self.cfg.block_size)
        for p in self.patches:
            p.bind(sched)

    @property
    def races(self) -> list:
        return self.race_reports

    @property
    def engine(self):
        return self.sched

    @property
    def choices(self) -> List[int]:
        return self.chooser.choices

    @property
    def retired(self) -> list:
        return list(self._retired)

    def close(self) -> None:
        """Drop the faults' patches from the scheduler (idempotent)."""
        if self._open:
            self._open = False
            if self.sched is not None:
                for p in self.patches:
                    p.unbind(self.sched)

    def _emit(self, ev) -> None:
        if self.observer is not None:
            self.observer(ev)

    def _tick(self, lane: str, what: str) -> None:
        """One scheduler call: the trace's logical clock, and its record with ``trace``."""
        self.clock += 1
        if self.trace:
            self._retired.append((lane, what, self.clock))

    # -- the loop ------------------------------------------------------------------------------
    def run(self, workload: Workload, max_steps: Optional[int] = None) -> RunResult:
        """Run ``workload`` to the end (``check_workload`` has accepted it). The step
        bound is ``max_steps``, else the config's ``max_steps``, else derived from the
        workload; past it, ``Stalled`` then ``EngineStuck``."""
        try:
            if self.real:
                return self._run_real(workload, max_steps)
            return self._run(workload, max_steps)
        finally:
            self.close()

    def _run_real(self, workload: Workload, max_steps: Optional[int]) -> RunResult:
        """vLLM's own V2 runner, built for this run inside a ``watch`` block on the CPU
        shim (``real_runner``), the config's runner faults in place; its races are
        reported at vLLM's lines as ``RaceFound`` events."""
        import contextlib
        import os

        import vllm

        from overlapcheck.watch import watch
        from . import real_runner, runner_faults
        from .env import build_scheduler
        with contextlib.ExitStack() as stack:
            if self.detect:
                root = os.path.dirname(os.path.abspath(vllm.__file__))
                self.watch = stack.enter_context(watch(
                    device="cpu", mode="collect", user_roots=(root,),
                    on_report=self._races.append))
            else:   # the shim gives the runner's torch.cuda calls their CPU meaning
                stack.enter_context(watch(device="cpu", mode="collect"))
            stack.enter_context(runner_faults.applied(self.cfg.faults))
            runner, vc, kv, self.syncs, self.launches = stack.enter_context(
                real_runner.built(self.cfg, self.V))
            if self.watch is not None:
                self.watch.tracker.name_stream(runner.output_copy_stream.cuda_stream,
                                               "output copy stream",
                                               "self.output_copy_stream")
            with self._ours():
                self._attach(build_scheduler(self.cfg, self.V, vc, kv))
            self.runner = real_runner.RealRunner(runner)
            return self._run(workload, max_steps)

    def _ours(self):
        """The block is the session's own bookkeeping, not vLLM's run: unwatched."""
        import contextlib
        return self.watch.paused() if self.watch is not None else contextlib.nullcontext()

    def _flush_races(self) -> None:
        it = self.iteration
        for rep in self._races:
            self.race_reports.append(rep)
            self._emit(E.RaceFound(it, -1, rep))
        self._races.clear()

    def _run(self, workload: Workload, max_steps: Optional[int]) -> RunResult:
        from ...protocol import EngineStuck
        cfg = self.cfg
        self._emit(VllmSessionInfo(0, -1, cfg.scheduler, cfg.depth, cfg.spec_tokens,
                                   cfg.block_size, cfg.defer_block_free, tuple(cfg.faults),
                                   cfg.vocab, cfg.agreement))
        arrivals: Dict[int, list] = {}
        for spec in workload.requests:
            arrivals.setdefault(spec.arrival, []).append(spec)
        pending = sorted((a.step, a.rid) for a in workload.aborts)
        last_arrival = max((s.arrival for s in workload.requests), default=0)
        bound = max_steps or cfg.max_steps or (256 + last_arrival + 16 * sum(
            len(s.prompt) + s.max_new_tokens for s in workload.requests))
        # a live engine keeps a token or ends a request at least this often: a longest
        # request's whole prefill, one token a step, with room to spare
        quiet = 64 + 8 * max((len(s.prompt) + s.max_new_tokens for s in workload.requests),
                             default=0)
        while True:
            it = self.iteration
            if it > last_arrival and not self.queue and not self.sched.has_requests():
                break
            msg = None
            if it >= bound:
                msg = f"the vllm target's step bound ({bound} steps) ran out"
            elif it - max(self.progress, last_arrival) > quiet:
                since = max(self.progress, last_arrival)
                msg = (f"no request kept a token or ended in the {it - since} steps since step "
                       f"{since} ({len(self.sched.requests)} live)")
            if msg is not None:
                self._emit(E.Stalled(it, -1, "steps", msg))
                raise EngineStuck(msg)
            for spec in sorted(arrivals.get(it, ()), key=lambda s: s.rid):
                self._add(spec)
            due = [rid for step, rid in pending if step <= it and rid in self.reqs]
            pending = [(s, r) for s, r in pending if not (s <= it and r in self.reqs)]
            for rid in sorted(set(due + self.late)):
                if rid in self.late:
                    self.late.remove(rid)
                if self.chooser.point(["abort"]) == 0:
                    self._abort(rid)
                else:
                    self.late.append(rid)
            self._step()
            self._end_step()
            self.iteration += 1
        res = self._result()
        self._emit(E.RunEnd(self.iteration, -1, res))
        return res

    def _step(self) -> None:
        sched = self.sched
        if sched.has_requests() and len(self.queue) < self.cfg.depth:
            so = sched.schedule()
            executed = so.total_num_scheduled_tokens > 0
            bid = -1
            if executed:
                bid, self.next_bid = self.next_bid, self.next_bid + 1
            self._tick("schedule", f"schedule -> batch {bid}" if executed else "schedule (empty)")
            out, entries = self.runner.execute(so)
            if executed:
                self._tick("forward", f"batch {bid}")
            self.queue.append(_Batch(bid, so, out, entries))
            self._after_schedule(so, bid, entries)
            if len(self.queue) < self.cfg.depth and (executed or sched.has_requests()):
                if self.chooser.point(["ahead"]) == 0:
                    return
        if self.queue:
            self._process(self.queue.popleft())

    # -- the scheduler's calls, and what they changed ----------------------------------------
    def _add(self, spec) -> None:
        V, cfg = self.V, self.cfg
        seeded = spec.sampling == SEEDED
        self.goldens[spec.rid] = Golden(spec.prompt, spec.seed, seeded, cfg.vocab, cfg.agreement)
        sp = V.SamplingParams(max_tokens=spec.max_new_tokens,
                              stop_token_ids=list(spec.stop_ids[1:]),
                              temperature=1.0 if seeded else 0.0,
                              seed=spec.seed if seeded else None)
        if spec.stop_ids:   # the first stop id plays the model's EOS, the rest stop ids
            sp.update_from_generation_config({}, eos_token_id=spec.stop_ids[0])
        hasher = None
        if cfg.prefix_caching:      # as the engine core builds requests with the cache on
            from .env import block_hasher
            hasher = block_hasher(cfg.block_size)
        req = V.Request(request_id=str(spec.rid), prompt_token_ids=list(spec.prompt),
                        sampling_params=sp, pooling_params=None,
                        arrival_time=float(spec.arrival) + spec.rid * 1e-6,
                        block_hasher=hasher)
        self.reqs[spec.rid] = req
        self.accepts[spec.rid] = []
        self.verifies[spec.rid] = 0
        self.sched.add_request(req)
        self._emit(E.Arrived(self.iteration, -1, spec.rid, spec))

    def _abort(self, rid: int) -> None:
        if rid in self.ended:
            return
        gone = self.sched.finish_requests(str(rid), self.V.RequestStatus.FINISHED_ABORTED)
        self._tick("abort", f"abort request {rid}")
        for req in gone:
            self._gone(int(req.request_id), "abort", -1)

    def _gone(self, rid: int, how: str, batch: int) -> None:
        """Emit the memory and row moves of ``rid``'s end, then its end event."""
        it, req = self.iteration, self.reqs[rid]
        self.tracker.rows_update(it, batch, self._running())
        self.tracker.memory(it, batch, {rid: how})
        self.ended[rid] = how
        self.progress = it
        toks = tuple(req.output_token_ids)
        if how == "abort":
            self._emit(E.Aborted(it, batch, rid, toks))
        else:
            self._emit(E.Finished(it, batch, rid, how, toks))

    def _running(self):
        return {int(r.request_id) for r in self.sched.running}

    def _after_schedule(self, so, bid: int, entries) -> None:
        it = self.iteration
        preempted = sorted(int(r) for r in so.preempted_req_ids)
        self.tracker.rows_update(it, bid, self._running())
        self.tracker.memory(it, bid, {rid: "retract" for rid in preempted})
        for rid in preempted:
            self._emit(E.Retracted(it, bid, rid, 0))
        if bid < 0:
            return
        kinds = {e.kind for e in entries}
        kind = "decode" if kinds <= {"decode"} else "prefill"
        rids = tuple(e.rid for e in entries)
        if self.real:       # what the runner ran is known when its output is taken
            rids = tuple(int(r) for r in so.num_scheduled_tokens)
            kind = "decode" if all(int(r) in self.runner.sampled and not any(
                nr.req_id == r for nr in so.scheduled_new_reqs)
                for r in so.num_scheduled_tokens) else "prefill"
        self._emit(E.Scheduled(it, bid, kind, rids))
        self._emit(E.Launched(it, bid, kind, ("forward",)))
        self._emit(VllmFrame(it, bid, entries))

    def _process(self, b: _Batch) -> None:
        sched, it = self.sched, self.iteration
        late, self.late = self.late, []
        for rid in sorted(late):
            self._abort(rid)
        out, entries = b.out, b.entries
        if self.real:
            out, entries = self.runner.output(b.so, b.out)
            b.entries = entries
        outs = sched.update_from_output(b.so, out)
        self._tick("output", f"update_from_output <- batch {b.bid}")
        got: Dict[int, object] = {}
        for eco in outs.values():
            for o in eco.outputs:
                got[int(o.request_id)] = o
        if b.bid >= 0:
            self._emit(VllmFrameDone(it, b.bid))
        for e in b.entries:
            o = got.get(e.rid)
            toks = tuple(o.new_token_ids) if o is not None else ()
            self._tokens(e, b.bid, toks)
        ends = sorted(rid for rid, o in got.items() if o.finish_reason is not None)
        reasons = {rid: _REASONS.get(self.reqs[rid].status.name, "finish") for rid in ends}
        self.tracker.rows_update(it, b.bid, self._running())
        self.tracker.memory(it, b.bid, reasons)
        for rid in ends:
            self.ended[rid] = reasons[rid]
            self.progress = it
            self._emit(E.Finished(it, b.bid, rid, reasons[rid],
                                  tuple(self.reqs[rid].output_token_ids)))
        if not self.cfg.is_async and self.cfg.spec_tokens:
            drafts = self.runner.draft_token_ids([e.rid for e in b.entries])
            if drafts is not None:
                sched.update_draft_token_ids(drafts)

    def _tokens(self, e, bid: int, toks) -> None:
        it = self.iteration
        if toks:
            self.progress = it
        if e.kind in ("chunk", "unknown", "overrun") and not toks:
            self._emit(E.Prefilled(it, bid, e.rid, -1, False))
        elif e.kind == "prefill" and len(toks) <= 1:
            self._emit(E.Prefilled(it, bid, e.rid, toks[0] if toks else -1, not toks))
        elif toks:
            idx = self.verifies[e.rid]
            self.verifies[e.rid] = idx + 1
            self.accepts[e.rid].append(e.accepted + 1)
            self._emit(E.Verified(it, bid, e.rid, idx, e.accepted + 1, toks, False))
        elif e.samples:
            self._emit(E.Verified(it, bid, e.rid, -1, e.accepted + 1, e.tokens, True))

    def _end_step(self) -> None:
        with self._ours():
            self._flush_races()
            self._observed()

    def _observed(self) -> None:
        it, sched = self.iteration, self.sched
        live = sorted((int(k), r) for k, r in sched.requests.items())
        inflight = tuple(b.bid for b in self.queue if b.bid >= 0)
        per: Dict[int, List[int]] = {}
        for b in self.queue:
            if b.bid >= 0:
                for e in b.entries:
                    per.setdefault(e.rid, []).append(b.bid)
        self._emit(VllmCounters(it, -1, tuple(ReqCounters(
            rid, r.status.name, r.num_computed_tokens, r.num_tokens, r.num_output_placeholders,
            r.num_in_flight_tokens, r.num_stale_output_tokens, len(r.spec_token_ids))
            for rid, r in live)))
        idle = not self.queue and not sched.has_requests()
        self._emit(E.StepEnd(it, -1, self.tracker.snapshot(live, inflight, per, idle)))

    def _result(self) -> RunResult:
        reqs = {}
        for rid, req in sorted(self.reqs.items()):
            reqs[rid] = RequestResult(rid, tuple(req.output_token_ids),
                                      self.ended.get(rid, "none"), tuple(self.accepts[rid]),
                                      req.num_preemptions)
        s = summarize(reqs, self.iteration, self.next_bid, 0, 0, 0)
        return RunResult(reqs, s)

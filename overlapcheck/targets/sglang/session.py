"""One run of SGLang's real scheduler, one host iteration at a time.

``SglangSession.run(workload)`` feeds the workload to the scheduler as its
``recv_requests`` would return it (``TokenizedGenerateReqInput``/``AbortReq``) and runs
the body of SGLang's own event loop once per step — ``event_loop_overlap`` or
``event_loop_normal``, re-written here statement for statement around the scheduler's
own methods (``ingest_requests``, ``get_next_batch_to_run``,
``is_disable_overlap_for_batch``, ``run_batch``, ``process_batch_result``,
``launch_batch_sample_if_needed``, ``on_idle``) — and turns what its state shows after
each step into observer events (``observe.py``).

Choice points (the ``Chooser`` lanes), what is nondeterministic in a deployment:

* ``recv``: whether a message that is due (an arrival at its step, an abort at its
  step) has reached the scheduler's socket by this poll, or comes at a later one;
  an abort that arrives later meets its request in another batch;
* ``overlap`` (overlap loop, a step with a batch to launch while a result is queued):
  advanced, the result of the last batch is processed after the next one is launched
  (SGLang's default); held, it is processed first, as SGLang does at a
  ``disable_overlap_for_batch`` boundary (consecutive prefills, grammar sync);
* ``decode`` (a step whose running batch decodes): held, SGLang's own test knob
  ``SGLANG_TEST_RETRACT`` (interval 1) forces a retraction in that step's
  ``update_running_batch``.

Nothing else varies: the workload's sampling seeds reach the model through each
request's ``sampling_seed``, and the global RNGs SGLang seeds at construction are
seeded again from its ``random_seed`` at the start of every run, so a run's event
stream depends on (config, workload, choices) only.
"""
from __future__ import annotations

import contextlib
from array import array
from collections import deque
from typing import Dict, List, Optional

from overlapcheck.protocol import events as E
from overlapcheck.protocol.results import RequestResult, RunResult, summarize
from overlapcheck.protocol.types import GREEDY

from ...protocol.target import Chooser, Session
from .observe import Observer, visible


MAX_RID = 10 ** 8 - 1


def rid_name(rid: int) -> str:
    """SGLang matches aborts by rid *prefix* ("r2" also aborts "r20"): fixed-width
    names with a terminator are never a prefix of one another."""
    return f"oc-{rid:08d}-"


class SglangSession(Session):
    """One run of a built scheduler (``build.Built``) for ``cfg``; its decisions come
    from ``strategy``, its events go to ``observer``."""

    def __init__(self, built, cfg, strategy, observer, detect: bool = True):
        self.built = built
        self.s = built.scheduler
        self.cfg = cfg
        self.chooser = Chooser(strategy)
        self.observer = observer
        self.iteration = 0
        self.points = 0
        self.bid = -1
        self._patches: Optional[contextlib.ExitStack] = None
        self._closed = False
        self.launches = None        # a real worker's Triton launches (twins.Launches)
        # a real worker runs SGLang's CUDA path under watch's CPU shim (cuda_path)
        self.watched = bool(detect and cfg.real_worker)
        self.watch = None
        self._races: List[object] = []   # watch reports not yet emitted
        self.race_reports: List[object] = []

    @property
    def engine(self):
        return self.s

    @property
    def clock(self) -> int:
        return self.points

    @property
    def choices(self) -> List[int]:
        return self.chooser.choices

    def point(self, lane: str) -> int:
        """A choice point with one lane: 0 when it advances, -1 when it is held."""
        self.points += 1
        return self.chooser.point([lane])

    def emit(self, ev) -> None:
        if self.observer is not None:
            self.observer(ev)

    # -- messages -------------------------------------------------------------------------
    def _generate_req(self, spec):
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams
        sp = SamplingParams(
            max_new_tokens=spec.max_new_tokens,
            stop_token_ids=set(spec.stop_ids) or None,
            temperature=0.0 if spec.sampling == GREEDY else 1.0,
            sampling_seed=spec.seed, skip_special_tokens=False)
        sp.normalize(None)          # what the tokenizer manager does before sending
        sp.verify(self.cfg.vocab)
        return TokenizedGenerateReqInput(
            rid=rid_name(spec.rid), input_text=None, input_ids=array("q", spec.prompt),
            input_embeds=None, mm_inputs=None, token_type_ids=None, sampling_params=sp,
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
            token_ids_logprob=None, stream=False)

    def _abort_req(self, rid: int):
        from sglang.srt.managers.io_struct import AbortReq
        return AbortReq(rid=rid_name(rid))

    # -- the run ----------------------------------------------------------------------------
    def run(self, workload, max_steps: Optional[int] = None) -> RunResult:
        """Run ``workload`` to the end (``max_steps``: the step bound, default the
        config's ``step_bound``). SGLang's patches for the run (its runtime context, the
        CPU kernels, the config's faults) are in place only while it runs."""
        from sglang.srt.utils.common import DynamicGradMode
        from .faults import applied
        from .kernels import cpu_kernels
        if self._closed:
            raise RuntimeError("sglang: the session is closed")
        bound = self.cfg.step_bound if max_steps is None else max_steps
        self._patches = contextlib.ExitStack()
        try:
            with self._patches:
                from .. import logs
                self._patches.enter_context(logs.routed())
                self._patches.enter_context(self.built.active())
                self._patches.enter_context(DynamicGradMode())
                self._patches.enter_context(cpu_kernels())
                if self.cfg.real_worker:
                    from .real_worker import running, upstream_fixes
                    fixes = upstream_fixes(self.cfg.worker, self.cfg.overlap)
                    self.launches = self._patches.enter_context(running(self.s, fixes=fixes))
                if self.watched:
                    self._enter_watch(self._patches)
                self._patches.enter_context(applied(self.cfg.faults))
                # a run that raises leaves the scheduler in a state no flush is trusted
                # to undo: the next session builds a fresh one
                self.built.busy = True
                result = self._loop(workload, bound)
                self.built.busy = False
        finally:
            self._patches = None
        self.emit(E.RunEnd(self.iteration, -1, result))
        return result

    def _enter_watch(self, stack: contextlib.ExitStack) -> None:
        """Run under ``watch``'s CPU shim on SGLang's CUDA path (``cuda_path``); its
        races are reported at SGLang's own lines and become ``RaceFound`` events."""
        import os

        import sglang

        from overlapcheck.watch import watch
        from .cuda_path import on_shim
        root = os.path.dirname(os.path.abspath(sglang.__file__))
        self.watch = stack.enter_context(watch(device="cpu", mode="collect",
                                               user_roots=(root,),
                                               on_report=self._races.append))
        stack.enter_context(on_shim(self.s))

    def _ours(self):
        """The block is the session's own bookkeeping, not SGLang's run: unwatched."""
        return self.watch.paused() if self.watch is not None else contextlib.nullcontext()

    @property
    def races(self) -> list:
        return self.race_reports

    def close(self) -> None:
        """Idempotent. Every patch is already undone when ``run`` returns or raises;
        this undoes them for a run that was left in the middle, and leaves the
        scheduler quiet (its debug batch cleared)."""
        if self._patches is not None:
            self._patches.close()
            self._patches = None
        self.s.cur_batch_for_debug = None
        self._closed = True

    def _loop(self, workload, bound: int) -> RunResult:
        from overlapcheck.protocol.target import EngineStuck
        specs = {r.rid: r for r in workload.requests}
        due = sorted([(r.arrival, 0, r.rid) for r in workload.requests]
                     + [(a.step, 1, a.rid) for a in workload.aborts])
        self._prepare()
        self.pending: deque = deque()      # (kind, rid) due but not yet delivered
        self.reqs: Dict[int, object] = {}  # rid -> SGLang Req, once created
        self.ended: Dict[int, str] = {}
        self.prompt_len = {rid: len(sp.prompt) for rid, sp in specs.items()}
        self.verifies: Dict[int, int] = {}
        self.accepts: Dict[int, List[int]] = {rid: [] for rid in specs}
        self.retracts: Dict[int, int] = {rid: 0 for rid in specs}
        self.obs = Observer(self.s, self.cfg.page_size, self.emit)
        while True:
            it = self.iteration
            while due and due[0][0] <= it:
                _, kind, rid = due.pop(0)
                self.pending.append((kind, rid))
            self._deliver(it, specs)
            self._body(it)
            self._observe(it, specs)
            self.iteration += 1
            if not due and not self.pending and len(self.ended) == len(specs) and self._idle():
                break
            if self.iteration >= bound:
                live = sorted(set(specs) - set(self.ended))
                self.emit(E.Stalled(it, -1, "steps", f"{len(live)} requests still live after "
                                    f"{bound} steps (first: {live[:5]})"))
                raise EngineStuck(f"sglang: step bound {bound} ran out")
        return self._result(specs)

    def _prepare(self) -> None:
        """What ``run_event_loop`` and ``event_loop_overlap`` set up before looping,
        plus a reset of what a previous run on this scheduler left (SGLang's own
        ``flush_cache``, which empties the KV pool and the request pool)."""
        from sglang.srt.utils.common import set_random_seed
        s = self.s
        if not s.flush_cache(empty_cache=False):
            raise RuntimeError("sglang: the reused scheduler is not idle")
        # the scheduler seeds the global RNGs at construction (its random_seed, from
        # the config); seeding them again per run makes a real-forward run independent
        # of the runs before it
        set_random_seed(s.random_seed)
        s.forward_ct = 0
        s.last_batch = None
        s.running_batch = type(s.running_batch).init_new(
            [], s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache,
            s.model_config, s.enable_overlap, s.spec_algorithm)
        if not self.watched:
            s.schedule_stream.synchronize = lambda: None   # as run_event_loop on CPU
            s._war_barrier_enabled = False                 # CUDA only (cuda_path turns it on)
        s.enable_continuous_input_polling = False
        s.enable_skip_finishing_decode = bool(s.enable_overlap)
        s.result_queue = deque()
        self.built.pipes.inbox.clear()
        self.built.pipes.outbox.clear()
        if self.built.fake_worker is not None:
            self.built.fake_worker.reset(self.cfg)
        s.new_token_ratio_tracker.current = s.new_token_ratio_tracker.init
        self.queued_bids: deque = deque()

    def _deliver(self, it: int, specs) -> None:
        keep = deque()
        while self.pending:
            kind, rid = self.pending.popleft()
            if self.point("recv") == 0:
                if kind == 0:
                    self.built.pipes.inbox.append(self._generate_req(specs[rid]))
                    self.emit(E.Arrived(it, -1, rid, specs[rid]))
                else:
                    self.built.pipes.inbox.append(self._abort_req(rid))
            else:
                keep.append((kind, rid))
        self.pending = keep

    def _idle(self) -> bool:
        return bool(self.s.is_fully_idle())

    # -- the loop bodies ------------------------------------------------------------------------
    def _body(self, it: int) -> None:
        from sglang.srt.managers import scheduler as sched_mod
        s = self.s
        s.ingest_requests()
        self._track_new()
        decoding = s.running_batch is not None and not s.running_batch.is_empty()
        force = decoding and self.point("decode") == -1
        sched_mod.TEST_RETRACT, sched_mod.TEST_RETRACT_INTERVAL = force, 1
        try:
            plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        finally:
            sched_mod.TEST_RETRACT = False
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        s.cur_batch_for_debug = batch
        if s.enable_overlap:
            self._overlap_body(batch)
        else:
            self._normal_body(batch)

    def _normal_body(self, batch) -> None:
        s = self.s
        if batch:
            self._launched(batch)
            result = s.run_batch(batch)
            self._process(batch, result)
        else:
            s._sched_idled = True
            s.on_idle()
        s.last_batch = batch

    def _overlap_body(self, batch) -> None:
        s = self.s
        disable = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)
        if not disable and batch and s.result_queue and self.point("overlap") == -1:
            disable = True
        if disable:
            self._pop_and_process()
        if batch:
            self._launched(batch)
            batch_result = s.run_batch(batch)
            s._apply_war_barrier()
            s.result_queue.append((batch.copy(), batch_result))
            self.queued_bids.append(self.bid)
        else:
            batch_result = None
            s._sched_idled = True
        if s.last_batch:
            if not disable:
                self._pop_and_process()
        elif batch is None:
            s.on_idle()
        if s.is_generation:
            s.launch_batch_sample_if_needed(batch_result, batch)
        s.last_batch = batch

    def _pop_and_process(self) -> None:
        b, r = self.s.result_queue.popleft()
        bid = self.queued_bids.popleft()
        self._process(b, r, bid)

    def _launched(self, batch) -> None:
        self.bid += 1
        kind = "prefill" if batch.forward_mode.is_extend() else "decode"
        rids = tuple(self._rid(r) for r in batch.reqs)
        self.emit(E.Scheduled(self.iteration, self.bid, kind, rids))
        self.emit(E.Launched(self.iteration, self.bid, kind, ()))

    def _process(self, batch, result, bid: Optional[int] = None) -> None:
        bid = self.bid if bid is None else bid
        before = {id(r): len(visible(r)) for r in batch.reqs}
        self.s.process_batch_result(batch, result)
        with self._ours():
            self._processed(batch, result, bid, before)

    def _processed(self, batch, result, bid: int, before) -> None:
        decode = batch.forward_mode.is_decode()
        accepts = None
        if decode and result.accept_lens is not None:
            accepts = [int(x) for x in result.accept_lens.tolist()]
        for i, req in enumerate(batch.reqs):
            rid = self._rid(req)
            new = visible(req)[before[id(req)]:]
            if not decode:
                if new:
                    self.emit(E.Prefilled(self.iteration, bid, rid, new[0], False))
                    if len(new) > 1:
                        self._verified(bid, rid, 1, tuple(new[1:]))
                continue
            if not new:
                continue
            self._verified(bid, rid, accepts[i] if accepts else 1, tuple(new))

    def _verified(self, bid: int, rid: int, accept_len: int, tokens) -> None:
        idx = self.verifies.get(rid, 0)
        self.verifies[rid] = idx + 1
        self.accepts[rid].append(accept_len)
        self.emit(E.Verified(self.iteration, bid, rid, idx, accept_len, tokens, False))

    # -- bookkeeping ------------------------------------------------------------------------------
    def _rid(self, req) -> int:
        return int(req.rid[3:11])

    def _track_new(self) -> None:
        for req in self.s.waiting_queue:
            rid = self._rid(req)
            if rid not in self.reqs:
                self.reqs[rid] = req

    def _observe(self, it: int, specs) -> None:
        with self._ours():
            self._observed(it, specs)

    def _observed(self, it: int, specs) -> None:
        s = self.s
        for rep in self._races:
            self.race_reports.append(rep)
            self.emit(E.RaceFound(it, -1, rep))
        self._races.clear()
        self._track_new()
        aborted_out = {self._rid_str(o.rid) for o in self.built.pipes.outbox
                       if type(o).__name__ == "AbortReq" and o.rid}
        self.built.pipes.outbox.clear()
        live, reasons, ending = {}, {}, []
        for rid in sorted(aborted_out - set(self.reqs) - set(self.ended)):
            # created and aborted within one poll (its abort came with it): SGLang
            # popped it from the waiting queue before any step could see it
            self.ended[rid] = "abort"
            self.emit(E.Aborted(it, -1, rid, ()))
        for rid, req in self.reqs.items():
            if rid in self.ended:
                continue
            rc = int(req.retraction_count)
            if rc > self.retracts[rid]:
                reasons[rid] = "retract"
            if req.finished() or rid in aborted_out:
                abort = rid in aborted_out or _is_abort(req)
                reasons[rid] = "abort" if abort else "finish"
                ending.append((rid, req, abort))
            live[rid] = req
        self.obs.memory(it, -1, live, self.prompt_len, reasons)
        for rid, req in live.items():
            rc = int(req.retraction_count)
            while rc > self.retracts[rid]:
                self.retracts[rid] += 1
                self.emit(E.Retracted(it, -1, rid, int(req.kv.kv_committed_len)))
        for rid, req, abort in ending:
            self.ended[rid] = "abort" if abort else _reason(req)
            if abort:
                self.emit(E.Aborted(it, -1, rid, tuple(visible(req))))
            else:
                self.emit(E.Finished(it, -1, rid, self.ended[rid], tuple(visible(req))))
        states = {}
        waiting = {id(r) for r in s.waiting_queue}
        for rid, req in self.reqs.items():
            if rid in self.ended:
                states[rid] = ("aborted" if self.ended[rid] == "abort" else "finished", req)
            elif id(req) in waiting:
                states[rid] = ("waiting", req)
            elif not visible(req) or req is s.chunked_req:
                states[rid] = ("prefilling", req)
            else:
                states[rid] = ("running", req)
        inflight = tuple(self.queued_bids)
        self.emit(E.StepEnd(it, -1, self.obs.snapshot(states, inflight, self._idle())))

    @staticmethod
    def _rid_str(name: str) -> int:
        return int(name[3:11])

    def _result(self, specs) -> RunResult:
        reqs = {}
        for rid in specs:
            req = self.reqs.get(rid)
            toks = tuple(visible(req)) if req is not None else ()
            reqs[rid] = RequestResult(rid, toks, self.ended.get(rid, "abort"),
                                      tuple(self.accepts[rid]), self.retracts[rid])
        return RunResult(reqs, summarize(reqs, self.iteration, self.bid + 1, 0, 0, 0))


def _is_abort(req) -> bool:
    return type(req.finished_reason).__name__ == "FINISH_ABORT"


def _reason(req) -> str:
    name = type(req.finished_reason).__name__
    return {"FINISH_LENGTH": "length", "FINISH_MATCHED_TOKEN": "stop",
            "FINISH_MATCHED_STR": "stop", "FINISH_ABORT": "abort"}.get(name, name.lower())

"""The engine loop: one step = build and launch batch i, then process the result of
batch i-1 (overlap) or of batch i itself (non-overlap: the same code, synchronous).

Finishes are detected when a result is processed, so under overlap a finished request
still rides the batch launched before its finish was known; that batch's result for
it is dropped. Aborts only mark a request; it is torn down at once when it rides no
unprocessed batch, else when the last such batch is processed.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple

from ..device import StuckWait
from ..protocol import canary as C
from ..protocol import events as E
from ..protocol.results import RequestResult, RunResult, summarize
from ..protocol.target import EngineStuck
from ..protocol.types import (ABORT, ABORTED, FINISHED, LEGAL, LENGTH, PREFILL, PREFILLING,
                              RUNNING, STOP, WAITING, RequestSpec)
from .accounting import Memory
from .buffers import DeviceState
from .config import EngineConfig
from .faults import FaultSet
from .graphs import GraphedModel
from .scheduler import Scheduler
from .threads import (FORWARD, GET, POINT, PUT, SCHEDULER, HostThreads, ReadLog,
                      shared_state, written)
from .types import Batch, Request
from .worker import SpecWorker


class Engine:
    """``strict``: assert at every idle step that the pool is full and consistent (the
    tests' shortcut); otherwise leaks surface through the kv-accounting checker.
    ``canary``: launch the KV canary (for a model whose KV rows carry tags); by default
    only when someone observes the engine, since only the ``Canary`` events read it."""

    def __init__(self, cfg: EngineConfig, rt, model, observer: Optional[E.Observer] = None,
                 strict: bool = False, canary: Optional[bool] = None):
        self.cfg, self.rt, self.observer, self.strict = cfg, rt, observer, strict
        # an observer that takes a decode's results as ``VerifiedBatch`` runs (§5.4); the
        # run being gathered: its (batch, records, backup) and one row per entry
        self.batched = bool(getattr(observer, "batched", False))
        self._run_of: Optional[tuple] = None
        self._run: List[tuple] = []
        self.canary = observer is not None if canary is None else canary
        self._reported = 0      # race reports already delivered as events
        self.requests: Dict[int, Request] = {}
        # requests whose state may still change (not ended, or riding a batch), and the
        # states of those that settled, in the order they did (snapshot); requests parked
        # in the waiting queue, their state as last reported, until they leave it
        self._unsettled: Dict[int, Request] = {}
        self._settled: List[E.ReqState] = []
        self._parked: Dict[int, E.ReqState] = {}
        self._park_log: List[Tuple[int, Optional[E.ReqState]]] = []   # (rid, state | None)
        if rt.graphs:   # cuda graphs: model calls replay once every long-lived buffer exists
            model = GraphedModel(model)
        self.dev = DeviceState(rt, cfg, model.kv_width, getattr(model, "kv_dtype", None))
        self.mem = Memory(cfg, self.dev, self._emit)
        self.sched = Scheduler(cfg, self.mem, self.requests, self._emit)
        # forward thread (docs/design.md §4.14): the worker reads the requests through a
        # log of the shared fields it reads, and the loop runs as two host threads
        self.reads = ReadLog(self.requests) if cfg.forward_thread else None
        self.worker = SpecWorker(self.dev, model, self.requests if self.reads is None else self.reads,
                                 self.canary)
        if rt.graphs:
            model.arm(rt.graph_cache())
        self.inflight: Deque[Batch] = deque()
        self.iteration = 0
        self.batches = 0
        self._early_aborts: Set[int] = set()
        self.faults = FaultSet(cfg.faults)
        self.rank, self.collective = 0, None   # tensor parallel (tp.TPEngine sets them)
        self.overlapping = False               # this step's decision (begin_step)
        self.steady_buffers = None             # runtime buffers held before the first step
        # what the configured modes did (the snapshot's ``ran``): batches launched on the
        # forward thread, steps overlapped, launches that pre-drafted a round (zero
        # bubble), backed KV up, verified a tree of drafts
        self.ran = dict.fromkeys(("forward_thread", "overlap", "zero_bubble", "kv_backup",
                                  "tree"), 0)
        self.threads = None
        if cfg.forward_thread:
            self.threads = HostThreads(rt, self._on_queue)
            self.threads.start_forward(self._forward_thread())

    def _emit(self, ev: E.Event) -> None:
        if self.observer is not None:
            if self._run:
                self._send_run()
            self.observer(ev)

    def _send_run(self) -> None:
        """Send the decode results gathered so far as one ``VerifiedBatch``: before any
        other event, so the observer sees them in the order of the per-request events."""
        rows, self._run = self._run, []
        bid, cans, backup = self._run_of
        at, rids, index, acc, tokens, dropped = zip(*rows)
        self.observer(E.VerifiedBatch(self.iteration, bid, rids, index, acc, tokens, dropped,
                                      () if cans is None else tuple(cans[i] for i in at),
                                      backup, self.worker.draft_canary is not None))

    # -- input ---------------------------------------------------------------------------
    def add(self, spec: RequestSpec) -> None:
        if spec.rid in self.requests:
            raise ValueError(f"duplicate request id {spec.rid}")
        r = self.requests[spec.rid] = self._unsettled[spec.rid] = Request(spec)
        self._emit(E.Arrived(self.iteration, -1, spec.rid, spec))
        if spec.rid in self._early_aborts:
            self.abort(spec.rid)
        else:
            self.sched.enqueue(r)

    def abort(self, rid: int) -> None:
        """Mark ``rid`` aborted; tear it down now if no unprocessed batch carries it."""
        r = self.requests.get(rid)
        if r is None:
            self._early_aborts.add(rid)
            return
        if r.done:
            return
        r.abort_requested = True
        if not r.inflight:
            before = self._shared_before((r,))
            self._teardown(r, ABORTED, ABORT, -1)
            self._declare_writes(before, -1)

    @property
    def idle(self) -> bool:
        return not (self.sched.waiting or self.sched.admitted or self.inflight)

    # -- one step --------------------------------------------------------------------------
    def step(self) -> None:
        if self.threads is not None:
            self.threads.run(self._scheduler_step())
        else:
            self.end_step(self.begin_step())

    def begin_step(self) -> Optional[Batch]:
        """Build and launch this step's batch (None: nothing to run) and decide whether
        the step overlaps. Tensor-parallel ranks all begin a step before any ends it."""
        it = self.iteration
        if self.steady_buffers is None:   # every rank is built: the long-lived set
            self.steady_buffers = self.rt.live_buffers()
        batch = self.sched.build(it, self.batches)
        if batch is not None:
            self.batches += 1
            if self.collective is not None:       # the ranks' all-reduce of this batch
                self.collective.join(self, batch)
            if self.mem.host is not None:         # the KV backup's host-pool cells and slots
                batch.host_cells = self.mem.take_host_cells()
                batch.host_slots = self.mem.host_slots(self.requests[e.rid] for e in batch.entries)
            ops = self.worker.launch(batch)
            self._note_launch(ops)
            self.inflight.append(batch)
            self._emit(E.Launched(it, batch.bid, batch.kind, tuple(ops)))
        self.overlapping = self._overlaps(batch)
        self.ran["overlap"] += self.overlapping
        return batch

    def _note_launch(self, ops: List[str]) -> None:
        """Count what a launch ran of the configured modes (``ran``)."""
        ran = self.ran
        ran["zero_bubble"] += "stash_drafts" in ops
        ran["kv_backup"] += "backup_kv" in ops
        ran["tree"] += "tree_compact" in ops

    def _overlaps(self, batch: Optional[Batch]) -> bool:
        """Keep ``batch`` in flight while processing the previous result? A decision
        every rank must take alike: from the config and the batch, never rank-local state."""
        if not self.cfg.overlap or batch is None:
            return False
        if self.rank and len(self.inflight) > 1 and self.faults.on("rank-local-overlap"):
            # fault: a non-zero rank skips overlap when its own previous result has landed
            return not self.dev.done[self.inflight[-2].bid % 2].query()
        return True

    def end_step(self, batch: Optional[Batch]) -> None:
        """Process results (all but ``batch`` when the step overlaps), check the pool
        when idle, report the step's races and ``StepEnd``."""
        keep = 1 if self.overlapping else 0
        while len(self.inflight) > keep:
            self._process(self.inflight.popleft())
        self._close_step(batch)

    def _close_step(self, batch: Optional[Batch]) -> None:
        it = self.iteration
        if self.strict and self.idle:
            self.mem.check_integrity(self.requests)
            assert self.mem.is_full(), "idle engine with memory still held"
        if self.observer is not None:
            self._emit_races(it, batch.bid if batch else -1)
            self._emit(E.StepEnd(it, batch.bid if batch else -1, self.snapshot()))
        self.iteration += 1

    # -- the forward thread (docs/design.md §4.14) -------------------------------------------
    def _scheduler_step(self):
        """One step on the scheduler thread: build the batch, snapshot what its launch
        reads of the requests, hand it to the forward thread, then take and process the
        results the step processes (all but this batch's under overlap)."""
        if self.steady_buffers is None:
            self.steady_buffers = self.rt.live_buffers()
        yield (POINT,)
        it = self.iteration
        before = self._shared_before(self._unsettled.values())
        batch = self.sched.build(it, self.batches)
        self._declare_writes(before, batch.bid if batch is not None else -1)
        if batch is not None:
            self.batches += 1
            if self.mem.host is not None:         # the KV backup's host-pool cells and slots
                batch.host_cells = self.mem.take_host_cells()
                batch.host_slots = self.mem.host_slots(self.requests[e.rid] for e in batch.entries)
            self._access(SCHEDULER, batch, "entries", True)
            if not self.faults.on("sched-mutates-during-forward"):
                batch.inputs = self.worker.inputs(batch, [b.bid for b in self.inflight])
                self._declare_reads(SCHEDULER, batch.bid)
                self._access(SCHEDULER, batch, "inputs", True)
            # else fault: the batch goes over without its snapshot, so the forward thread
            # reads the live requests that this thread's result processing mutates
            self.inflight.append(batch)
            yield (PUT, self.threads.input, batch)
        self.overlapping = self._overlaps(batch)
        self.ran["overlap"] += self.overlapping
        keep = 1 if self.overlapping else 0
        while len(self.inflight) > keep:
            done = yield (GET, self.threads.output)
            assert done is self.inflight[0], "the forward thread returned batches out of order"
            self._access(SCHEDULER, done, "launch", False)
            yield (POINT,)
            self._process(self.inflight.popleft())
        self._close_step(batch)

    def _forward_thread(self):
        """The forward thread: take a batch, launch it, hand it back for its result."""
        while True:
            batch = yield (GET, self.threads.input)
            yield (POINT,)
            self._access(FORWARD, batch, "entries", False)
            if batch.inputs is not None:
                self._access(FORWARD, batch, "inputs", False)
            ops = self.worker.launch(batch)
            self._note_launch(ops)
            self.ran["forward_thread"] += 1
            self._declare_reads(FORWARD, batch.bid)
            self._emit(E.Launched(self.iteration, batch.bid, batch.kind, tuple(ops)))
            self._access(FORWARD, batch, "launch", True)
            yield (PUT, self.threads.output, batch)

    def _on_queue(self, thread: str, queue: str, op: str, seq: int, batch: Batch) -> None:
        if self.observer is not None:
            self._emit(E.HostQueue(self.iteration, batch.bid, thread, queue, op, seq))

    def _access(self, thread: str, batch: Batch, field: str, write: bool) -> None:
        if self.observer is not None:
            self._emit(E.HostAccess(self.iteration, batch.bid, thread, ("batch", batch.bid),
                                    field, write))

    def _declare_reads(self, thread: str, bid: int) -> None:
        """The shared request fields read since the last call, as ``thread``'s."""
        reads = self.reads.take()
        if self.observer is not None:
            for rid, field in reads:
                self._emit(E.HostAccess(self.iteration, bid, thread, ("request", rid), field,
                                        False))

    def _shared_before(self, reqs) -> Optional[dict]:
        """With the forward thread observed: the shared fields of ``reqs`` before a
        scheduler-thread action (``_declare_writes`` declares what it changed)."""
        if self.threads is None or self.observer is None:
            return None
        return {r.rid: (r, shared_state(r)) for r in reqs}

    def _declare_writes(self, before: Optional[dict], bid: int) -> None:
        if not before:
            return
        for rid, (r, old) in before.items():
            for field in written(old, shared_state(r)):
                self._emit(E.HostAccess(self.iteration, bid, SCHEDULER, ("request", rid), field,
                                        True))

    # -- results ---------------------------------------------------------------------------
    def _process(self, batch: Batch) -> None:
        it, bid = self.iteration, batch.bid
        toks, accs = self.worker.collect(batch)
        cans = self.worker.canary(batch) if self.observer is not None else None
        # a decode's canary records carry the KV backup's check (backup_check)
        backup = self.worker.backup_canary and batch.kind != PREFILL
        # a batched observer gets the decode results as runs (``_send_run``)
        run = self.batched and batch.kind != PREFILL
        if run:
            self._run_of = (bid, cans, backup)
        try:
            self._results(batch, toks, accs, cans, backup, run)
        finally:
            if self._run:   # also when the engine raised: what was kept was seen
                self._send_run()
        self.mem.on_processed(bid, it)

    def _results(self, batch: Batch, toks, accs, cans, backup: bool, run: bool) -> None:
        """Process ``batch``'s results entry by entry; ``run``: gather the decode results
        for a ``VerifiedBatch`` instead of sending a ``Verified`` and ``Canary`` each."""
        it, bid = self.iteration, batch.bid
        for i, (e, t, a) in enumerate(zip(batch.entries, toks, accs)):
            r = self.requests[e.rid]
            before = self._shared_before((r,))
            r.inflight.remove(bid)
            live = r.state in (PREFILLING, RUNNING) and not r.abort_requested
            ended = None
            if batch.kind == PREFILL:
                if e.sample and live:
                    _, ended = self._append(r, t[:1])
                self._emit(E.Prefilled(it, bid, r.rid, t[0] if e.sample else -1, not live))
            else:
                r.unprocessed_decodes -= 1
                index, kept = len(r.accept_lens), ()
                if live:
                    r.accept_lens.append(a)
                    r.committed += a
                    kept, ended = self._append(r, t[:a])
                    if self.cfg.tree and ended is None:
                        # the rejected branches' pages past the chain's reach (§4.12)
                        self.mem.trim(r, self.sched.tree_reach(r, r.unprocessed_decodes),
                                      it, bid)
                elif self.faults.on("lagged-verify-counted") and r.state == FINISHED:
                    r.accept_lens.append(a)             # fault: a dropped verify counted
                if run:
                    self._run.append((i, r.rid, index if live else -1, a, kept, not live))
                elif self.observer is not None:
                    self._emit(E.Verified(it, bid, r.rid, index if live else -1, a, kept,
                                          not live))
            if cans is not None and not run:
                self._emit(E.Canary(it, bid, r.rid, *C.canary_fields(
                    cans[i], backup, self.worker.draft_canary is not None)))
            if ended is not None:
                self._teardown(r, FINISHED, ended, bid)
            if r.abort_requested and not r.inflight and not r.done:
                # fault: an abort deferred across a prefill batch is never torn down
                if not (self.faults.on("abort-zombie") and batch.kind == PREFILL):
                    self._teardown(r, ABORTED, ABORT, bid)
            self._declare_writes(before, bid)

    def _append(self, r: Request, tokens: Iterable[int]) -> Tuple[tuple, Optional[str]]:
        """Append accepted tokens, cut at a stop token or the length limit; returns the
        kept tokens and the finish reason (None: the request goes on). The caller
        tears a finished request down after reporting the result."""
        limit = min(r.spec.max_new_tokens, self.cfg.max_context - len(r.spec.prompt))
        if self.faults.on("stop-cut-after-length") and len(r.output) + len(tokens) >= limit:
            kept = tuple(tokens)[:limit - len(r.output)]   # fault: length cut, no stop scan
            r.output.extend(kept)
            return kept, LENGTH
        kept = []
        for tok in tokens:
            r.output.append(tok)
            kept.append(tok)
            if tok in r.spec.stop_ids:
                return tuple(kept), STOP
            if len(r.output) >= limit:
                return tuple(kept), LENGTH
        return tuple(kept), None

    def _teardown(self, r: Request, state: str, reason: str, bid: int) -> None:
        if state not in LEGAL[r.state]:
            raise AssertionError(f"request {r.rid}: illegal transition {r.state} -> {state}")
        r.state, r.finish_reason = state, reason
        self.sched.forget(r)
        if r.pages or r.row is not None:
            self.mem.release(r, reason, self.iteration, bid)
        cls = E.Finished if state == FINISHED else E.Aborted
        args = (reason, tuple(r.output)) if state == FINISHED else (tuple(r.output),)
        self._emit(cls(self.iteration, bid, r.rid, *args))

    # -- observation -----------------------------------------------------------------------
    def _emit_races(self, it: int, bid: int) -> None:
        reports = self.rt.reports
        for rep in reports[self._reported:]:
            self._emit(E.RaceFound(it, bid, rep))
        self._reported = len(reports)

    def snapshot(self) -> E.Snapshot:
        """The step's ``Snapshot``, at a cost that follows what can have changed: the
        pool-sized ledger fields and the run-sized request list are computed when read,
        and a request waiting with nothing held is reported once, then parked until it
        leaves the queue (docs/design.md §5.1)."""
        kv, ps, req_state = self.mem.kv, self.cfg.page_size, E.ReqState
        live, unsettled, parked, log = [], self._unsettled, self._parked, self._park_log
        for rid in self.sched.take_dequeued():      # admitted or torn down: may change now
            if parked.pop(rid, None) is not None:
                unsettled[rid] = self.requests[rid]
                log.append((rid, None))
        settled_before, parked_before = len(self._settled), len(log)
        for rid in sorted(unsettled):
            r = unsettled[rid]
            inflight = tuple(r.inflight)
            st = req_state(rid, r.state, r.row, r.committed, len(r.pages) * ps,
                           len(r.output), inflight, r.shared * ps)
            live.append(st)
            if not inflight:
                if r.state in (FINISHED, ABORTED):   # settled: its state is final
                    del unsettled[rid]
                    self._settled.append(st)
                elif r.state == WAITING and r.row is None and not r.pages:
                    # nothing changes a queued request until it leaves the queue
                    del unsettled[rid]
                    parked[rid] = st
                    log.append((rid, st))
        live = tuple(live)
        settled = self._settled

        def every_request() -> list:
            waiting: Dict[int, E.ReqState] = {}    # parked before this step, still parked
            for rid, st in log[:parked_before]:
                if st is None:
                    del waiting[rid]
                else:
                    waiting[rid] = st
            return sorted(settled[:settled_before] + list(waiting.values()) + list(live),
                          key=_rid)
        return E.Snapshot(
            total=kv.total * ps, free=kv.free_pages * ps, owned=len(kv.owned) * ps,
            pending=kv.pending_pages * ps, ledger=kv.view(kv.ledger_rows),
            pending_slots=kv.view(kv.pending_slots),
            requests=E.LazyTuple(every_request),
            inflight=tuple(b.bid for b in self.inflight), rows_free=len(self.mem.rows.free),
            idle=self.idle, syncs=self.rt.syncs, declared_syncs=self.worker.declared_syncs,
            page_size=ps, row_width=self.cfg.row_width, rows_total=self.mem.rows.total,
            live=live, **self._host_pool(), **self._buffers(), **self._cache(),
            **self._integrity())

    def _integrity(self) -> dict:
        """The facts the pool-integrity checker holds together, and what the configured
        modes ran (``Snapshot``)."""
        rows, kv, host = self.mem.rows, self.mem.kv, self.mem.host
        if host is None:
            conflicts = kv.view(lambda: tuple(("kv", p, w) for p, w in kv.conflicts()))
        else:
            conflicts = kv.view(lambda: tuple(("kv", p, w) for p, w in kv.conflicts())
                                + tuple(("host", p, w) for p, w in host.conflicts()))
            host.view(conflicts.get)     # computed before the host pool changes too
        return {"rows_free_list": tuple(rows.free), "rows_held": tuple(sorted(rows.owner.items())),
                "page_conflicts": conflicts, "owned_by": kv.owned_rows(), "ran": self._ran()}

    def _ran(self) -> tuple:
        w = self.worker
        return tuple(sorted({**self.ran, "verify_sync": w.host_sums, "ring": w.future.assigned,
                             "prefix_cache": self.mem.hits}.items()))

    def _buffers(self) -> dict:
        """Live runtime buffers and the steady set, for the runtime-memory checker."""
        return {"buffers": self.rt.live_buffers(), "steady_buffers": self.steady_buffers or ()}

    def _cache(self) -> dict:
        """The prefix cache's slots and lock counts for the snapshot (empty without it)."""
        tree, kv = self.mem.tree, self.mem.kv
        if tree is None:
            return {}
        return {"cached": len(kv.cached) * self.cfg.page_size,
                "cache_ledger": kv.view(lambda: kv.cache_rows(tree.page_locks())),
                "cache_nodes": kv.view(tree.nodes), "cache_pages": tree.pages}

    def _host_pool(self) -> dict:
        """The KV backup's host-pool counts for the snapshot (empty without kv_backup)."""
        host, ps = self.mem.host, self.cfg.page_size
        if host is None:
            return {}
        return {"host_total": host.total * ps, "host_free": host.free_pages * ps,
                "host_pending": host.pending_pages * ps,
                "host_ledger": host.view(host.ledger_rows, host.ledger_size()),
                "host_owned_by": host.owned_rows()}

    def dispose(self) -> None:
        """Empty this engine (its parts point back at it): a finished run's object graph
        is then freed by reference counting, not by the cyclic collector
        (``Session.dispose``). Nothing may use it afterwards."""
        self.__dict__.clear()

    # -- a whole workload ------------------------------------------------------------------
    def run(self, workload, max_steps: Optional[int] = None,
            tick: Optional[Callable[[int], None]] = None) -> RunResult:
        """Feed ``workload`` (arrivals and aborts by step) and step until all is done;
        ``tick(step)`` after each step, where the caller wants to hear of a long run
        without observing it (it may raise to end the run)."""
        arrivals: Dict[int, List[RequestSpec]] = {}
        for spec in workload.requests:
            arrivals.setdefault(spec.arrival, []).append(spec)
        aborts: Dict[int, List[int]] = {}
        for ab in workload.aborts:
            aborts.setdefault(ab.step, []).append(ab.rid)
        last = max(list(arrivals) + list(aborts) + [0])
        bound = max_steps if max_steps is not None else last + 50 + 4 * sum(
            len(s.prompt) + s.max_new_tokens for s in workload.requests)
        while self.iteration <= last or not self.idle:
            if self.iteration > bound:
                live = sorted(r.rid for r in self.requests.values() if not r.done)
                msg = f"still busy after {bound} steps; live requests {live[:10]}"
                self._emit(E.Stalled(self.iteration, -1, "steps", msg))
                raise EngineStuck(msg)
            for spec in arrivals.get(self.iteration, ()):
                self.add(spec)
            for rid in aborts.get(self.iteration, ()):
                self.abort(rid)
            try:
                self.step()
            except StuckWait as e:
                self._emit(E.Stalled(self.iteration, -1, "wait", str(e)))
                raise
            if tick is not None:
                tick(self.iteration)
        res = self.result()
        self._emit(E.RunEnd(self.iteration, -1, res))
        return res

    def result(self) -> RunResult:
        reqs = {rid: RequestResult(rid, tuple(r.output), r.finish_reason or "none",
                                   tuple(r.accept_lens), r.retractions)
                for rid, r in sorted(self.requests.items())}
        return RunResult(reqs, summarize(reqs, self.iteration, self.batches, self.rt.syncs,
                                         self.worker.declared_syncs, len(self.rt.reports)))


def _rid(st: E.ReqState) -> int:
    return st.rid



"""A toy target: the whole of what adding a target takes, in one package.

A first-come engine with one KV slot per token: a request arriving with a free row
takes slots for its prompt (its prefill samples the first token), then gains one token
per step (a decode batch of every running request) until its stop id or
``max_new_tokens``, and frees its slots at the end. Its tokens follow the oracle
family's rule (``fake_models.oracle_rule``). With ``lag`` on, a batch's result is
processed one step after its launch, when the ``Chooser`` says so (lane ``"result"``),
so runs differ by schedule and replay exactly.

What the package holds, and the one line ``overlapcheck.targets.TARGETS`` needs
(``"toy": "toy_target:ToyTarget"``): the adapter (``ToyTarget``, ``ToySession``), its
config, its faults (``FAULTS``: guarded sites, with fields of their own), its own
checker (``checkers.py``: reads ``ToyStep``, an event only this target emits). The
shared checkers read the protocol's events it emits like any target's.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from fake_models.oracle_rule import extend, raw_hash, token_at
from overlapcheck.faults import Fault, GuardedSite, Guards
from overlapcheck.protocol import events as E
from overlapcheck.protocol.results import RequestResult, RunResult, summarize
from overlapcheck.protocol.target import Chooser, EngineStuck, Session, Target
from overlapcheck.protocol.types import (ABORT, ABORTED, DECODE, FINISHED, LENGTH, PREFILL,
                                         RUNNING, SEEDED, STOP, WAITING)
from overlapcheck.protocol.workload import WorkloadError, generate


@dataclass(frozen=True)
class ToyConfig:
    slots: int = 96               # KV slots, one per token
    rows: int = 4                 # requests running at once
    max_context: int = 32         # prompt + output
    budget: int = 4               # tokens a step may decode (the toy's own checker)
    lag: bool = True              # process a batch's result a step later (overlap)
    vocab: int = 32
    faults: Tuple[str, ...] = ()

    def __post_init__(self):
        if self.slots < self.max_context or self.budget < self.rows:
            raise ValueError("toy config: slots >= max_context and budget >= rows")
        object.__setattr__(self, "faults", tuple(self.faults))


FAULTS: Dict[str, Fault] = {f.name: f for f in (
    Fault("keep-last-slot", "a finished request frees all its slots but the last",
          "the unaligned-tail leak class", "kv-accounting", "any request that finishes",
          GuardedSite("toy_target/__init__.py ToySession._end"),
          (("seed", 7), ("layer", "memory"))),
    Fault("decode-twice", "a decode step gives each request two tokens",
          "a scheduler over its token budget", "toy-budget", "more running requests than half "
          "the budget", GuardedSite("toy_target/__init__.py ToySession._decode"),
          (("seed", 3), ("layer", "scheduler"))),
)}


@dataclass(frozen=True)
class ToyStep(E.Event):
    """The toy's own event: tokens a step's decode gave, and its budget."""

    tokens: int
    budget: int


class _Req:
    def __init__(self, spec):
        self.spec, self.state, self.out, self.slots = spec, WAITING, [], []
        self.row: Optional[int] = None
        self.reason: Optional[str] = None
        self.raw = raw_hash(spec.prompt)
        self.inflight: List[int] = []
        self.verifies = 0


class ToySession(Session):
    def __init__(self, cfg: ToyConfig, strategy, observer):
        self.cfg, self.observer = cfg, observer
        self.chooser = Chooser(strategy)
        self.faults = Guards(cfg.faults, FAULTS)
        self.free = list(range(cfg.slots))
        self.rows = list(range(cfg.rows))
        self.reqs: Dict[int, _Req] = {}
        self.waiting: deque = deque()
        self.unprocessed: deque = deque()       # (batch, [(rid, tokens)])
        self.pending: Dict[int, List[int]] = {}  # batch -> slots free once it is processed
        self.bid = 0

    @property
    def choices(self) -> List[int]:
        return self.chooser.choices

    def _emit(self, ev) -> None:
        if self.observer is not None:
            self.observer(ev)

    def _alloc(self, r: _Req, n: int, purpose: str, bid: int) -> None:
        slots, self.free = self.free[:n], self.free[n:]
        r.slots += slots
        self._emit(E.Allocated(self.iteration, bid, r.spec.rid, purpose, tuple(slots), r.row))

    def _token(self, r: _Req) -> int:
        n = len(r.spec.prompt) + len(r.out)
        return token_at(r.raw, n, r.spec.seed, r.spec.sampling == SEEDED, self.cfg.vocab)

    def _end(self, r: _Req, reason: str) -> None:
        """Free ``r``'s slots (pending until the last batch it rides is processed) and
        its row, then report its end."""
        it, rid = self.iteration, r.spec.rid
        r.state, r.reason = (ABORTED if reason == ABORT else FINISHED), reason
        slots = r.slots[:-1] if self.faults.on("keep-last-slot") and reason != ABORT else r.slots
        until = max(r.inflight) if r.inflight else None
        self._emit(E.Freed(it, -1, rid, tuple(slots), "abort" if reason == ABORT else "finish",
                           until is not None, until))
        if until is None:
            self.free += slots
        else:
            self.pending.setdefault(until, []).extend(slots)
        r.slots = [s for s in r.slots if s not in slots]
        self._emit(E.RowReleased(it, -1, rid, r.row))
        self.rows.append(r.row)
        if reason == ABORT:
            self._emit(E.Aborted(it, -1, rid, tuple(r.out)))
        else:
            self._emit(E.Finished(it, -1, rid, reason, tuple(r.out)))

    def _decode(self, running: List[_Req]) -> None:
        bid, self.bid = self.bid, self.bid + 1
        per = 2 if self.faults.on("decode-twice") else 1
        self._emit(E.Scheduled(self.iteration, bid, DECODE, tuple(r.spec.rid for r in running)))
        out = []
        for r in running:
            self._alloc(r, per, "decode", bid)
            r.inflight.append(bid)
            out.append((r.spec.rid, per))
        self._emit(E.Launched(self.iteration, bid, DECODE, ("decode",)))
        self._emit(ToyStep(self.iteration, bid, per * len(running), self.cfg.budget))
        self.unprocessed.append((bid, out))

    def _process(self) -> None:
        bid, out = self.unprocessed.popleft()
        for rid, n in out:
            r = self.reqs[rid]
            r.inflight.remove(bid)
            if r.state != RUNNING:
                continue
            toks = []
            for _ in range(n):
                t = self._token(r)
                r.raw = extend(r.raw, t, len(r.spec.prompt) + len(r.out))
                r.out.append(t)
                toks.append(t)
                if t in r.spec.stop_ids or len(r.out) >= r.spec.max_new_tokens:
                    break
            self._emit(E.Verified(self.iteration, bid, rid, r.verifies, len(toks),
                                  tuple(toks), False))
            r.verifies += 1
            if toks[-1] in r.spec.stop_ids:
                self._end(r, STOP)
            elif len(r.out) >= r.spec.max_new_tokens:
                self._end(r, LENGTH)
        freed = self.pending.pop(bid, ())
        if freed:
            self.free += freed
            self._emit(E.PendingReleased(self.iteration, bid, tuple(freed)))

    def _admit(self) -> None:
        it = self.iteration
        while self.waiting and self.rows:
            r = self.reqs[self.waiting[0]]
            if len(self.free) < self.cfg.max_context:
                break
            self.waiting.popleft()
            r.row = self.rows.pop(0)
            self._emit(E.RowAssigned(it, -1, r.spec.rid, r.row))
            bid, self.bid = self.bid, self.bid + 1
            self._emit(E.Scheduled(it, bid, PREFILL, (r.spec.rid,)))
            self._alloc(r, len(r.spec.prompt), "prefill", bid)
            self._emit(E.Launched(it, bid, PREFILL, ("prefill",)))
            t = self._token(r)
            r.raw = extend(r.raw, t, len(r.spec.prompt))
            r.out.append(t)
            r.state = RUNNING
            self._emit(E.Prefilled(it, bid, r.spec.rid, t, False))
            if t in r.spec.stop_ids:
                self._end(r, STOP)
            elif len(r.out) >= r.spec.max_new_tokens:
                self._end(r, LENGTH)

    def _snapshot(self) -> E.Snapshot:
        ledger = tuple(sorted((s, rid, "kv", 0) for rid, r in self.reqs.items() for s in r.slots))
        # committed: the KV positions written (the prompt and every token but the newest)
        reqs = tuple(E.ReqState(rid, r.state, r.row,
                                min(len(r.slots), len(r.spec.prompt) + max(len(r.out) - 1, 0)),
                                len(r.slots), len(r.out), tuple(r.inflight))
                     for rid, r in sorted(self.reqs.items()))
        owned = len(ledger)
        pending = tuple(sorted(s for slots in self.pending.values() for s in slots))
        idle = not self.waiting and not self.unprocessed and all(
            r.state in (FINISHED, ABORTED) for r in self.reqs.values())
        return E.Snapshot(self.cfg.slots, len(self.free), owned, len(pending), ledger, pending, reqs,
                          tuple(b for b, _ in self.unprocessed), len(self.rows), idle, 0, 0,
                          1, self.cfg.max_context, self.cfg.rows)

    def run(self, workload, max_steps: Optional[int] = None) -> RunResult:
        arrivals = sorted(workload.requests, key=lambda s: (s.arrival, s.rid))
        aborts = {}
        for a in workload.aborts:
            aborts.setdefault(a.step, []).append(a.rid)
        bound = max_steps or 400
        while True:
            it = self.iteration
            while arrivals and arrivals[0].arrival <= it:
                spec = arrivals.pop(0)
                self.reqs[spec.rid] = _Req(spec)
                self.waiting.append(spec.rid)
                self._emit(E.Arrived(it, -1, spec.rid, spec))
            for rid in aborts.get(it, ()):
                r = self.reqs.get(rid)
                if r is not None and r.state in (WAITING, RUNNING):
                    if r.state == WAITING:
                        self.waiting.remove(rid)
                        r.state, r.reason = ABORTED, ABORT
                        self._emit(E.Aborted(it, -1, rid, ()))
                    else:
                        self._end(r, ABORT)
            self._admit()
            running = [r for r in self.reqs.values() if r.state == RUNNING]
            if running:
                self._decode(running)
            # with lag, the result of the oldest batch may wait a step (the schedule decides)
            while self.unprocessed and (not self.cfg.lag or len(self.unprocessed) > 1
                                        or not running or self.chooser.point(["result"]) == 0):
                self._process()
            self._emit(E.StepEnd(it, -1, self._snapshot()))
            self.iteration += 1
            if not arrivals and not self.waiting and not self.unprocessed and all(
                    r.state in (FINISHED, ABORTED) for r in self.reqs.values()):
                break
            if self.iteration >= bound:
                self._emit(E.Stalled(self.iteration, -1, "steps", f"step bound {bound}"))
                raise EngineStuck(f"toy: step bound {bound} ran out")
        results = {rid: RequestResult(rid, tuple(r.out), r.reason, tuple(1 for _ in r.out[1:]), 0)
                   for rid, r in self.reqs.items()}
        result = RunResult(results, summarize(results, self.iteration, self.bid, 0, 0, 0))
        self._emit(E.RunEnd(self.iteration, -1, result))
        return result


class ToyTarget(Target):
    name = "toy"
    install = "(part of the tests)"
    config_type = ToyConfig
    checkers = {"toy-budget": "toy_target.checkers:ToyBudget"}

    def version(self) -> str:
        return "0"

    def faults(self) -> dict:
        return FAULTS

    def reference_config(self, cfg: ToyConfig) -> ToyConfig:
        return dataclasses.replace(cfg, lag=False, faults=())

    def check_workload(self, workload, cfg: ToyConfig) -> None:
        for r in workload.requests:
            if len(r.prompt) + r.max_new_tokens > cfg.max_context:
                raise WorkloadError(f"request {r.rid}: prompt + max_new_tokens exceeds "
                                    f"{cfg.max_context}")

    def generate(self, seed: int, n: int, cfg: ToyConfig):
        return generate(seed, n, cfg, vocab=cfg.vocab, max_prompt=8, max_new=cfg.max_context - 8)

    def open(self, cfg: ToyConfig, strategy, observer, faults=(), *, device="sim",
             detect=True, trace=False, **options) -> ToySession:
        if options:
            raise ValueError(f"unknown run option {sorted(options)[0]!r} for the toy target")
        self.check_faults(faults)
        cfg = dataclasses.replace(cfg, faults=tuple(dict.fromkeys(cfg.faults + tuple(faults))))
        return ToySession(cfg, strategy, observer)

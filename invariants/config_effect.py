"""config-effect: a mode the config turns on did run, wherever the run gave it the chance.

The engine counts what its modes did (``Snapshot.ran``): batches launched on the forward
thread, steps that kept a batch in flight, launches that pre-drafted a round (zero
bubble), backed KV up (the KV backup), verified a tree of drafts, computed
``seq_lens_sum`` on the host (verify sync), took ring FutureMap slots; admissions that
reused a cached prefix; logical ranks that launched a batch (a rank run as a process of
its own, ``run --tp N --dist``, counts none). At the end of the run each mode
the config (the context's ``engine_config``) turns on is held against its count, where
the events show the workload made it reachable:

| mode | reachable when | ran |
|---|---|---|
| ``forward_thread``, ``overlap``, ``future_map: ring``, ``tp`` | a batch was launched | a batch on the forward thread; a step overlapped; a batch took ring slots; every rank launched |
| ``zero_bubble`` (spec), ``kv_backup``, ``verify_sync`` (overlap, spec), tree drafts (spec, ``topk`` > 1) | a decode batch was launched | a round pre-drafted (a request's first decode always has its reserve); a backup copy; a host ``seq_lens_sum``; a tree verify |
| ``prefix_cache`` | a request was admitted whose prompt starts with the first page (and the next token) of a prompt whose KV went to the cache, with no eviction since | an admission reused a cached prefix |

A mode that never ran where it could is a finding: the run tested another engine
than the one its config names, and every other checker judged that one.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation


class ConfigEffect(Checker):
    name = "config-effect"
    targets = ("reference",)

    def __init__(self, engine_config=None, **context) -> None:
        super().__init__()
        self.cfg = engine_config
        self.idle = engine_config is None
        self.batches = self.decodes = 0
        self.ran: Dict[str, int] = {}
        # the prefix cache: prompts by request, the first page (and next token) of the
        # prompts whose KV was cached since the last eviction, the first admission that
        # must have matched one
        self.prompts: Dict[int, Tuple[int, ...]] = {}
        self.heads: Set[Tuple[int, ...]] = set()
        self.hit_due = None

    def on_Launched(self, ev: E.Launched) -> None:
        self.batches += 1
        self.decodes += ev.kind == "decode"

    def on_StepEnd(self, ev: E.StepEnd) -> None:
        self.ran = ev.snapshot.ran

    # -- the prefix cache's reachability -------------------------------------------------------
    def on_Arrived(self, ev: E.Arrived) -> None:
        if self.cfg.prefix_cache and ev.spec is not None:
            self.prompts[ev.rid] = tuple(ev.spec.prompt)

    def _head(self, rid: int):
        head = self.prompts.get(rid, ())[:self.cfg.page_size + 1]
        return head if len(head) == self.cfg.page_size + 1 else None

    def on_Cached(self, ev: E.Cached) -> None:
        head = self._head(ev.rid)
        if head is not None:
            self.heads.add(head)

    def on_Evicted(self, ev: E.Evicted) -> None:
        self.heads.clear()

    def on_RowAssigned(self, ev: E.RowAssigned) -> None:
        if self.hit_due is None and self.heads and self._head(ev.rid) in self.heads:
            self.hit_due = (ev.iteration, ev.rid)

    # -- the end ------------------------------------------------------------------------------------
    def on_RunEnd(self, ev: E.RunEnd) -> List[Violation]:
        cfg, ran, it = self.cfg, dict(self.ran), ev.iteration
        if not ran:
            return []
        out = []
        launched = f"{self.batches} batches launched"
        decoded = f"{self.decodes} decode batches launched"

        def check(mode: str, reachable: bool, key: str, why: str, did: str, want: int = 1):
            if reachable and ran.get(key, 0) < want:
                out.append(Violation(
                    self.name, it, f"{mode} is on but never took effect ({why})",
                    f"{mode}: {did} (reachable: {why})",
                    f"{did}: {ran.get(key, 0)}", ("never-ran", key), {"mode": key}))

        if self.batches:
            check("forward_thread", cfg.forward_thread, "forward_thread", launched,
                  "batches launched on the forward thread")
            check("overlap", cfg.overlap, "overlap", launched,
                  "steps that kept a batch in flight")
            check("future_map ring", cfg.future_map == "ring", "ring", launched,
                  "batches given ring FutureMap slots")
            check(f"tp {cfg.tp}", cfg.tp > 1 and "tp" in ran, "tp", launched,
                  "ranks that launched a batch", cfg.tp)
        if self.decodes:
            check("zero_bubble", cfg.zero_bubble and cfg.spec, "zero_bubble", decoded,
                  "launches that pre-drafted a round")
            check("kv_backup", cfg.kv_backup, "kv_backup", decoded,
                  "launches that backed KV up")
            check("verify_sync", cfg.verify_sync and cfg.overlap and cfg.spec, "verify_sync",
                  decoded, "decode batches whose seq_lens_sum the host computed")
            check(f"tree drafts (topk {cfg.topk})", cfg.tree, "tree", decoded,
                  "launches that verified a tree of drafts")
        if self.hit_due is not None:
            step, rid = self.hit_due
            check("prefix_cache", cfg.prefix_cache, "prefix_cache",
                  f"request {rid}, admitted at step {step}, starts with a cached prefix's "
                  f"first page and no eviction came between", "admissions that reused a "
                  "cached prefix")
        return out

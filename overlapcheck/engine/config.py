"""The engine's one configuration object, frozen and validated at construction.

Values discovered at run time (lengths, free space, batch sizes) live in the engine's
state, never here.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .drafts import check_kind
from .faults import check_names

RESERVE_RULES = ("double", "exact")
FUTURE_MAPS = ("row", "ring")   # engine/future_map.py
TREE_KINDS = ("standalone", "eagle")   # draft kinds with tree drafts (topk > 1)
MAX_TOPK = 8
MODELS = ("oracle", "oracle-hostlens", "tiny")   # oracle-hostlens: its draft reads seq_lens_cpu


@dataclass(frozen=True)
class EngineConfig:
    """Sizes and switches of one engine instance.

    * ``page_size``: tokens per KV page; ``pool_tokens``: KV slots in the pool (a
      multiple of ``page_size``; page 0 is reserved as the padding page).
    * ``row_width``: width of a request->token row, i.e. the largest context a
      request may hold, draft reserve included.
    * ``max_running``: admitted requests at most (= request-pool rows = max batch).
    * ``chunk_size``: prefill tokens per batch at most.
    * ``spec_steps``: draft tokens per verify (k); a verify commits 1..k+1 tokens.
    * ``draft_reserve``: KV reserved ahead of the host-known committed length before a
      decode: ``double`` reserves 2(k+1) (absorbs the one-step lag of overlap, as the
      public engines do); ``exact`` reserves (k+1) per unprocessed batch plus one step.
    * ``overlap``: run the host one batch ahead of the device; ``spec``: speculative
      decoding (off: one token per decode step).
    * ``draft_kind``: a kind of ``drafts.DRAFT_KINDS``: ``standalone`` (a draft model
      with its own KV), ``eagle`` (a head on the target's hidden states, its own
      one-layer KV) or ``mtp`` (frozen-KV: reads the target KV, none of its own); ``model``: ``oracle``, ``oracle-hostlens`` (its
      draft reads the host's sequence lengths), ``tiny``, ``trained``, ``hf:DIR`` or
      ``random:NAME`` (the form is checked here; ``fake_models.make_model`` resolves it).
    * ``verify_sync``: the attention metadata needs the batch's total sequence length
      (``seq_lens_sum``). On (spec v2 before SGLang PR #23452): under overlap with spec
      the host waits for the previous verify and reads its new lengths (a declared sync
      per decode step). Off (the default, that PR's no-verify-sync mode): the sum is
      computed on the device and the host never waits.
    * ``kv_backup``: back the decode KV of each step up to a host pool on a backup
      stream that waits for the forward's done-event; the next forward waits for the
      pending backup (SGLang PR #21932). The host pool has its own page accounting.
    * ``zero_bubble``: the zero-bubble spec schedule (SGLang PR #21895): each decode
      drafts the *next* round right after its draft-extend and stashes the drafts in the
      FutureMap; the next decode restores them instead of drafting (it drafts at its
      start only for a request without a pre-drafted round). The decode reserve covers
      the pre-drafted round's draft KV (``engine/drafts_round.py``).
    * ``tp``: tensor-parallel ranks; every rank takes the same scheduling decisions and
      rank 0's results are the engine's (``engine.tp``).
    * ``backup_canary``: with ``kv_backup`` and a model whose KV rows carry tags, each
      decode's forward reads the host pool back over the positions backed up for its
      request and compares it with the target KV, the verdict riding the KV canary record
      (``engine/backup_check.py``). Off only in configs recorded before it existed, so
      that their runs replay as they were.
    * ``future_map``: how the FutureMap is indexed (``engine/future_map.py``, docs/design.md
      §4.11): ``row`` (the default) by request-pool row; ``ring`` by slots a running
      counter hands out over a ring, as SGLang's overlap scheduler does (every batch
      entry, chunks and padding included, takes a slot; the next batch reads where the
      last one wrote).
    * ``topk``: tree drafts (docs/design.md §4.12). 1 (the default): a chain of
      ``spec_steps`` drafts. Above 1: at each depth the draft keeps its ``topk`` best
      candidates and the best one continues, a tree of ``num_draft_tokens`` nodes
      verified under a tree mask; the accepted path's KV is moved to contiguous
      positions and the pages past the chain's reach are released after the verify.
      Standalone and EAGLE kinds, without zero bubble.
    * ``forward_thread``: the engine loop as two host threads (docs/design.md §4.14): a
      scheduler thread that builds batches and processes results, and a forward thread
      that launches them, joined by an input queue (batches) and an output queue
      (results). Which thread runs at each choice point (every queue operation and
      shared-object access) is a schedule decision, recorded and replayed with the
      device's. With overlap the scheduler processes a batch's result while the forward
      thread launches the next batch; without it the scheduler waits for each batch's
      result, so the threads never run side by side. One rank only (``tp`` 1).
    * ``prefix_cache``: keep a radix tree of committed token prefixes over KV pages, as
      SGLang's RadixCache does (``engine/radix.py``, docs/design.md §4.13): an admitted
      request reuses the pages of its longest cached prefix and locks them; a finished
      request's KV goes to the tree and its lock is released; unlocked leaves are
      evicted, least recently used first, under memory pressure before any retraction.
    """

    page_size: int = 1
    pool_tokens: int = 512
    row_width: int = 128
    max_running: int = 8
    chunk_size: int = 32
    spec_steps: int = 3
    draft_reserve: str = "double"
    overlap: bool = True
    spec: bool = True
    draft_kind: str = "standalone"
    model: str = "oracle"
    faults: tuple = ()     # bug-zoo faults switched on (overlapcheck.faults), none by default
    tp: int = 1            # tensor-parallel ranks (engine/tp.py: logical ranks on the sim)
    verify_sync: bool = False  # host waits for the verify to read seq_lens_sum (seed 001: off)
    kv_backup: bool = False    # back decode KV up to a host pool on its own stream (seed 003)
    zero_bubble: bool = False  # draft the next round after the draft-extend (seed 000)
    backup_canary: bool = True  # with kv_backup: read the host pool back and compare it
    future_map: str = "row"     # FutureMap indexed by request-pool row or ring slot
    topk: int = 1               # draft candidates kept per depth (> 1: tree drafts, §4.12)
    forward_thread: bool = False  # launches on a forward thread fed through queues (seed 002)
    prefix_cache: bool = False  # radix prefix cache with lock counts (§4.13)

    def __post_init__(self):
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        for name in ("page_size", "pool_tokens", "row_width", "max_running", "chunk_size",
                     "spec_steps", "tp", "topk"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                 f"{name} must be a positive integer, got {v!r}")
        for name in ("overlap", "spec", "verify_sync", "kv_backup", "zero_bubble",
                     "backup_canary", "forward_thread", "prefix_cache"):
            need(isinstance(getattr(self, name), bool),
                 f"{name} must be true or false, got {getattr(self, name)!r}")
        need(self.pool_tokens % self.page_size == 0,
             f"pool_tokens ({self.pool_tokens}) must be a multiple of page_size ({self.page_size})")
        need(self.row_width % self.page_size == 0,
             f"row_width ({self.row_width}) must be a multiple of page_size ({self.page_size})")
        need(self.row_width > self.margin,
             f"row_width ({self.row_width}) must exceed the draft margin ({self.margin})")
        need(self.pool_tokens - self.page_size >= self.row_width,
             f"pool_tokens ({self.pool_tokens}) must hold one full row ({self.row_width}) "
             f"plus the padding page ({self.page_size})")
        need(self.draft_reserve in RESERVE_RULES,
             f"draft_reserve must be one of {', '.join(RESERVE_RULES)}, got {self.draft_reserve!r}")
        check_kind(self.draft_kind)
        need(self.future_map in FUTURE_MAPS,
             f"future_map must be one of {', '.join(FUTURE_MAPS)}, got {self.future_map!r}")
        need(self.topk <= MAX_TOPK, f"topk must be at most {MAX_TOPK}, got {self.topk}")
        need(self.topk == 1 or self.draft_kind in TREE_KINDS,
             f"topk > 1 (tree drafts) needs draft_kind {' or '.join(TREE_KINDS)}, "
             f"got {self.draft_kind!r}")
        need(self.topk == 1 or not self.zero_bubble,
             "topk > 1 (tree drafts) does not run with zero_bubble")
        need(not (self.forward_thread and self.tp > 1),
             f"forward_thread runs one rank: it needs tp 1, got tp {self.tp}")
        need(isinstance(self.model, str) and (self.model in MODELS + ("trained",) or (
            self.model.startswith(("hf:", "random:")) and self.model.split(":", 1)[1] != "")),
             f"model must be one of {', '.join(MODELS)}, trained, hf:DIR or random:NAME, "
             f"got {self.model!r}")
        need(self.topk == 1 or self.model in MODELS,
             f"topk > 1 (tree drafts) needs model {', '.join(MODELS)}, got {self.model!r}")
        need(isinstance(self.faults, (tuple, list)), f"faults must be a list of names, got {self.faults!r}")
        object.__setattr__(self, "faults", tuple(self.faults))
        check_names(self.faults)

    @property
    def step_tokens(self) -> int:
        """KV positions one decode step writes: k+1 with spec, 1 without."""
        return self.spec_steps + 1 if self.spec else 1

    @property
    def tree(self) -> bool:
        """Tree drafts run: spec with ``topk`` > 1."""
        return self.spec and self.topk > 1

    @property
    def num_draft_tokens(self) -> int:
        """Nodes of a verify's token tree, its input (the root) included: 1 + k * topk
        (k + 1, the chain, for topk 1); the KV positions a verify writes."""
        return 1 + self.spec_steps * self.topk

    @property
    def margin(self) -> int:
        """Row positions kept free beyond a request's context for the draft reserve:
        one round of lag (k+1) and the positions a verify writes. Computed from
        ``spec_steps`` and ``topk`` even with spec off, so that spec and no-spec runs
        of one workload stop at the same context length."""
        return self.spec_steps + 1 + self.num_draft_tokens

    @property
    def max_context(self) -> int:
        """Tokens (prompt + output) a request may reach; it finishes with ``length`` there."""
        return self.row_width - self.margin

    @property
    def pages(self) -> int:
        """Allocatable pages (page 0 is the padding page)."""
        return self.pool_tokens // self.page_size - 1

    def footprint(self, kv_width: int = 3) -> int:
        """Bytes an engine of this config holds at least, before its first step, every
        rank together: the target and draft KV pools (int64 rows of ``kv_width``, the
        oracle's 3 unless a model says more) and the KV backup's host pool, a Python int
        per page of the free list, the request->token tables, the FutureMap's slots (the
        ring's: ``future_map.ring_limit``) and the double-buffered pinned staging. A
        lower bound: commands refuse a config whose footprint the machine cannot hold
        (``overlapcheck.resources``) before anything is allocated."""
        i64 = 8
        kv = self.pool_tokens * kv_width * i64 * (3 if self.kv_backup else 2)
        free_list = self.pages * 36
        tables = self.max_running * self.row_width * i64 * 2
        chunks = -(-self.max_context // self.chunk_size)
        future = self.max_running * (3 + chunks if self.future_map == "ring" else 1) * i64 * 4
        staging = 2 * i64 * (self.staged_cells * 3 + self.chunk_size * 4
                             + self.max_running * (16 + self.num_draft_tokens * 2))
        return self.tp * (kv + free_list + tables + future + staging)

    @property
    def staged_cells(self) -> int:
        """Rows of the pinned request->token cell staging buffers: the pool's slots, or,
        for a pool above 4096 slots, the most cells one step can stage (every row of the
        table for each running request: cells past the table's end are not staged), so
        that staging costs what a step allocates, not the pool's size. A pool of up to
        4096 slots (every config the fuzzer draws) keeps the pool's size: the size of
        the per-step buffers decides which freed blocks the sim hands out, and recorded
        runs replay as they were. With the prefix cache, a prefill batch also stages the
        cells of its admissions' shared prefixes — references to the tree's pages, not
        allocations — up to a row per running request on top."""
        if self.pool_tokens <= 4096:
            cells = self.pool_tokens
        else:
            cells = min(self.pool_tokens, max(4096, self.max_running ** 2 * self.row_width))
        return cells + (self.max_running * self.row_width if self.prefix_cache else 0)


SIZES = ("pool_tokens", "max_running", "row_width", "chunk_size", "tp")


def largest_size(cfg: EngineConfig, kv_width: int = 3) -> str:
    """The size field of ``cfg`` that its footprint owes most to: the one whose default
    would shrink it most (a config too large for the machine names it)."""
    defaults = {f.name: f.default for f in fields(EngineConfig)}

    def without(name: str) -> int:
        try:
            return replace(cfg, **{name: defaults[name]}).footprint(kv_width)
        except ValueError:      # the default does not fit the other sizes: scale instead
            return cfg.footprint(kv_width) * defaults[name] // max(getattr(cfg, name), 1)
    return min(SIZES, key=without)

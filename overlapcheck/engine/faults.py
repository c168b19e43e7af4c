"""The reference engine's bug zoo: one guarded site per named fault (docs/design.md §7).

Each fault is one guarded site in the engine (``if self.faults.on(NAME):``) that
re-creates a bug class seen in public overlap-scheduling engines. Its entry says where
the site is, what goes wrong, which public bug it mirrors, which checker is expected to
catch it, and what a workload needs for the site to matter (without its trigger the
fault is silent); the zoo's class number (§7) is a field of its own. ``FAULTS`` is a
constant; the engine receives the enabled names through ``EngineConfig.faults`` and asks
``FaultSet.on(name)`` at each site. ``overlapcheck faults`` lists them.
"""
from __future__ import annotations

from typing import Dict, Iterable

from ..faults import Fault, GuardedSite, Guards
from ..faults.guard import check


def _zoo(name: str, cls: int, site: str, what: str, mirrors: str, checker: str,
         trigger: str) -> Fault:
    """An entry: ``cls``, the §7 class number (19+: classes added from public code);
    ``site``, the file and function of the guard; ``what``, what the faulty engine does;
    ``mirrors``, the public bug class it re-creates."""
    return Fault(name, what, mirrors, checker, trigger, GuardedSite(site), (("class", cls),))


_ENTRIES = (
    _zoo("index-no-record-stream", 1, "engine/worker.py SpecWorker.launch",
         "the index buffers staged on the schedule stream are not pledged to the forward "
         "stream (record_stream skipped); freed at the end of the launch, their storage is "
         "handed to the next batch's staging copy while the forward may still read it",
         "SGLang/vLLM: index tensor made on the schedule stream recycled by the caching "
         "allocator while the forward stream reads it (missing record_stream)",
         "stream-race", "overlap, with the forward stream behind the schedule stream"),
    _zoo("no-war-barrier", 2, "engine/worker.py SpecWorker.launch",
         "the schedule stream does not wait for the previous forward's table reads before "
         "writing request->token cells; a row freed at a finish is reassigned and rewritten "
         "while the lagged forward still reads it for the finished request",
         "SGLang spec v2 overlap: request-pool row of a request finished in step N-1 "
         "rewritten by step N+1's preparation while forward N reads it (missing WAR barrier)",
         "kv-lifetime", "overlap; a request finishes and a new one takes its row next step"),
    _zoo("war-before-extend", 3, "engine/worker.py SpecWorker._decode",
         "the WAR barrier's event is recorded after verify, before the draft-extend (and the "
         "canary) that still read the request->token table; the next preparation's cell "
         "writes race with those reads",
         "SGLang spec v2: verify preparation overwriting request->token cells the draft is "
         "still reading (accept length drops, no crash)",
         "stream-race", "overlap, spec, a request decoding in consecutive batches"),
    _zoo("unaligned-tail-free", 4, "engine/accounting.py Memory._release_range",
         "the release counts committed pages by floor division and the over-allocated tail "
         "in whole pages, so a page holding both committed and reserved tokens is freed by "
         "neither part: one page stranded per request",
         "SGLang: over-allocation tail freed without page alignment at page_size > 1 "
         "(a stranded page per request)",
         "kv-accounting", "page_size > 1 and a committed length that is not page aligned"),
    _zoo("reserve-past-row", 5, "engine/scheduler.py Scheduler.reserve_tokens",
         "the draft reserve also covers the lagged batch and is not clamped to the row: at "
         "the context boundary it allocates past the request->token row, whose cells spill "
         "into the neighbouring row",
         "SGLang spec v2: draft reserve larger than the req_to_token row at the context "
         "boundary (leak plus a clobbered neighbouring row)",
         "kv-accounting", "overlap, k >= 1, a request decoding to within k tokens of its "
         "context limit"),
    _zoo("retract-inferred-free", 6, "engine/accounting.py Memory._release_range",
         "on retraction the pages to free are computed from the host-inferred sequence "
         "length (prompt + output) instead of the page list; the draft reserve beyond it "
         "is never freed",
         "SGLang: release computed from inferred seq lens instead of committed/allocated "
         "lengths (double or missed frees across overlap x page x spec x retract/finish)",
         "kv-accounting", "a retraction under memory pressure of a request holding reserve"),
    _zoo("teardown-skips-draft", 7, "engine/accounting.py Memory._release_range",
         "the tear-down of a request that still rides an unprocessed batch frees only its "
         "prefill/decode pages, leaving the draft-reserve pages to a verify-side free that "
         "never happens: a fixed leak per request finished under overlap",
         "SGLang frozen-KV MTP under overlap (seed PR): a fixed leak per finished request, "
         "the verify-side free of rejected draft slots racing the schedule-side tear-down",
         "kv-accounting", "overlap and spec; a request finishing or aborting in flight"),
    _zoo("stop-cut-after-length", 8, "engine/loop.py Engine._append",
         "an accept run that crosses max_new_tokens is cut at the length limit first and "
         "finished as 'length', without scanning it for a stop token: tokens after the stop "
         "are kept",
         "SGLang/vLLM: stop token inside an accept run that also crosses max_new_tokens "
         "(finished as length, post-stop tokens kept)",
         "lifecycle", "spec, stop ids, a stop token inside the final accept run"),
    _zoo("lagged-verify-counted", 9, "engine/loop.py Engine._results",
         "the verify result of a request whose finish was already known when its lagged "
         "batch is processed is counted again in its accept lengths",
         "SGLang spec metrics: finished or retracted requests in the lagged batch counted "
         "again (mean accept length reported too low)",
         "metrics", "overlap and spec; a request finishing while riding the next batch"),
    _zoo("abort-zombie", 10, "engine/loop.py Engine._results",
         "an abort that arrives while the request rides a prefill batch is deferred to that "
         "batch's result and then never carried out: the request is neither torn down nor "
         "scheduled again, a zombie that keeps the engine from going idle",
         "SGLang: abort arriving in the batch-transition window leaves a zombie request "
         "that decodes forever",
         "liveness", "overlap; an abort arriving while the request rides a batch"),
    _zoo("no-copy-done-wait", 11, "engine/worker.py SpecWorker.collect",
         "the host reads the pinned tokens and accept lengths without waiting for the "
         "copy-done event of the non-blocking D2H copy: it sees the previous batch's values "
         "or poison",
         "SGLang zero-bubble spec v2 (seed PR): host reading a pinned buffer filled by a "
         "non-blocking D2H copy before its event (stale accept lengths / tokens)",
         "parity", "the copy stream (or the forward) lagging behind the host"),
    _zoo("single-staging-buffer", 12, "engine/worker.py SpecWorker.launch",
         "the pinned H2D staging buffers are not double-buffered: the host rewrites them "
         "for batch i while the non-blocking copy of batch i-1 has not yet run, so batch "
         "i-1 runs on batch i's metadata and cells",
         "SGLang (pin_memory in forward_batch.init_new, seed PR): pinned H2D staging buffer "
         "overwritten by the host before the previous copy finished",
         "kv-canary", "overlap, with the schedule stream behind the host"),
    _zoo("verify-sum-unwaited", 13, "engine/worker.py SpecWorker._lens_sum",
         "with the verify sync removed (verify_sync off), the host still computes "
         "seq_lens_sum from the previous verify's published lengths, reading the pinned "
         "buffer of their non-blocking copy without waiting for its event: an in-flight "
         "(stale or poison) value",
         "SGLang PR #23452 (remove wait_for_verify): CPU-side sums such as seq_lens_sum "
         "computed from values still in flight",
         "stream-race", "overlap, spec, verify_sync off, a request decoding in consecutive "
         "batches"),
    _zoo("seq-lens-cpu-stale", 14, "engine/drafts_round.py DraftRounds._entry",
         "with zero bubble, the next round is drafted right after the draft-extend, but the "
         "host's sequence lengths staged for it are not refreshed: the pre-drafted round "
         "sees the current round's seq_lens_cpu, below the device's lengths, and a draft "
         "that reads them drafts other tokens",
         "SGLang PR #21895 zero bubble: seq_lens_cpu not refreshed during drafting; accept "
         "length changes for models that read it",
         "parity", "zero_bubble on, spec, a model that reads the host's sequence lengths "
         "(oracle-hostlens), a request decoding at least two rounds"),
    _zoo("backup-not-waited", 15, "engine/worker.py SpecWorker.launch",
         "the next forward does not wait for the pending KV backup: its resolve rewrites "
         "the committed lengths (and its verify the KV) the backup stream is still "
         "reading",
         "SGLang PR #21932 (HiSparse decode backup): the backup stream not waited for "
         "before the next decode",
         "stream-race", "kv_backup on, the backup stream behind the forward stream"),
    _zoo("mtp-draft-reads-unfrozen-kv", 17, "engine/drafts_mtp.py MTPDraft.launch_drafts",
         "draft step j of the frozen-KV MTP draft attends to the target KV up to the "
         "position it drafts instead of the committed positions only: the extra slots hold "
         "a rejected draft's target KV (which this step's verify overwrites), a recycled "
         "owner's KV or poison, so the drafts and accept lengths change",
         "SGLang frozen-KV MTP under overlap (seed PR): the draft reading target KV slots "
         "that the same step's verify or a recycled owner is overwriting",
         "parity", "draft kind mtp, spec_steps >= 2"),
    _zoo("eagle-stash-batch-position", 18, "engine/drafts_eagle.py EagleDraft.launch_extend",
         "the draft-extend stashes the next draft input (first draft token, hidden state) "
         "in the FutureMap at the request's batch position instead of its request-pool "
         "row; the next step resolves by row and starts from another request's (or a "
         "stale) hidden state",
         "SGLang EAGLE spec v2: next draft input read from the FutureMap stale or stashed "
         "under another request's slot (accept length drops, output unchanged)",
         "parity", "draft kind eagle, a batch whose requests' rows differ from their "
         "batch positions"),
    _zoo("hidden-seq-lens-sync", 19, "engine/worker.py SpecWorker._decode",
         "each decode step reads the device-side sequence lengths back with a blocking "
         "copy to sum them on the host",
         "SGLang PR #23452 review: seq_lens.sum().item() for backends without a "
         "preallocated buffer, a hidden host sync per decode step",
         "no-hidden-sync", "any decode step"),
    _zoo("rank-local-overlap", 16, "engine/loop.py Engine._overlaps",
         "a non-zero tensor-parallel rank decides whether to overlap a step from a "
         "rank-local timing value (its own previous result already copied back) and runs "
         "the step synchronously while rank 0 overlaps; it learns of finishes a step "
         "earlier, builds other batches (or none) and leaves an all-reduce unjoined: the "
         "ranks deadlock",
         "SGLang #27221/#27164: TP ranks deciding from per-rank clocks diverge on batch "
         "composition, NCCL collectives mismatch, a permanent TP deadlock (docs/design.md §7 "
         "class 16: ranks disagreeing on whether to overlap a step)",
         "rank-agreement", "tp >= 2, overlap, a rank whose previous result landed before "
         "it launched the next batch"),
    _zoo("ring-slot-alias", 20, "engine/future_map.py FutureRing.assign",
         "the ring FutureMap is sized for running batches only (3 x max_running slots, "
         "not counting chunked-prefill chunks and padding, which take slots too) and the "
         "counter trusts that size: it hands out a slot whose next input a running request "
         "has yet to read, and a later batch's stash overwrites it; the request resumes from "
         "another entry's token and length",
         "SGLang #13713, #13916, #25862: FutureMap ring overflow under chunked prefill, a "
         "later batch's future slot aliasing a pending next token",
         "parity", "future_map ring; a running request kept out of batches while 3 x "
         "max_running slots are handed out (chunked prefills of other requests)"),
    _zoo("reserve-host-view", 21, "engine/scheduler.py Scheduler.reserve_tokens",
         "before a decode the host grows a request's KV by 1 + draft_len past its own "
         "committed length, ignoring the verify still in flight: the device starts a "
         "round ahead, and the verify writes KV at positions with no slot allocated (the "
         "table's padding cell, or a cell a previous owner of the row left behind)",
         "TensorRT-LLM #16280: KV capacity grown from the host's lagging view of the "
         "sequence under overlap; a device write crosses into an unallocated block",
         "kv-canary", "overlap, a request decoding in consecutive batches, a committed "
         "length whose reserve does not round up to the lag (page_size small against k+1)"),
    _zoo("preempt-behind-fence", 22, "engine/scheduler.py Scheduler._decode",
         "the retraction loop expects each preemption to free pages at once; a victim "
         "riding the in-flight batch parks its pages behind it, so the free count does "
         "not move and the loop preempts the whole running queue, the request that needed "
         "the pages included; re-admitted, they run into the same wall: preempt, re-add, "
         "preempt, no request progresses",
         "vllm-ascend #16315 / vLLM #49675 (#49674): preemption thrashing with deferred "
         "block frees under async scheduling, 0 tok/s in a preempt -> re-add -> preempt "
         "cycle",
         "liveness", "overlap, a pool too small for the running requests' decode reserves, "
         "re-admitted requests short of their first reserve (zero bubble reserves a round "
         "more than admission sets aside)"),
    _zoo("tree-branch-kv-leak", 23, "engine/accounting.py Memory.trim",
         "with tree drafts (topk > 1) the release after a verify computes the freed range "
         "as a chain verify would (the k+1 positions past the kept length) and drops the "
         "rest of the tree's pages from the request without freeing them: the rejected "
         "branches' pages stay owned by a request that no longer lists them, and are "
         "never freed, at its finish included",
         "SGLang EAGLE topk > 1: the rejected branches' KV slots after verify freed by the "
         "chain path's range (the invariant checker that would see it is skipped when "
         "topk > 1)",
         "kv-accounting", "topk > 1, spec, a tree reserve reaching a page past the chain's "
         "k+1 positions (page_size small against topk * k)"),
    _zoo("sched-mutates-during-forward", 25, "engine/loop.py Engine._scheduler_step",
         "with the forward thread, a batch is handed over without the snapshot of what its "
         "launch reads of its requests (committed lengths, draft-round and FutureMap "
         "inputs): the forward thread reads the live requests while the scheduler thread, "
         "no queue handoff between them, processes the previous result and mutates them; "
         "where the interleaving runs that processing first, the launch stages lengths a "
         "verify ahead",
         "SGLang #8056 (and #20026): the scheduler thread appends to req.output_ids while "
         "the forward thread's logit processor reads the same request for the in-flight "
         "batch",
         "host-race", "forward_thread, overlap, a request in consecutive batches whose "
         "launch reads it (spec drafts, verify sync or the ring FutureMap)"),
    _zoo("lock-late-finish", 24, "engine/accounting.py Memory._leave_tree",
         "with the radix prefix cache, a finish processed one step late (the request still "
         "rides the lagged batch launched before its finish was known) inserts the "
         "request's KV into the tree but skips dec_lock_ref on its matched prefix: the "
         "path stays locked with no live request, can never be evicted, and the pool "
         "shrinks by it for good",
         "SGLang #12224 / #13826 / #19518: radix-cache lock_ref leaks on finish paths the "
         "overlap scheduler processes a step late (protected size never returns to zero, "
         "'token_to_kv_pool memory leak' at idle)",
         "kv-accounting", "prefix_cache, overlap, a request that matched a cached prefix "
         "and finishes while riding the lagged batch"),
    _zoo("phantom-pool-row", 26, "engine/accounting.py Memory.release",
         "the request-pool row of a request torn down while it still rides an in-flight "
         "batch goes back to the free list twice: at once, and again at the bottom of the "
         "free stack, where admission (capped at max_running) never reaches it; the pool "
         "lists more free rows than it has, free + held = total + 1 and growing, and "
         "nothing the engine does changes",
         "SGLang-style request-pool double free: ReqToTokenPool.free of a request's row "
         "reached both on the tear-down and on the deferred release of an overlap batch; "
         "the free-slot list outgrows the pool, and only a pool-size check at idle "
         "can tell",
         "pool-integrity", "overlap, a request finished, aborted or retracted while it "
         "rides an unprocessed batch"),
    _zoo("radix-node-overcovers", 27, "engine/accounting.py Memory._leave_tree",
         "with the radix prefix cache, a finished request's insert hands the tree the page "
         "past the last whole page of its key too (partly committed or reserved KV): the "
         "new node holds one page more than its key covers, or, where the tree already "
         "had the key, the pool counts a cached page no node holds; matches of a shorter "
         "prefix and the pool's counts look right (only a later match of the whole node "
         "hands the extra page to a request, whose tokens then change)",
         "SGLang RadixCache.cache_finished_req: the KV indices inserted with a key not cut "
         "to the key's page-aligned length (the tail page goes to the tree with the key)",
         "pool-integrity", "prefix_cache, a finished request holding a page past the last "
         "whole page of its committed KV (a decode reserve, a partial page)"),
    _zoo("forward-thread-skipped", 28, "engine/tp.py make_engine",
         "every engine is built as a tensor-parallel engine, one rank included; its step "
         "runs begin_step/end_step on each rank and never hands a batch to the forward "
         "thread, so a forward_thread config runs on one host thread: tokens, parity and "
         "every race checker stay clean, and nothing says the mode did not run",
         "a configured scheduling mode silently replaced by another code path (a launcher "
         "routing every worker through the tensor-parallel driver, whose loop has no "
         "forward thread): the mode's tests and campaigns exercise the other path",
         "config-effect", "forward_thread (one rank), a batch launched"),
    _zoo("declared-kv-slots-shrunk", 29, "engine/scheduler.py Scheduler._batch",
         "the batch's KV slots, the host's upper bound of what its forward may touch and "
         "what every KV launch declares, are cut to the padding slot {0}: the kernels still "
         "read and write the requests' slots, and the race detector, fed the declarations, "
         "sees none of those accesses (every KV race and reuse is hidden)",
         "a scheduler refactor that narrows the slot set passed to the attention metadata "
         "and the race tooling (annotations trusted, never audited): declared accesses "
         "narrower than the kernel's",
         "access-audit", "an audited run (the fuzzer audits a quarter of its examples); any "
         "batch with KV"),
    _zoo("eagle-kv-tag-wrong", 30, "engine/drafts_eagle.py EagleDraft.launch_extend",
         "the draft-extend writes the accepted positions' EAGLE KV rows with the position "
         "tag of the token each holds (p + 1: an EAGLE pair at p holds the token at p + 1) "
         "instead of the row's own position p; the head reads only the token and feature "
         "columns, so drafts, accept lengths and tokens stay the same",
         "EAGLE draft-extend writing its KV with positions shifted by one (the pair's "
         "token position instead of its own: RoPE positions off by one in the draft KV, "
         "accept length drops on real heads, no crash)",
         "kv-canary", "draft kind eagle, spec, a request decoding in two batches (the "
         "second batch's canary reads the rows the first one's draft-extend wrote)"),
    _zoo("zeroing-without-fill-wait", 31, "engine/buffers.py DeviceState.__init__",
         "the schedule stream does not wait for the forward stream before zeroing the "
         "request->token table, whose allocation poison-filled it on the forward stream: "
         "the zeroing and the fill are unordered, and a table cell may keep the poison",
         "zero-initialised index tables (req_to_token) allocated on one stream and "
         "cleared on another without a stream wait (a fill kernel and a memset racing)",
         "stream-race", "any run (the tables are allocated and zeroed at start)"),
)

FAULTS: Dict[str, Fault] = {f.name: f for f in _ENTRIES}


def check_names(names: Iterable[str]) -> None:
    """``ValueError`` (one line, listing the valid names) for an unknown fault."""
    check(names, FAULTS)


class FaultSet(Guards):
    """The zoo's faults switched on in one engine instance: ``on(name)`` at a guarded site."""

    __slots__ = ()

    def __init__(self, names: Iterable[str] = ()):
        super().__init__(names, FAULTS)

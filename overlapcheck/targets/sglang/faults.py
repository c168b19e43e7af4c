"""Target faults: public, fixed SGLang bugs re-created against 0.5.23 as opt-in patches.

Each fault (``overlapcheck.faults.Fault``, its mechanism a ``SourcePatch``) restores the
pre-fix behaviour of one SGLang function, the way SGLang's own
``SGLANG_DEBUG_REVERT_PR`` switch reverts a fix: the function's source is edited
(each edit must match exactly once, or the fault refuses to apply), compiled in its
module's namespace and installed in place of the original — in every SGLang module
that imported it by name — only inside a session whose config lists the fault
(``applied``, through ``source_patch``), and restored when the session ends. Two faults
editing one function are one patch with both edits. Nothing in overlapcheck's fuzzer
knows fault names; a fault counts as found only through the checker it names.

Each fault's own fields (listed by ``overlapcheck faults``): ``seed``, the seed pull
request (docs/design.md §7) whose class it re-creates, if any; ``worker``, the config
``worker``s whose runs take the patched code (every worker for the scheduler code they
all run; SGLang's real spec workers for their overlap path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ...faults import Fault, FunctionPatch, SourcePatch
from ...faults.patch import merged
from . import source_patch
from .worker_kinds import REAL_WORKERS, WORKERS


@dataclass(frozen=True)
class SglangPatch(SourcePatch):
    """A ``SourcePatch`` whose edits are exact text (``source_patch``) and whose edited
    source may need names beyond its module's: ``helpers``, (name, "module:attribute")."""

    helpers: Tuple[Tuple[str, str], ...] = ()


def _fault(name: str, pr: str, checker: str, target: str, edits: Tuple[Tuple[str, str], ...],
           trigger: str, description: str, seed: Optional[str] = None,
           worker: Tuple[str, ...] = WORKERS,
           helpers: Tuple[Tuple[str, str], ...] = ()) -> Fault:
    """A fault restoring the pre-fix source of ``target`` ("module:Qualified.name"):
    ``edits`` are (exact fixed text, pre-fix text) pairs; ``pr`` the public fix."""
    return Fault(name, description, pr, checker, trigger,
                 SglangPatch((FunctionPatch(target, tuple(edits)),), tuple(helpers)),
                 (("seed", seed), ("worker", tuple(worker))))


FAULTS: Dict[str, Fault] = {}


def _register(f: Fault) -> None:
    FAULTS[f.name] = f


_register(_fault(
    name="overalloc-leak",
    pr="sgl-project/sglang#19518 (same class: #12224, #13826)",
    checker="kv-accounting",
    target="sglang.srt.mem_cache.common:release_kv_cache",
    edits=(("    _release_overallocated_kv_indices(\n"
            "        req, owned_kv_len, req.kv.kv_allocated_len, tree_cache\n"
            "    )\n", ""),),
    trigger="spec decode (spec_steps >= 1): decode reserves draft slots past the committed length",
    description=(
        "A release path frees a finished request's committed KV but not its over-allocated "
        "draft slots [kv_committed_len, kv_allocated_len): spec v2 reserves them for the "
        "next verify, so every finished request strands its tail. #19518 found it on the "
        "decode-offload release path ('over-allocated draft token slots were never freed "
        "after request completion') and fixed it by freeing the overallocation as "
        "release_kv_cache does; this fault removes that free from release_kv_cache itself."),
))

_register(_fault(
    name="delayed-token-double-free",
    pr="sgl-project/sglang#12224",
    checker="kv-accounting",
    target="sglang.srt.managers.scheduler_components.batch_result_processor:"
           "SchedulerBatchResultProcessor.process_batch_result_decode",
    edits=((
        "                # NOTE: This (req.finished() or req.is_retracted) should only happen when overlap scheduling is enabled.\n"
        "                # And all the over-allocated tokens will be freed in `release_kv_cache`.\n"
        "                continue\n",
        "                if req.finished() and batch.spec_algorithm.is_none():\n"
        "                    # pre-#12224: free the one delayed token of the lagged batch here\n"
        "                    # (spec decode had no overlap loop then: no branch for it)\n"
        "                    page_size = self.token_to_kv_pool_allocator.page_size\n"
        "                    if page_size == 1 or (\n"
        "                        len(req.origin_input_ids) + len(req.output_ids) - 1\n"
        "                    ) % page_size == 0:\n"
        "                        self.token_to_kv_pool_allocator.free(batch.out_cache_loc[i : i + 1])\n"
        "                continue\n"),),
    trigger="overlap loop, no spec, a request finishing by a stop token (it rides the "
            "already launched batch); at page size > 1 only when that batch's token opened "
            "a page",
    description=(
        "Before #12224 ('unify memory management across (overlap, non-overlap) x (page>=1) "
        "x (retract, finished)') the overlap branch of decode result processing freed the "
        "slot the lagged batch had allocated for a request that had already finished (at "
        "page size > 1, the page when that slot opened one), while the finish path freed "
        "the request's whole range too: that slot is freed twice. The fix made "
        "release_kv_cache, driven by kv_allocated_len, the only release."),
))

_register(_fault(
    name="length-before-stop",
    pr="sgl-project/sglang#33758 (issue #31599)",
    checker="lifecycle",
    target="sglang.srt.managers.schedule_batch:Req.update_finish_state",
    edits=((
        "        # Sanitize out-of-range / NaN token ids before any decode.\n",
        "        if len(self.output_ids) >= self.sampling_params.max_new_tokens:\n"
        "            self.finished_reason = FINISH_LENGTH(\n"
        "                length=self.sampling_params.max_new_tokens\n"
        "            )\n"
        "            self.finished_len = self.sampling_params.max_new_tokens\n"
        "            return\n\n"
        "        # Sanitize out-of-range / NaN token ids before any decode.\n"),),
    trigger="spec decode: an accept run holding a stop token that also crosses max_new_tokens",
    description=(
        "Req.update_finish_state checked the max_new_tokens cap before the stop checks. A "
        "spec accept run that holds a stop token and crosses the cap in one step finished "
        "as 'length' with finished_len at the cap, so tokens accepted after the stop leaked "
        "into the output. #33758 runs the stop checks first and caps a stop found beyond "
        "the budget at the limit."),
))


_register(_fault(
    name="spec-relay-prefix-filter",
    pr="sgl-project/sglang#14368 (fix proposed in #14536; same class: #18647)",
    checker="sglang-golden",
    target="sglang.srt.speculative.eagle_info:EagleDraftInput.filter_batch",
    edits=tuple((f"        self.{f} = self.{f}[new_indices]\n",
                 f"        self.{f} = self.{f}[: len(new_indices)]\n")
                for f in ("topk_p", "topk_index", "bonus_tokens")),
    trigger="spec decode in the normal loop (the overlap loop relays by request row): a "
            "request leaves a decode batch while one after it stays",
    description=(
        "EagleDraftInput.filter_batch kept the first len(new_indices) rows of the draft "
        "input instead of the rows of the requests that stay (the has_been_filtered path "
        "#14368 reports: 'length of new_indices != length of topk_p', misaligned spec_info). "
        "When a request other than the last leaves the batch (it finished, was aborted or "
        "retracted), the requests after it verify from another request's bonus token: "
        "their drafts and tokens are not their own continuation."),
))


# -- SGLang's real spec-v2 worker: the seeds' classes and the history of its overlap path --
_REAL = ("overlap loop, one of SGLang's real spec workers (worker: eagle-v2 or "
         "frozen-kv-mtp-v2: its CUDA path runs under watch)")

_register(_fault(
    name="verify-result-no-wait",
    seed="001: sgl-project/sglang#23452 (remove wait_for_verify sync)",
    pr="sgl-project/sglang#23452 (open; the guard it removes is copy_done, #29075)",
    checker="stream-race",
    worker=REAL_WORKERS,
    target="sglang.srt.managers.scheduler_components.batch_result_processor:"
           "SchedulerBatchResultProcessor.process_batch_result_decode",
    edits=(("        if result.copy_done is not None:\n"
            "            result.copy_done.synchronize()\n"
            "        auxiliary_output_starts", "        auxiliary_output_starts"),),
    trigger=_REAL + ", a decode whose result is processed",
    description=(
        "The host consumes a verify's result without waiting for it: decode result "
        "processing reads the accept lengths and verified tokens (.tolist() of the pinned "
        "buffers the copy stream fills with non-blocking copies) without "
        "copy_done.synchronize(). Seed 001 removes spec v2's wait_for_verify host sync "
        "('not sure if it has data race, lack of testing'); in 0.5.23 the one fence "
        "between the verify and the host is copy_done, and this drops it."),
))

_register(_fault(
    name="futuremap-relay-unordered",
    seed="002: sgl-project/sglang#9588 (overlap scheduling for speculative decoding)",
    pr="sgl-project/sglang#9588 (the FutureMap relay; a later ordering fix in it: #35748)",
    checker="stream-race",
    worker=REAL_WORKERS,
    target="sglang.srt.managers.scheduler:Scheduler.run_batch",
    edits=(("                        if batch_result.delay_sample_func is None:\n"
            "                            self._relay_forward_payload(\n"
            "                                batch, future_indices, batch_result\n"
            "                            )\n",
            "                        if batch_result.delay_sample_func is None:\n"
            "                            with self.device_module.stream(self.schedule_stream):\n"
            "                                self._relay_forward_payload(\n"
            "                                    batch, future_indices, batch_result\n"
            "                                )\n"),),
    trigger=_REAL + ", a batch whose next draft input is relayed (every spec batch)",
    description=(
        "The FutureMap slot is relayed before its write is ordered: the stash of the next "
        "draft input (bonus tokens, top-k, hidden states) into the FutureMap's rows is "
        "issued on the schedule stream instead of the forward stream, so it reads the "
        "verify's and draft-extend's outputs while the forward still writes them. Seed "
        "002 introduced this relay (future buffers per draft-input tensor, written by "
        "step N and read by step N+1 with no host sync); #35748 fixed an ordering race "
        "between publish and stash in the same map."),
))

_register(_fault(
    name="release-single-reserve",
    seed="004: frozen-KV MTP spec-v2 worker, a 24-token KV leak per finished request",
    pr="(seed 004 is a draft; same class fixed in sgl-project/sglang#12224, #19518)",
    checker="kv-accounting",
    worker=REAL_WORKERS,
    target="sglang.srt.mem_cache.common:release_kv_cache",
    edits=(("        req, owned_kv_len, req.kv.kv_allocated_len, tree_cache\n",
            "        req, owned_kv_len,\n"
            "        min(req.kv.kv_allocated_len, owned_kv_len + get_alloc_len_per_decode()),\n"
            "        tree_cache,\n"),),
    helpers=(("get_alloc_len_per_decode",
              "sglang.srt.mem_cache.allocation_sizing:get_alloc_len_per_decode"),),
    trigger="spec decode (a verify reserves twice its draft width; without spec nothing "
            "is over-allocated)",
    description=(
        "Tearing down a finished request frees its committed KV and only one verify's "
        "width of the tail past it, as if a decode reserved once: spec v2 reserves twice "
        "the draft width per decode (the double buffer that absorbs the committed-length "
        "lag of overlap), so the rest of the tail is stranded, per finished request. Seed "
        "004's frozen-KV worker leaked 24 slots per finished request, its author "
        "suspecting a release racing the schedule-side tear-down; 0.5.23's "
        "FrozenKVMTPWorkerV2 owns no KV of its own (frozen_kv_mtp_worker_v2.py l.185-205, "
        "l.492) and every spec worker's slots are released here (mem_cache/common.py "
        "l.400-470): this re-creates the release that misses part of the range."),
))

_register(_fault(
    name="war-barrier-off",
    pr="sgl-project/sglang#26380 (WAR barrier for overlap schedule buffer writes; #18746)",
    checker="stream-race",
    worker=REAL_WORKERS,
    target="sglang.srt.managers.scheduler:Scheduler._apply_war_barrier",
    edits=(("        if not self._war_barrier_enabled:\n            return\n",
            "        return\n"),),
    trigger=_REAL + ", a batch prepared while the previous forward runs",
    description=(
        "The schedule stream writes the request->token table (and the allocator's "
        "buffers) for batch N+1 while forward N still reads them: the WAR barrier "
        "(schedule_stream waits for forward_stream after each launch) is gone. #26380 "
        "added it after flaky accuracy under overlap; #18746 described a reused "
        "request-pool row rewritten during the previous forward."),
))

_register(_fault(
    name="d2h-copy-unordered",
    pr="sgl-project/sglang#29075 (overlap the result D2H copy with the next forward)",
    checker="stream-race",
    worker=REAL_WORKERS,
    target="sglang.srt.managers.scheduler:Scheduler._copy_result_to_cpu",
    edits=(("        self.copy_stream.wait_stream(self.forward_stream)\n", ""),),
    trigger=_REAL + ", any batch (its result is copied to the host)",
    description=(
        "The result copy to the host runs on the copy stream without waiting for the "
        "forward that writes the tokens and accept lengths: #29075 moved the D2H to a "
        "dedicated copy_stream ordered by copy_stream.wait_stream(forward_stream); "
        "without that wait the copy reads the verify's outputs while they are written."),
))


# -- applying -------------------------------------------------------------------------------
def _edited(patches, helpers, label: str) -> list:
    extra = source_patch.shared.helpers(helpers) or None
    return [source_patch.edited(p.target, p.edits, label, extra) for p in patches]


def patched_function(fault: Fault):
    """``(owner, attribute, original, pre-fix function)``: the original's source (as
    indented in its file) with the fault's edits, compiled in the original's module
    namespace."""
    (p,) = _edited(fault.mechanism.functions, fault.mechanism.helpers, f"fault {fault.name}")
    return p


def applied(names, session=None):
    """Apply the named faults for the duration of the block (a context manager); the
    faults editing one function are one patch with all their edits."""
    faults = [FAULTS[n] for n in names]
    patches = []
    for p in merged(faults):
        mine = [f for f in faults if p.target in f.sites]
        helpers = tuple(h for f in mine for h in f.mechanism.helpers)
        label = "fault " + "+".join(f.name for f in mine)
        patches += _edited((p,), helpers, label)
    return source_patch.installed(patches)

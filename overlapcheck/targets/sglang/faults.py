"""Target faults: public, fixed SGLang bugs re-created against 0.5.23 as opt-in patches.

Each fault restores the pre-fix behaviour of one SGLang function, the way SGLang's own
``SGLANG_DEBUG_REVERT_PR`` switch reverts a fix: the function's source is edited
(each edit must match exactly once, or the fault refuses to apply), recompiled in its
module's namespace and installed in place of the original — in every SGLang module
that imported it by name — only while a session whose config lists the fault runs
(``applied``), and restored when the run ends (``overlapcheck.faults.SourcePatch``).
Nothing in overlapcheck's fuzzer knows fault names; a fault counts as found only
through the checker it names.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Tuple

from ...faults import Fault, SourcePatch
from ...faults.patch import installed, merged

FAULTS: Dict[str, Fault] = {}


def _patch(name: str, cites: str, checker: str, target: str, edits: Tuple[Tuple[str, str], ...],
           trigger: str, description: str) -> Fault:
    """A fault restoring the pre-fix source of ``target`` ("module:Qualified.name"):
    ``edits`` are (fixed text, pre-fix text) pairs."""
    return Fault(name, description, cites, checker, trigger, SourcePatch.of(target, *edits))


def _register(f: Fault) -> None:
    FAULTS[f.name] = f


_register(_patch(
    name="overalloc-leak",
    cites="sgl-project/sglang#19518 (same class: #12224, #13826)",
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

_register(_patch(
    name="delayed-token-double-free",
    cites="sgl-project/sglang#12224",
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

_register(_patch(
    name="length-before-stop",
    cites="sgl-project/sglang#33758 (issue #31599)",
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


_register(_patch(
    name="spec-relay-prefix-filter",
    cites="sgl-project/sglang#14368 (fix proposed in #14536; same class: #18647)",
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


def _import(module: str):
    """SGLang's modules import only with the stubs of its CUDA-only modules in place."""
    from . import env
    with env.stubbed():
        return __import__(module, fromlist=["_"])


@contextlib.contextmanager
def applied(names) -> Iterator[None]:
    """Apply the named faults for the duration of the block."""
    with installed(merged(FAULTS[n] for n in names), _import):
        yield

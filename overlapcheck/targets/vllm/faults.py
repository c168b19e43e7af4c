"""Target faults: public, fixed vLLM scheduler bugs re-created against vLLM 0.33.0 as
opt-in source patches (``overlapcheck.faults.SourcePatch``) that restore the pre-fix
code.

Each entry names the fix it reverts (PR and issue), the checker expected to catch it,
what the fix changed, and the trigger without which the revert is silent. A session
whose config lists a fault binds the pre-fix methods to its own scheduler instance
(nothing else in the process sees them) and drops them when the session ends
(``patches_for``). ``FAULTS`` is a constant.
"""
from __future__ import annotations

from typing import Dict, Tuple

from ...faults import Fault, FunctionPatch, SourcePatch
from ...faults.patch import merged

SCHED = "vllm.v1.core.sched.scheduler:Scheduler"


def _revert(name: str, pr: str, checker: str, description: str, trigger: str, method: str,
            *edits) -> Fault:
    """A fault reverting fix ``pr`` in ``Scheduler.method``: ``edits`` are (fixed text,
    pre-fix text) pairs."""
    return Fault(name, description, pr, checker, trigger,
                 SourcePatch.of(f"{SCHED}.{method}", *edits))


PREEMPT_KEEPS_INFLIGHT = _revert(
    "preempt-keeps-inflight-output",
    "vLLM #48245 (reworks #47900; issue #41190)",
    "vllm-placeholders",
    "Async scheduling + preemption: _preempt_request resets num_computed_tokens to 0 but "
    "leaves num_output_placeholders as they are and does not mark the batches still in "
    "flight as stale, so their outputs later drain against the reset counters (the "
    "placeholder count underflows; a resumed request takes an in-flight output as its "
    "own). The fix zeroes the placeholders, counts the in-flight tokens as stale "
    "(num_stale_output_tokens: delivered, never applied to the counters) and keeps the "
    "request waiting until they have drained.",
    "async scheduler with three batches in flight (batch_queue 3: V2 + pipeline "
    "parallel 2) and a pool small enough to preempt a request while two of its batches "
    "are in flight; with one in flight the stale output drains before any resume and "
    "the counters balance (as the #47900 thread observed)",
    "_preempt_request",
    ("""
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        """, """
        pass  # pre-#48245: placeholders kept, in-flight output not marked stale
        """))

FREE_IGNORES_FENCE = _revert(
    "free-ignores-fence",
    "vLLM #45357 (deferred block free under async scheduling + a KV-consumer connector)",
    "vllm-block-reuse",
    "A finished, aborted or preempted request's KV blocks return to the pool at once, "
    "while a batch still in flight may write them; a KV-consumer connector can then "
    "reallocate them and fill them with a load that is not ordered with that write. The "
    "fix parks the blocks in deferred_frees behind a fence (the request's last scheduled "
    "step) and returns them once that step's output is processed.",
    "defer_block_free on (a KV-consumer deployment), a batch queue of 2, a request that "
    "ends while one of its batches is in flight and a pool tight enough to reuse blocks",
    "_free_request_blocks",
    ("if self._request_blocks_can_be_freed(request):",
     "if True:  # pre-#45357: blocks return to the pool at once"))

PREEMPT_FENCED_VICTIM = _revert(
    "preempt-fenced-victim",
    "vLLM #49675 (issue #49674; vllm-ascend #16315)",
    "vllm-preempt-progress",
    "When allocate_slots fails for a running request, the retry loop preempts the "
    "policy's victim even when the victim's blocks are fenced behind an in-flight step: "
    "the preemption frees nothing now, the retry fails again and the next victim goes "
    "too, a cascade of zero-progress preemptions (under load: preempt/re-add forever, "
    "0 tokens/s). The fix stops the retry when the selected victim's free would be "
    "deferred.",
    "defer_block_free on, a batch queue of 2, a pool small enough that a running "
    "request's allocation fails while the victim has a batch in flight",
    "schedule",
    ("""
                    # A deferred free will not help with immediate allocation.
                    if not self._request_blocks_can_be_freed(preempted_req):
                        break
        """, """
                    pass  # pre-#49675: a fenced victim is preempted all the same
        """))

SCHEDULE_PAST_MAX_TOKENS = _revert(
    "schedule-past-max-tokens",
    "vLLM #27922 ([AsyncScheduling] Don't schedule past request max_tokens)",
    "vllm-overschedule",
    "Async scheduling schedules one more decode step for a request whose in-flight "
    "batch already produces its last token (max_tokens): KV blocks are allocated and a "
    "batch slot is spent for output that is thrown away, and the extra step can preempt "
    "others. The fix skips a running request when num_computed_tokens + 2 - "
    "num_output_placeholders reaches prompt + max_tokens.",
    "async scheduler with a batch queue of 2 and requests that end by max_tokens",
    "schedule",
    ("""
            if (
                request.num_output_placeholders > 0
                # This is (num_computed_tokens + 1) - (num_output_placeholders - 1).
                # Since output placeholders are also included in the computed tokens
                # count, we subtract (num_output_placeholders - 1) to remove any draft
                # tokens, so that we can be sure no further steps are needed even if
                # they are all rejected.
                and request.num_computed_tokens + 2 - request.num_output_placeholders
                >= request.num_prompt_tokens + request.max_tokens
            ):
                # Async scheduling: Avoid scheduling an extra step when we are sure that
                # the previous step has reached request.max_tokens. We don't schedule
                # partial draft tokens since this prevents uniform decode optimizations.
                req_index += 1
                continue
        """, """
            pass  # pre-#27922: no max_tokens check for requests with output in flight
        """))

FAULTS: Dict[str, Fault] = {f.name: f for f in (
    PREEMPT_KEEPS_INFLIGHT, FREE_IGNORES_FENCE, PREEMPT_FENCED_VICTIM,
    SCHEDULE_PAST_MAX_TOKENS)}


def patches_for(names) -> Tuple[FunctionPatch, ...]:
    """The pre-fix methods of the named faults, merged per method (two faults editing
    the same method are one patch with both edits)."""
    return merged(FAULTS[n] for n in names)

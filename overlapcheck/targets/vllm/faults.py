"""Target faults: public, fixed vLLM scheduler bugs re-created against vLLM 0.33.0 as
opt-in source patches (``overlapcheck.faults.SourcePatch``) that restore the pre-fix
code.

Each entry names the fix it reverts (PR and issue), the checker expected to catch it,
what the fix changed, and the trigger without which the revert is silent. A session
whose config lists a fault binds the pre-fix methods to its own scheduler instance
(nothing else in the process sees them) and drops them when the session ends
(``patches_for``). Faults of ``layer`` "runner" are in vLLM's V2 model runner
(``runner: real``): their exact-text edits are applied to the runner's source for the
duration of a run (``runner_faults``). ``layer`` is each fault's own field (listed by
``overlapcheck faults``). ``FAULTS`` is a constant.
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
                 SourcePatch.of(f"{SCHED}.{method}", *edits), (("layer", "scheduler"),))


def _runner(name: str, pr: str, checker: str, description: str, trigger: str, target: str,
            *edits) -> Fault:
    """A fault in vLLM's V2 model runner restoring the pre-fix source of ``target``
    ("module:Qualified.name"): ``edits`` are (exact fixed text, pre-fix text) pairs."""
    return Fault(name, description, pr, checker, trigger, SourcePatch.of(target, *edits),
                 (("layer", "runner"),))


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

_ASYNC = "vllm.v1.worker.gpu.async_utils"
_REAL = "runner: real, async scheduler with a batch queue of 2"

ASYNC_OUTPUT_DROPS_REFS = _runner(
    "async-output-drops-refs",
    "vLLM #29623 ([Model Runner V2][BugFix] Keep reference to GPU tensors in "
    "AsyncOutput); same class: vllm-ascend #13394 (record_stream missing on a sampler "
    "tensor)",
    "stream-race",
    "AsyncOutput copies the sampled token ids and the per-request sample counts to the "
    "host on the output copy stream but keeps no reference to the device tensors, which "
    "the main stream allocated: once sample_tokens returns they are freed, and the "
    "caching allocator hands their blocks to the next step's tensors on the main stream "
    "while the copy stream may still read them. #29623 keeps the sampler output and "
    "num_sampled in the AsyncOutput until it is consumed (the alternative is "
    "record_stream on the copy stream, which vllm-ascend #13394 added for a sampler "
    "tensor).",
    _REAL + ", a step scheduled before the previous one's output is taken",
    _ASYNC + ":AsyncOutput.__init__",
    ("        self.sampler_output = sampler_output\n"
     "        self.num_sampled_tokens = num_sampled_tokens\n", ""))

OUTPUT_READ_BEFORE_EVENT = _runner(
    "output-read-before-event",
    "vLLM #36942 (AsyncPoolingOutput.get_output reads its pinned output before "
    "copy_event.synchronize(); the same file's AsyncOutput, #31584 moved the copy to its "
    "stream)",
    "stream-race",
    "AsyncOutput.get_output turns the pinned host copies of the sampled token ids and "
    "sample counts into lists before synchronizing the copy's event, as "
    "AsyncPoolingOutput.get_output did (#36942): the host may read a buffer the "
    "non-blocking device-to-host copy has not filled yet, and the scheduler applies "
    "garbage tokens.",
    _REAL + ", any step whose output is taken",
    _ASYNC + ":AsyncOutput.get_output",
    ("        self.copy_event.synchronize()\n\n", ""),
    ("        num_sampled_tokens: list[int] = self.num_sampled_tokens_np.tolist()\n",
     "        num_sampled_tokens: list[int] = self.num_sampled_tokens_np.tolist()\n"
     "        self.copy_event.synchronize()\n"))

UVA_STAGING_REUSED = _runner(
    "uva-staging-reused",
    "vLLM #32799 ([ModelRunner V2] Don't pin reused flashinfer tensors: step N's async "
    "copy from a reused pinned buffer races step N+1's update); the round robin that "
    "guards V2's staging buffers: #32083",
    "stream-race",
    "The V2 runner stages its persistent-buffer writes (request state, block tables) in "
    "pinned host buffers that its kernels read through UVA, with no synchronization: "
    "safety rests on a round robin of as many buffers as steps in flight "
    "(UvaBufferPool, max_concurrency). With one buffer, step N+1's host writes into the "
    "buffer step N's _apply_write_kernel may still be reading (the race #32799 removed "
    "for FlashInfer's reused pinned buffers by not pinning them).",
    _REAL + ", a step whose staged writes are prepared before the previous step's "
    "output is taken",
    "vllm.v1.worker.gpu.buffer_utils:UvaBufferPool.__init__",
    ("        self.max_concurrency = max_concurrency\n",
     "        self.max_concurrency = max_concurrency = 1\n"))

FAULTS: Dict[str, Fault] = {f.name: f for f in (
    PREEMPT_KEEPS_INFLIGHT, FREE_IGNORES_FENCE, PREEMPT_FENCED_VICTIM,
    SCHEDULE_PAST_MAX_TOKENS, ASYNC_OUTPUT_DROPS_REFS, OUTPUT_READ_BEFORE_EVENT,
    UVA_STAGING_REUSED)}


def patches_for(names) -> Tuple[FunctionPatch, ...]:
    """The pre-fix scheduler methods of the named faults (runner faults are left to
    ``runner_faults``), merged per method (two faults editing the same method are one
    patch with both edits)."""
    return merged(FAULTS[n] for n in names if FAULTS[n].extra["layer"] == "scheduler")

"""SGLang 0.5.23: an abort taken before a verify's result is processed keeps the
tokens accepted past a stop token (or past max_new_tokens).

Standalone: imports SGLang only. Run it with the Python SGLang is installed in:

    python docs/findings/sglang-abort-keeps-tokens-past-stop/repro.py

It drives ``Req`` through the same calls the scheduler makes for one spec-decode
request: the prefill's token, then (after ``Scheduler.abort_request`` set
``to_finish`` on the running request) a verify whose accept run is [2, 10, 9] with stop
token 10. It prints what SGLang sends, with and without the abort, and exits 1 while
the bug is there (0 once fixed).
"""
import os
import sys
from array import array

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_sglang import stand_in_for_torchvision  # noqa: E402  (beside the pages)


def sent_tokens(abort: bool) -> tuple:
    """What SGLang keeps for one request: prompt [28, 16], stop token 10, greedy; the
    prefill samples 17, then one verify accepts the run [2, 10, 9]."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
    from sglang.srt.sampling.sampling_params import SamplingParams
    sp = SamplingParams(max_new_tokens=20, stop_token_ids={10}, temperature=0.0)
    sp.normalize(None)
    sp.verify(64)
    req = Req("r0", None, array("q", [28, 16]), sp, vocab_size=64)
    # prefill: batch_result_processor.process_batch_result_prefill
    req.output_ids.append(17)
    req.update_finish_state(1)
    if abort:
        # Scheduler.abort_request (scheduler.py l.5797-5812): the request is running,
        # so it is only marked; it rides the batch already launched
        req.to_finish = FINISH_ABORT()
    # that batch's verify accepted three tokens: process_batch_result_decode
    # (batch_result_processor.py l.1017-1036) appends the run, then updates the finish
    req.output_ids.extend([2, 10, 9])
    req.update_finish_state(3)
    # SchedulerOutputStreamer.accept (output_streamer.py l.449-451), then what is sent
    if req.finished_len is None:
        req.finished_len = len(req.output_ids)
    return type(req.finished_reason).__name__, list(req.output_ids_through_stop)


def main() -> int:
    stand_in_for_torchvision()
    import sglang
    print(f"SGLang {sglang.__version__}")
    reason, clean = sent_tokens(abort=False)
    print(f"no abort:         {reason:<20} sends {clean}")
    reason, aborted = sent_tokens(abort=True)
    print(f"abort before it:  {reason:<20} sends {aborted}")
    if aborted != clean:
        print(f"BUG: the aborted request sends {aborted[len(clean):]} past its stop token 10")
        return 1
    print("fixed: the abort keeps the output cut at the stop token")
    return 0


if __name__ == "__main__":
    sys.exit(main())

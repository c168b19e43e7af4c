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
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from array import array


def _stand_in_for_torchvision() -> None:
    """SGLang's config package imports torchvision at module level (multimodal helpers);
    a CPU install of SGLang may lack it. An empty stand-in lets the import finish; no
    code this script runs uses it. A real torchvision, when installed, is left alone."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    # transformers caches whether torchvision exists when first asked: ask while it is
    # really absent, so the stand-in is never taken for a release
    from transformers.utils import import_utils
    import_utils.is_torchvision_available()

    class Empty(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = Empty(spec.name)
            m.__path__ = []
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


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
    _stand_in_for_torchvision()
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

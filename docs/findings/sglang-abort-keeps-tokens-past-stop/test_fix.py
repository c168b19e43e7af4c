"""The fix for this finding, tested: the aborted request's output ends at its stop token
or its length cap, as it does without the abort.

Against the installed SGLang 0.5.23 these tests fail (the bug). With
``SGLANG_FINDING_APPLY_FIX=1`` they apply ``fix.diff`` to a local copy of
``Req.update_finish_state`` (SGLang's own source, edited in memory, never written
back) and pass:

    python -m pytest docs/findings/sglang-abort-keeps-tokens-past-stop/test_fix.py
    SGLANG_FINDING_APPLY_FIX=1 python -m pytest docs/findings/sglang-abort-keeps-tokens-past-stop/test_fix.py

Imports SGLang and pytest only.
"""
import inspect
import os
import sys
import textwrap
from array import array

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import repro  # noqa: E402  (this finding's standalone reproduction, beside this file)


def _hunk(diff: str):
    """(old, new) text of the diff's one hunk, without the diff's line markers."""
    body = diff.split("@@", 2)[2].split("\n", 1)[1]
    old, new = [], []
    for line in body.splitlines():
        tag, text = line[:1], line[1:]
        if tag in (" ", "-"):
            old.append(text)
        if tag in (" ", "+"):
            new.append(text)
    return "\n".join(old) + "\n", "\n".join(new) + "\n"


@pytest.fixture(scope="module", autouse=True)
def engine():
    repro.stand_in_for_torchvision()
    from sglang.srt.managers import schedule_batch
    orig = schedule_batch.Req.update_finish_state
    if os.environ.get("SGLANG_FINDING_APPLY_FIX") == "1":
        with open(os.path.join(HERE, "fix.diff"), encoding="utf-8") as f:
            old, new = _hunk(f.read())
        src = inspect.getsource(orig)
        assert src.count(old) == 1, "fix.diff does not apply to this SGLang"
        ns = {}
        exec(compile(textwrap.dedent(src.replace(old, new)), "<fixed update_finish_state>",
                     "exec"), schedule_batch.__dict__, ns)
        schedule_batch.Req.update_finish_state = ns["update_finish_state"]
    yield
    schedule_batch.Req.update_finish_state = orig


def _req(max_new_tokens, stop):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams
    sp = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=set(stop) or None,
                        temperature=0.0)
    sp.normalize(None)
    sp.verify(64)
    req = Req("r0", None, array("q", [28, 16]), sp, vocab_size=64)
    req.output_ids.append(17)
    req.update_finish_state(1)
    return req


def _sent(req):
    if req.finished_len is None:
        req.finished_len = len(req.output_ids)
    return list(req.output_ids_through_stop)


def test_an_abort_keeps_the_output_cut_at_the_stop_token():
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    req = _req(20, {10})
    req.to_finish = FINISH_ABORT()
    req.output_ids.extend([2, 10, 9])
    req.update_finish_state(3)
    assert type(req.finished_reason).__name__ == "FINISH_ABORT"
    assert _sent(req) == [17, 2, 10]


def test_an_abort_keeps_the_output_within_max_new_tokens():
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    req = _req(2, ())
    req.to_finish = FINISH_ABORT()
    req.output_ids.extend([2, 10, 9])
    req.update_finish_state(3)
    assert _sent(req) == [17, 2]


def test_an_abort_without_a_stop_or_cap_in_the_run_keeps_the_run():
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    req = _req(20, {5})
    req.to_finish = FINISH_ABORT()
    req.output_ids.extend([2, 10, 9])
    req.update_finish_state(3)
    assert type(req.finished_reason).__name__ == "FINISH_ABORT"
    assert _sent(req) == [17, 2, 10, 9]


def test_the_standalone_reproduction_agrees():
    assert repro.sent_tokens(abort=True) [1] == repro.sent_tokens(abort=False)[1]

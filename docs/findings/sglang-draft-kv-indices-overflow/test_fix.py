"""The fix for this finding, tested: with every draft step's own entries counted in the
row width, the kernel's stores stay inside each step's row and inside the buffer.

Against the installed SGLang 0.5.23 the test fails (the bug). With
``SGLANG_FINDING_APPLY_FIX=1`` it applies ``fix.diff``'s change of
``draft_kv_indices_buffer_width`` to a local copy of the function (SGLang's own source,
edited in memory, never written back); the launch passes the draft steps to it as the
diff's ``TritonMultiStepDraftBackend`` callers do:

    TRITON_INTERPRET=1 python -m pytest docs/findings/sglang-draft-kv-indices-overflow/test_fix.py
    TRITON_INTERPRET=1 SGLANG_FINDING_APPLY_FIX=1 python -m pytest docs/findings/sglang-draft-kv-indices-overflow/test_fix.py

Imports SGLang and pytest only.
"""
import inspect
import os
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import repro  # noqa: E402  (this finding's standalone reproduction, beside this file)


def _function(diff: str, side: str) -> str:
    """``draft_kv_indices_buffer_width`` as one side of the diff's first hunk has it
    (``-``: before, ``+``: after)."""
    body = diff.split("@@", 2)[2].split("\n", 1)[1]
    lines = [line[1:] for line in body.splitlines() if line[:1] in (" ", side)]
    text = "\n".join(lines)
    start = text.index("def draft_kv_indices_buffer_width(")
    end = text.index("\ndef ", start + 1)
    return text[start:end].rstrip() + "\n"


@pytest.fixture(scope="module", autouse=True)
def engine():
    repro.stand_in_for_torchvision()
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1 on a CPU"
    from sglang.srt.speculative import spec_utils
    orig = spec_utils.draft_kv_indices_buffer_width
    if os.environ.get("SGLANG_FINDING_APPLY_FIX") == "1":
        with open(os.path.join(HERE, "fix.diff"), encoding="utf-8") as f:
            diff = f.read()
        assert inspect.getsource(orig).rstrip() == _function(diff, "-").rstrip(), \
            "fix.diff does not apply to this SGLang"
        ns = {}
        exec(compile(textwrap.dedent(_function(diff, "+")),
                     "<fixed draft_kv_indices_buffer_width>", "exec"), spec_utils.__dict__, ns)
        spec_utils.draft_kv_indices_buffer_width = ns["draft_kv_indices_buffer_width"]
    yield
    spec_utils.draft_kv_indices_buffer_width = orig


@pytest.mark.parametrize("steps,short", [(4, 3), (3, 1), (5, 0)])
def test_each_draft_step_stores_inside_its_row(steps, short):
    rows, guard = repro.launch(seq_len=repro.CONTEXT - short, steps=steps)
    width = len(rows[0])
    assert all(repro.CONTEXT - short + i + 1 <= width for i in range(steps))
    assert guard == [-1] * 8, f"stored past the buffer: {guard}"

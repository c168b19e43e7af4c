"""``watch(device="cuda")`` on a GPU: PyTorch's trace callbacks reach the tracker, the
catalogue's verdicts equal the CPU shim's, and leaving unregisters everything."""
import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest

from overlapcheck.watch import catalogue

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAMS = catalogue.load(str(ROOT / "tests" / "watch" / "programs"))
CASES = [pytest.param(p, argv, racy, id=label)
         for p in PROGRAMS for label, argv, racy in p.variants()]


@pytest.mark.parametrize("program, argv, racy", CASES)
def test_program_verdict_on_cuda(program, argv, racy, tmp_path):
    out = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "watch", "--device", "cuda",
                        "--json", str(out), "--", sys.executable, program.path, *argv],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == (1 if racy else 0), p.stderr
    kinds = {r["kind"] for r in json.loads(out.read_text())["races"]}
    if racy:
        assert kinds and kinds <= set(program.kinds), p.stderr
    else:
        assert not kinds, p.stderr


def test_trace_callbacks_reach_the_tracker():
    import torch
    import torch.cuda._gpu_trace as gpu_trace

    from overlapcheck.watch import watch
    before = [list(r.callback_list) for r in vars(gpu_trace).values()
              if hasattr(r, "callback_list")]
    query = torch.cuda.Event.query
    logging.getLogger("overlapcheck.watch").setLevel(logging.ERROR)
    with watch(device="cuda", mode="log") as w:
        tr = w.tracker
        s, done = torch.cuda.Stream(), torch.cuda.Event()
        with torch.cuda.stream(s):
            x = torch.ones(256, device="cuda")
            ptr = x.data_ptr()
        assert s.cuda_stream in tr.stream_ctx  # a context from first use
        assert tr.units[ptr].stream == s.cuda_stream  # allocation, on the current stream
        done.record(s)
        assert tr.event_id(done.cuda_event) in tr.det.events  # event creation and record
        x.record_stream(torch.cuda.current_stream())
        assert tr.units[ptr].pledged == {torch.cuda.current_stream().cuda_stream}
        del x
        assert tr.units[ptr].free_site is not None  # deallocation
        pinned = torch.empty(256, pin_memory=True)
        with torch.cuda.stream(s):
            y = torch.ones(256, device="cuda")
            pinned.copy_(y, non_blocking=True)
        done.record(s)
        done.synchronize()  # event synchronization orders the copy before the read
        pinned.tolist()
    assert w.reports == []
    after = [list(r.callback_list) for r in vars(gpu_trace).values()
             if hasattr(r, "callback_list")]
    assert after == before and torch.cuda.Event.query is query

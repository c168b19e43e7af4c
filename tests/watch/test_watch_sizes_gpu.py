"""The table of ``watch/sized.py`` against the CUDA runtime calls PyTorch really makes:
for each op, whether the host waits inside it (a stream, device or event
synchronization, or a synchronous copy) and whether device work is queued after its
last wait, as PyTorch's profiler records them. ``watch`` decides the same from its
table: no wait, a wait with nothing after it, or a wait with kernels after it."""
import json
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from overlapcheck.watch.mode import argument, plan_of
from sized_inputs import ids as _ids, mask as _mask, ngrams as _ngrams, rows as _rows

pytestmark = pytest.mark.gpu

SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "cudaMemcpy", "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize"}
WORK = ("cudaLaunch", "cuLaunch", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy2DAsync")


def _put(vals, key, value):
    vals[key] = value


CASES = [
    ("nonzero", lambda: (_ids(),), lambda x: x.nonzero()),
    ("nonzero strided", lambda: (_rows(),), lambda x: x.t().nonzero()),
    ("argwhere", lambda: (_ids(),), torch.argwhere),
    ("where(cond)", lambda: (_mask(),), torch.where),
    ("x[mask]", lambda: (_rows(), _mask()), lambda v, m: v[m]),
    ("x[host mask]", lambda: (_rows(), torch.tensor([True, False, True, True])),
     lambda v, m: v[m]),
    ("x[host index]", lambda: (_rows(), torch.tensor([2, 0])), lambda v, i: v[i]),
    ("x[device index]", lambda: (_rows(), torch.tensor([2, 0], device="cuda")),
     lambda v, i: v[i]),
    ("masked_select", lambda: (_ids()[:4], _mask()), torch.masked_select),
    ("x[mask] = y", lambda: (_rows(), _mask(), torch.ones(3, 2, device="cuda")), _put),
    ("x[mask] = scalar", lambda: (_rows(), _mask(), 0.0), _put),
    ("x[index] = scalar", lambda: (_rows(), torch.tensor([1, 3], device="cuda"), 5.0), _put),
    ("x[index] = y", lambda: (_rows(), torch.tensor([1, 3], device="cuda"),
                              torch.ones(2, 2, device="cuda")), _put),
    ("unique", lambda: (_ids(),), torch.unique),
    ("unique all", lambda: (_ids(),),
     lambda x: torch.unique(x, return_inverse=True, return_counts=True)),
    ("unique bool", lambda: (_mask(),), lambda x: torch.unique(x, return_inverse=True)),
    ("unique_consecutive", lambda: (_ids(),),
     lambda x: torch.unique_consecutive(x, return_counts=True)),
    ("unique(dim=0)", lambda: (_ngrams(),),
     lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True)),
    ("unique_consecutive(dim=0)", lambda: (_ngrams(),),
     lambda x: torch.unique_consecutive(x, dim=0)),
    ("repeat_interleave", lambda: (torch.tensor([2, 1, 3], device="cuda"),),
     torch.repeat_interleave),
    ("repeat_interleave(output_size=)", lambda: (torch.tensor([2, 1, 3], device="cuda"),),
     lambda r: torch.repeat_interleave(r, output_size=6)),
    ("bincount", lambda: (_ids(),), torch.bincount),
    ("bincount weights", lambda: (_ids(), torch.ones(5, device="cuda")), torch.bincount),
    ("item", lambda: (_ids(),), lambda x: x[2].item()),
    ("equal", lambda: (_ids(), _ids()), torch.equal),
    ("equal, other shapes", lambda: (_ids(), _mask()), torch.equal),
    ("nonzero_static", lambda: (_ids(),), lambda x: torch.nonzero_static(x, size=2)),
]


class _Decisions(TorchDispatchMode):
    """Each op's name and what ``watch``'s table says of it (``WatchMode`` asks the same)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        plan = plan_of(func)
        wait = None
        if plan.wait is not None:
            wait = plan.wait(lambda n: argument(plan, args, kwargs, n), lambda t: t.is_cuda)
        self.ops.append((plan.name, plan.inert, wait))
        return func(*args, **kwargs)


def _expected(make, op) -> str:
    """``watch``'s verdict: "no wait", "nothing after the wait" or "work after the wait"."""
    mode = _Decisions()
    ins = make()
    with mode:
        op(*ins)
    waits = [i for i, (_, _, w) in enumerate(mode.ops) if w is not None]
    if not waits:
        return "no wait"
    last = waits[-1]
    w = mode.ops[last][2]
    after = bool(w.reads or w.returns != frozenset() or w.writes_after) or any(
        not inert for _, inert, _ in mode.ops[last + 1:])
    return "work after the wait" if after else "nothing after the wait"


def _observed(make, op, tmp_path) -> tuple:
    """The same verdict from the CUDA runtime calls the profiler records, and the calls."""
    from torch.profiler import ProfilerActivity, profile, record_function
    ins = make()
    op(*make())  # warm up: modules loaded, pools grown
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("case"):
            op(*ins)
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    case = next(e for e in events if e.get("name") == "case")
    lo, hi = case["ts"], case["ts"] + case["dur"]
    calls = sorted((e["ts"], e["name"]) for e in events
                   if e.get("cat") in ("cuda_runtime", "cuda_driver") and lo <= e["ts"] <= hi)
    kinds = [("sync" if n in SYNCS else "work" if n.startswith(WORK) else None, n)
             for _, n in calls]
    seq = [k for k, _ in kinds if k]
    if "sync" not in seq:
        verdict = "no wait"
    else:
        last = len(seq) - 1 - seq[::-1].index("sync")
        verdict = "work after the wait" if "work" in seq[last + 1:] else "nothing after the wait"
    return verdict, [n for _, n in calls]


@pytest.mark.parametrize("make, op", [pytest.param(c[1], c[2], id=c[0]) for c in CASES])
def test_watch_waits_where_cuda_waits(make, op, tmp_path):
    seen, calls = _observed(make, op, tmp_path)
    if not calls:
        pytest.skip("the profiler recorded no CUDA runtime calls here")
    log = os.environ.get("OVERLAPCHECK_WAITS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"case": os.environ.get("PYTEST_CURRENT_TEST", "?"),
                                "observed": seen, "calls": calls}) + "\n")
    assert _expected(make, op) == seen, calls

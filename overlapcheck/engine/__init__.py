"""The spec-v2 overlap reference engine.

``Engine(cfg, rt, model, observer=None).run(workload)`` runs a workload on a device
runtime (``overlapcheck.device.make_runtime``). Module map:

* ``config``: ``EngineConfig``; ``types``: requests, batches, states;
* ``memory``: paged KV pool with ownership ledger, request-pool rows;
  ``accounting``: moves memory between requests (and tells the runtime and observer);
* ``scheduler``: admission, chunked prefill, decode reserve, retraction;
* ``buffers``: device state (streams, KV, table, FutureMap, pinned buffers);
  ``kernels``: device closures; ``drafts``: draft kinds; ``worker``: one batch's launch
  and result collection;
* ``loop``: the engine step (overlap and non-overlap); ``events``: observer events and
  snapshots; ``results``: run results; ``workload``: workloads; ``command``: ``overlapcheck run``;
* ``tp``: tensor-parallel logical ranks on the sim (``make_engine`` picks the engine
  for a config); ``dist``: real ranks over ``torch.distributed`` (``run --dist``).
"""
from .config import EngineConfig
from .events import Snapshot
from .results import RequestResult, RunResult, Summary
from .types import RequestSpec
from .workload import AbortAt, Workload, WorkloadError, generate, load, parse

# the engine itself needs torch: imported on first use, so that `overlapcheck --help`
# and usage errors answer at once
_LAZY = {"Engine": "loop", "EngineStuck": "loop", "TPEngine": "tp", "make_engine": "tp"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["Engine", "EngineConfig", "EngineStuck", "RequestSpec", "Workload", "AbortAt",
           "WorkloadError", "RunResult", "RequestResult", "Summary", "Snapshot",
           "generate", "load", "parse", "run_workload", "TPEngine", "make_engine"]


def run_workload(cfg: EngineConfig, workload: Workload, device: str = "sim", seed: int = 0,
                 strategy: str = "random", detect: bool = True, access: str = "declared",
                 observer=None, model=None) -> RunResult:
    """Build a runtime and an engine, run ``workload``; the runtime's race reports are
    counted in the summary (``rt`` itself is not returned: see ``Engine`` for that)."""
    from fake_models import make_model
    from ..device import make_runtime
    from .tp import make_engine
    rt = make_runtime(device, seed=seed, strategy=strategy, detect=detect, access=access)
    eng = make_engine(cfg, rt, model if model is not None else make_model(cfg.model), observer)
    return eng.run(workload)

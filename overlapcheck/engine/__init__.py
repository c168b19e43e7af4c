"""The spec-v2 overlap reference engine, one target among three.

``Engine(cfg, rt, model, observer=None).run(workload)`` runs a workload on a device
runtime (``overlapcheck.device.make_runtime``). It speaks the protocol
(``overlapcheck.protocol``: request specs, workloads, events, results) and imports
nothing of the checkers. Module map:

* ``config``: ``EngineConfig``; ``types``: live requests and batches;
* ``memory``: paged KV pool with ownership ledger, request-pool rows;
  ``accounting``: moves memory between requests (and tells the runtime and observer);
* ``scheduler``: admission, chunked prefill, decode reserve, retraction;
* ``buffers``: device state (streams, KV, table, FutureMap, pinned buffers);
  ``kernels``: device closures; ``drafts``: draft kinds; ``worker``: one batch's launch
  and result collection;
* ``loop``: the engine step (overlap and non-overlap);
* ``tp``: tensor-parallel logical ranks on the sim (``make_engine`` picks the engine
  for a config); ``dist``: a real rank over ``torch.distributed`` (``run --dist``);
* ``faults``: the bug zoo, named guarded sites; ``target``: the engine as a target
  (``ReferenceTarget``).

Runs with checkers go through ``overlapcheck.run``.
"""
from .config import EngineConfig

# the engine itself needs torch: imported on first use, so that `overlapcheck --help`
# and usage errors answer at once
_LAZY = {"Engine": "loop", "TPEngine": "tp", "make_engine": "tp"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["Engine", "EngineConfig", "TPEngine", "make_engine"]

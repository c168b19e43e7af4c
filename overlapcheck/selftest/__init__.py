"""``overlapcheck selftest``: the detector proven on a catalogue of planted races.

Each planted race mirrors a real overlap-scheduling bug (a FutureMap read without its
event, a pinned accept-length buffer read before copy-done, a recycled request-pool row
rewritten without the WAR barrier, an index tensor freed without ``record_stream``, ...)
and has a correctly synchronized twin. The selftest passes when every planted race is
flagged and no twin is, under every sim schedule (and, on cuda, with PyTorch's CUDA
sanitizer's verdict on the stream<->stream cases alongside).

Modules: ``cases`` (the catalogue and its registry), ``progs_*`` (the programs),
``runner`` (runs and judges cases), ``sanitizer`` (one PyTorch CUDA sanitizer
subprocess per case), ``command`` (the CLI).
"""
from __future__ import annotations

__all__ = ["Case", "Verdict", "catalogue", "run_case", "run_catalogue"]


def __getattr__(name):  # keep `import overlapcheck.selftest` free of torch
    if name in ("Case", "catalogue"):
        from . import cases
        return getattr(cases, name)
    if name in ("Verdict", "run_case", "run_catalogue"):
        from . import runner
        return getattr(runner, name)
    raise AttributeError(name)

"""``watch``: the happens-before race detector over unmodified ``torch.cuda`` code.

    with watch(device="cpu", mode="log") as w:
        my_engine_step()
    for r in w.reports:
        print(r)

On entry the context installs its sources of facts (the GPU trace callbacks, or the
CPU shim), the host accessors and the dispatch mode; on exit it removes them all,
whatever happened inside. Modes:

* ``raise`` (default): the access that completes a race raises ``RaceFound`` at the
  user's line; a race seen again at the same two lines is counted, not raised again;
* ``log``: every new race is logged (logger ``overlapcheck.watch``, warning level)
  and collected in ``reports``; the program runs on;
* ``collect``: every new race is collected in ``reports`` and passed to
  ``on_report`` (a driver that reports them itself, e.g. as findings); nothing is
  logged and the program runs on.

``user_roots`` (directories) narrows whose lines a report names to the files under
them (an engine's package run by a driver): by default every frame outside torch,
Python's library and overlapcheck's watch package is the user's.

An exception raised by the watched code leaves the context unchanged, with the
races found so far added to it as a note. ``json_path`` writes the JSON report on
exit (``to_json()``).
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from .backends import MODES, check_device
FORMAT_VERSION = 1

log = logging.getLogger("overlapcheck.watch")


class RaceFound(Exception):
    """Raised in ``raise`` mode at the access that completes a race."""

    def __init__(self, report):
        super().__init__("overlapcheck watch found a race:\n" + str(report))
        self.report = report


def resolve_device(device: str) -> str:
    """``auto`` -> a GPU backend when a GPU is usable, else the CPU shim; checks the name
    (``ValueError``) and that a GPU backend has its GPU (``RuntimeError``)."""
    import torch
    from .backends import resolve
    return resolve(device, torch.cuda.is_available()).name


class Watch:
    """The context manager behind ``watch(...)``."""

    def __init__(self, device: str = "auto", mode: str = "raise",
                 json_path: Optional[str] = None, user_roots: Tuple[str, ...] = (),
                 on_report: Optional[Callable[[object], None]] = None):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
        check_device(device)
        self.requested = device
        self.device: Optional[str] = None
        self.mode = mode
        self.json_path = json_path
        self.user_roots = tuple(user_roots)
        self.on_report = on_report
        self.reports: List = []
        self._by_key: Dict[tuple, object] = {}
        self.raised = 0
        self.tracker = None
        self._mode = None
        self._backend = None
        self._patcher = None

    # -- entering and leaving ------------------------------------------------------------
    def __enter__(self) -> "Watch":
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        from .host import install_host_accessors
        from .mode import WatchMode
        from .patching import Patcher
        from .report import Explainer
        from .tracker import Tracker

        if any(isinstance(m, WatchMode) for m in _get_current_dispatch_mode_stack()):
            raise RuntimeError("overlapcheck watch contexts do not nest")
        self.device = resolve_device(self.requested)
        from .frames import Frames
        self.tracker = Tracker(self._on_report, Frames(self.user_roots))
        self._explainer = Explainer(self.tracker)
        self._patcher = Patcher()
        from .backends import BACKENDS, build
        self._backend = build(BACKENDS[self.device], self.tracker)
        try:
            self._backend.install(self._patcher)
            install_host_accessors(self._patcher, self._backend, self.tracker)
            self._mode = WatchMode(self._backend, self.tracker)
            self._mode.__enter__()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._close()
        if self.json_path:
            self.write_json(self.json_path)
        if isinstance(exc, Exception) and not isinstance(exc, RaceFound) and self.reports:
            _add_note(exc, self.note())
        return False

    def _close(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
        if self._backend is not None:
            self._backend.uninstall()
        if self.tracker is not None:
            self.tracker.close()
        if self._patcher is not None:
            self._patcher.restore()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The block is not the watched program's (a driver reading the program's
        state between its steps): its ops and host reads are not accesses, and
        ``tolist``/``numpy`` read device memory in place, as a debugger would."""
        if self.tracker is None or self.tracker.paused:
            yield
            return
        from torch.utils._python_dispatch import _disable_current_modes
        self.tracker.paused = True
        try:
            with _disable_current_modes():
                yield
        finally:
            self.tracker.paused = False

    # -- reports -------------------------------------------------------------------------
    def _on_report(self, race, unit, frame, view=None) -> None:
        __tracebackhide__ = True  # pytest shows the user's line, not ours
        report = self._explainer.explain(race, unit, frame, view)
        seen = self._by_key.get(report.key)
        if seen is not None:
            seen.merge(report)
            return
        self._by_key[report.key] = report
        self.reports.append(report)
        if self.mode == "raise":
            self.raised += 1
            raise RaceFound(report)
        if self.mode == "collect":
            if self.on_report is not None:
                self.on_report(report)
            return
        log.warning("%s", report)

    def note(self) -> str:
        n = len(self.reports)
        first = str(self.reports[0]) if n else ""
        return (f"overlapcheck watch found {n} race{'s' if n != 1 else ''} before this "
                f"exception; the first:\n{first}")

    def summary(self) -> dict:
        tr = self.tracker
        return {"races": len(self.reports), "occurrences": sum(r.count for r in self.reports),
                "tensors": sum(r.tensors for r in self.reports),
                "ops": tr.ops if tr else 0, "accesses": tr.det.accesses if tr else 0,
                "streams": len(tr.stream_ctx) if tr else 0}

    def to_json(self) -> dict:
        return {"overlapcheck_watch": FORMAT_VERSION, "device": self.device,
                "mode": self.mode, "races": [r.to_json() for r in self.reports],
                "summary": self.summary()}

    def write_json(self, path: str) -> None:
        """Write the JSON report atomically (a reader sees the old file or the whole new
        one, and no temporary file is left behind)."""
        from ..repro.format import write_atomic
        write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")


def _add_note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:  # Python 3.10: kept on the exception, shown by tools that know __notes__
        exc.__notes__ = [*getattr(exc, "__notes__", []), text]


def watch(device: str = "auto", mode: str = "raise", json_path: Optional[str] = None,
          user_roots: Tuple[str, ...] = (),
          on_report: Optional[Callable[[object], None]] = None) -> Watch:
    """Watch the ``torch.cuda`` code run inside the ``with`` block for races.

    ``device``: ``cuda`` (a GPU, PyTorch's GPU trace callbacks), ``cpu`` (the CPU
    shim: the same verdicts without a GPU) or ``auto``. ``mode``: ``raise``, ``log``
    or ``collect`` (``on_report`` gets each new race). ``json_path``: where to write
    the JSON report on exit. ``user_roots``: whose lines reports name."""
    return Watch(device, mode, json_path, user_roots, on_report)

"""Stopping a campaign from outside: SIGINT (Ctrl-C) and SIGTERM.

The first signal asks the campaign to stop: it ends as at the end of its time box (the
example in flight is dropped), prints its summary, and keeps every finding, which is
on disk already (docs/design.md §6.5). A second one exits at once (128 + the signal),
ending the workers of ``-j N`` first. Handlers are installed by the ``fuzz`` command in
its main thread and restored when it returns.
"""
from __future__ import annotations

import os
import signal
from typing import Callable, Dict, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """``stop()``: the name of the signal that asked the campaign to stop, or None.
    ``on_exit``: called before a second signal exits the process (ends the workers)."""

    def __init__(self):
        self.reason: Optional[str] = None
        self.signum = 0
        self.on_exit: Optional[Callable[[], None]] = None
        self._saved: Dict[int, object] = {}

    def __call__(self) -> Optional[str]:
        return self.reason

    def __enter__(self) -> "Stop":
        for sig in SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.reason is not None:
            _say(f"fuzz: {name} again: exiting now; the repros written so far are kept")
            if self.on_exit is not None:
                try:
                    self.on_exit()
                finally:
                    os._exit(128 + signum)
            os._exit(128 + signum)
        self.reason, self.signum = name, signum
        _say(f"fuzz: {name}: stopping; the summary follows and every finding is kept "
             f"({'Ctrl-C' if signum == signal.SIGINT else name} again to exit at once)")


def _say(line: str) -> None:
    # os.write: a handler may run while the main thread is inside a print to stderr
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass

"""Target faults: public, fixed SGLang bugs re-created against 0.5.23 (filled below)."""
from __future__ import annotations

import contextlib

FAULTS: dict = {}


@contextlib.contextmanager
def applied(names, session):
    yield

"""Invariant checkers: pure consumers of the engine's observer events and snapshots.

``make_checkers(names, **context)`` builds checkers by name (``REGISTRY``); feed each
event to every checker (``feed_all``) and call ``finish()`` at the end. The run driver
(``overlapcheck.run``) does both as the engine's observer. Module map: ``base``
(Violation, Checker, registry), one module per checker (``kv_accounting``,
``kv_lifetime``, ``kv_canary``, ``stream_race``, ``parity``, ``metrics``,
``no_hidden_sync``, ``lifecycle``, ``liveness``, ``rank_agreement``), ``runlog``
(JSON-lines run logs), ``leaks`` (the leak report), ``text`` (message helpers).
"""
from .base import (REGISTRY, Checker, Violation, checker_class, feed_all, make_checkers,
                   names_for)

__all__ = ["REGISTRY", "Checker", "Violation", "checker_class", "feed_all", "make_checkers",
           "names_for"]

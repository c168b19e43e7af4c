"""The shared checkers: pure consumers of the protocol's events and snapshots
(``overlapcheck.protocol.events``), whichever target emits them.

``make_checkers(names, **context)`` builds checkers by name (``REGISTRY``: these and
every target's own, ``Target.checkers``); feed each event to every checker
(``feed_all``) and call ``finish()`` at the end. The run driver (``overlapcheck.run``)
does both as the target's observer. Module map: ``base`` (Violation, Checker, the
registry), one module per checker (``kv_accounting``, ``kv_lifetime``, ``kv_canary``,
``stream_race``, ``parity``, ``metrics``, ``no_hidden_sync``, ``lifecycle``,
``liveness``, ``rank_agreement``, ``host_race``; the oracles ``golden``,
``accept_oracle``, ``kv_backup``, ``runtime_memory``), ``runlog`` (JSON-lines run
logs), ``leaks`` (the leak report), ``text`` (message helpers).
"""
from .base import (REGISTRY, SHARED, Checker, Violation, checker_class, feed_all,
                   make_checkers, names_for)

__all__ = ["REGISTRY", "SHARED", "Checker", "Violation", "checker_class", "feed_all",
           "make_checkers", "names_for"]

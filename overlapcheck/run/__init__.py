"""The run driver: one way to run a case, used by every command, the pytest plugin
and the benches.

* ``Case``/``ScheduleSpec``: a run as data (target, config, workload, schedule,
  checkers, faults); its findings are ``protocol.Finding``s;
* ``execute(case, choices=None, **options) -> Outcome``: run it with the checkers on
  (``choices``: replay recorded decisions exactly); ``run_checked`` builds the case of
  a reference-engine config and workload; ``reference_run``: parity's reference
  (``References``: those a caller keeps across runs);
  ``run_workload``: the reference engine on a workload with no checker;
* ``Monitor``: the observer that feeds checkers (``Halt`` when a fatal one reports).
"""
from .case import SCHEMA, Case, CaseError, ScheduleSpec

__all__ = ["Case", "CaseError", "ScheduleSpec", "SCHEMA",
           "Outcome", "execute", "run_checked", "reference_run", "run_workload", "digest_of",
           "Monitor", "Halt", "References"]

# running a case needs the engine (torch): imported on first use, so that repro files
# load and validate, and the command line answers, without it
_LAZY = {"Outcome": "driver", "execute": "driver", "run_checked": "driver",
         "reference_run": "driver", "References": "driver", "run_workload": "driver", "digest_of": "driver", "Monitor": "monitor",
         "Halt": "monitor"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The fuzzer: Hypothesis strategies for cases, one-case execution, campaigns."""
from .case import Case, CaseError, ScheduleSpec
from .finding import ENGINE_EXCEPTION, Finding

__all__ = ["Case", "CaseError", "ScheduleSpec", "Finding", "Outcome", "run_case",
           "ENGINE_EXCEPTION"]


def __getattr__(name: str):
    # running a case needs the engine (torch): imported on first use
    if name in ("Outcome", "run_case"):
        from . import execute
        return getattr(execute, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

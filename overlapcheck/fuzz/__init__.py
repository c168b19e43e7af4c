"""The fuzzer: Hypothesis strategies for cases, one-case execution, campaigns."""
from .case import Case, CaseError, ScheduleSpec
from .execute import ENGINE_EXCEPTION, Finding, Outcome, run_case

__all__ = ["Case", "CaseError", "ScheduleSpec", "Finding", "Outcome", "run_case",
           "ENGINE_EXCEPTION"]

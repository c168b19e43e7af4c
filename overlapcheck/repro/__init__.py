"""Repro files: dump, safe load with validation, exact replay, trace export."""
from .format import Repro, ReproError, load, loads, save
from .replay import DIVERGED, FIXED, REPRODUCED, emit_pytest, replay

__all__ = ["Repro", "ReproError", "load", "loads", "save", "replay", "emit_pytest",
           "REPRODUCED", "FIXED", "DIVERGED"]

"""Happens-before race detection, independent of any runtime API."""
from .clocks import HOST, Clock, CtxId
from .detector import Detector
from .report import KINDS, Access, OpInfo, RaceReport, rows_text

__all__ = ["HOST", "Clock", "CtxId", "Detector", "KINDS", "Access", "OpInfo",
           "RaceReport", "rows_text"]

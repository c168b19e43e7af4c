"""The protocol: what every target, checker and the run driver speak, apart from any
one engine.

* ``types``: request ids, states and their legal moves, finish reasons, sampling
  modes, batch kinds; ``RequestSpec``;
* ``events``: the observer events and the per-step ``Snapshot`` a target emits;
* ``canary``: the KV canary record's layout; ``digest``: the positional token digest
  (the canary's and the oracle models' one rule);
* ``workload``: workloads (generated, or YAML) and ``WorkloadError``;
* ``results``: what a run returns (``RunResult``);
* ``target``: the ``Target``/``Session`` interface, the ``Chooser`` recording a
  target's decisions, ``TargetUnavailable``, ``EngineStuck``;
* ``finding``: a finding named by (checker, site), its stable id.

The protocol imports nothing of the engine, the checkers, the targets, the fuzzer or
the run driver (``tests/test_layering.py``), and no torch: a repro loads and a checker
reads events without any engine.
"""
from .finding import ENGINE_EXCEPTION, Finding
from .results import RequestResult, RunResult, Summary
from .target import Chooser, EngineStuck, Session, Target, TargetUnavailable
from .types import RequestSpec
from .workload import AbortAt, Workload, WorkloadError, generate, load, parse

__all__ = ["ENGINE_EXCEPTION", "Finding", "RequestResult", "RunResult", "Summary", "Chooser",
           "EngineStuck", "Session", "Target", "TargetUnavailable", "RequestSpec", "AbortAt",
           "Workload", "WorkloadError", "generate", "load", "parse"]

"""What every target shares: the interface the run driver drives, the choice recorder
that makes a target's runs replayable, and the two ways a run can fail to start or end.

A *target* is an engine overlapcheck drives and observes. The reference engine is
one; real engines (vLLM, SGLang) are others, each behind an adapter with a fake
model. The run driver (``overlapcheck.run``) treats them alike:

    target = targets.get(case.target)          # TargetUnavailable: one line
    session = target.open(config, strategy, observer, faults=case.faults, **options)
    result = session.run(workload)              # a RunResult, or an exception

A target:

* turns a workload (``protocol.workload.Workload``: arrivals by step with prompt,
  max_new_tokens, stop ids, sampling seed; aborts by step) into calls of the engine
  it wraps, one host *step* at a time;
* calls ``observer(event)`` with ``protocol.events`` events, so the checkers read its
  state without knowing which engine it is: ``Arrived``, ``Scheduled``,
  ``Allocated``/``Freed`` (KV blocks, named by block id), ``Prefilled``/``Verified``
  (tokens appended to a request), ``Finished``, ``Aborted``, ``Retracted``
  (preemption), ``Stalled`` (before raising ``EngineStuck``), ``StepEnd`` with a
  ``Snapshot`` of its own state after every step, ``RunEnd``;
* takes every nondeterministic decision (when an in-flight result is applied, how
  deep the pipeline is) from ``strategy`` through a ``Chooser``, so that
  ``Replay(choices)`` reruns exactly; everything else comes from the seed;
* raises ``EngineStuck`` when its step bound runs out;
* lists its own checkers (``checkers``: those that read its own events or context;
  the shared ones of ``invariants`` read the events above) and its faults
  (``faults()``: ``overlapcheck.faults.Fault``s).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence


class EngineStuck(RuntimeError):
    """The run exceeded its step bound (a request that never ends)."""


class TargetUnavailable(RuntimeError):
    """The target's engine is missing or of another version; the message is one line
    naming the command that installs the pinned version."""


class Chooser:
    """A target's choice points, recorded. At each point the target offers its ready
    *lanes* (named pieces of pending work, such as ``"output"``: apply the oldest
    in-flight result); ``point(ready)`` returns the index of the lane to advance, or
    -1 to advance none. ``forced`` points must advance one (the engine cannot go on
    otherwise). Decisions with more than one option are recorded in ``choices``, the
    same way the simulated device records its own. ``strategy``: a schedule strategy
    (``overlapcheck.device.sched.Strategy``: ``new_point()``, ``choose(n, lanes,
    forced)``)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.choices: List[int] = []

    def point(self, ready: Sequence[str], forced: bool = False) -> int:
        self.strategy.new_point()
        n = len(ready) if forced else len(ready) + 1
        if n <= 0:
            return -1
        if n == 1:
            return 0 if forced else -1
        c = self.strategy.choose(n, list(ready), forced)
        if not 0 <= c < n:
            raise ValueError(f"strategy returned decision {c} of {n}")
        self.choices.append(c)
        return c if forced else c - 1


class Session:
    """One run of a target.

    * ``iteration``: host steps so far;
    * ``choices``: the decisions taken (``Replay(choices)`` reruns them);
    * ``retired``: ``(lane, op name, clock)`` of device work in the order it ran, for
      traces and the run's digest (empty where the target has no device model);
    * ``clock``: a logical clock for trace marks (the sim's host-call count);
    * ``races``: race reports of the target's runtime (none without a detector);
    * ``engine``/``runtime``: the objects it drives, for tests that look inside."""

    engine = None
    runtime = None
    iteration = 0
    clock = 0

    @property
    def choices(self) -> List[int]:
        return []

    @property
    def retired(self) -> list:
        return []

    @property
    def races(self) -> list:
        return []

    def run(self, workload, max_steps: Optional[int] = None) -> object:
        """Run ``workload`` to the end; return a ``protocol.results.RunResult``.
        Raises ``EngineStuck`` (after a ``Stalled`` event) past ``max_steps``."""
        raise NotImplementedError

    def close(self) -> None:
        """Undo what the session changed in its engine (a fault's patch); the driver
        calls it however the run ended."""

    def dispose(self) -> None:
        """The run is over and nothing will look at its objects again: break their
        reference cycles so that they are freed at once, not by the cyclic collector
        (the reference engine and its runtime empty themselves); by default nothing."""


class Target:
    """One engine overlapcheck can drive. Subclasses set the class attributes and
    implement ``open`` and the config hooks.

    A target's config is a frozen dataclass validated at construction, with a
    ``max_context`` (the longest prompt + output a request may reach: workloads are
    validated against it)."""

    name = "?"
    package: Optional[str] = None     # the engine's distribution on PyPI
    pinned: Optional[str] = None      # the version the adapter is written for
    install = ""                      # the command that installs it (README's words)
    config_type: type = object        # the config dataclass
    replayable = True                 # choices recorded, ``Replay`` reruns exactly
    #: "module:function" of the fuzzer's case strategy: ``function(checks, faults,
    #: **options)`` gives a Hypothesis strategy of ``Case``s for this target (config,
    #: workload and schedule drawn together, so that shrinking minimizes all three);
    #: ``faults`` are switched on in every case, never drawn; ``options`` narrow the
    #: draw (unknown ones are a ``ValueError``). Named, not imported: the fuzzer
    #: imports it, the target never imports the fuzzer.
    case_strategy = ""
    case_options: tuple = ()          # the keyword options its case strategy takes
    #: the target's own checkers, name -> "module:Class" (imported on first use): those
    #: that read events or context only this target gives. The checker registry
    #: (``invariants.base.REGISTRY``) is the shared checkers plus every target's.
    checkers: Dict[str, str] = {}
    #: its engine's own log lines go to ``targets.logs.path()`` when one is set (a
    #: campaign sets ``--out``/engine-logs): the campaign says where
    engine_logs = False
    #: its runs can audit their launches' declared accesses (``Case.audit``, the run
    #: option ``access="audit"``)
    audits = False
    #: its kernels have host twins the sim runs (``Case.twins``: checked against them)
    twins = False

    def version(self) -> str:
        """The installed engine's version; ``TargetUnavailable`` when it is missing or
        not the pinned one."""
        raise NotImplementedError

    def default_config(self):
        return self.config_type()

    def config_fields(self) -> set:
        return {f.name for f in dataclasses.fields(self.config_type)}

    def config_from_dict(self, d: dict):
        """A validated config (``ValueError`` with one line on bad input)."""
        return self.config_type(**d)

    def config_to_dict(self, cfg) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(cfg).items()}

    def reference_config(self, cfg):
        """The config of parity's reference run: the same engine without overlap
        (synchronous), no fault."""
        raise NotImplementedError

    def faults(self) -> dict:
        """name -> ``overlapcheck.faults.Fault`` of the faults this target can switch on
        (listing them needs no engine installed)."""
        return {}

    def check_faults(self, names) -> None:
        """``ValueError`` (one line, listing the valid names) for an unknown fault."""
        known = self.faults()
        for n in names:
            if n not in known:
                raise ValueError(f"unknown fault {n!r} for target {self.name} (choose from "
                                 f"{', '.join(sorted(known)) or 'none'})")

    def checker_context(self, cfg) -> dict:
        """What this target's checkers need beyond the events (offered to every checker,
        e.g. a golden model, or parity's options)."""
        return {}

    def reference_device(self, cfg, device: str, model=None) -> Optional[str]:
        """The device the references of a run on ``device`` (parity's reference run, a
        golden model) must compute on, when not their default: None (the default)."""
        return None

    def straight_runtime(self):
        """A runtime of the target's default device that runs parity's reference run
        (eager, no detector, no trace, no observer) straight through, with the same
        result as the default device's (``run.driver.reference_run``); None: none."""
        return None

    def check_workload(self, workload, cfg) -> None:
        """``protocol.workload.WorkloadError`` (one line) when ``workload`` does not fit
        ``cfg`` beyond its ``max_context`` (which every workload is parsed against)."""

    def generate(self, seed: int, n: int, cfg):
        """A seeded workload of ``n`` requests that fits ``cfg`` (``overlapcheck run``)."""
        from .workload import generate
        return generate(seed, n, cfg)

    def open(self, cfg, strategy, observer: Optional[Callable[[object], None]],
             faults: Sequence[str] = (), **options) -> Session:
        """A session running ``cfg`` with ``faults`` on, its decisions taken from
        ``strategy``, its events sent to ``observer``. ``options`` are the driver's
        run options; every target takes ``device`` (the device backend: a target
        without a device model runs as on ``sim`` and refuses a GPU one), ``detect``
        (a race detector, where the target has one) and ``trace`` (record the device
        work, where there is any), and raises ``ValueError`` for an option it
        cannot honour."""
        raise NotImplementedError

"""A fuzz case: everything one run needs, as plain data.

A ``Case`` is a target (the reference engine unless said otherwise), its
configuration, a workload, a schedule, the checkers to run and the faults to switch
on. It round-trips through plain dicts (``to_dict``/``from_dict``), which is what a
repro file stores; ``from_dict`` validates and raises ``CaseError`` (one line) on bad
input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .. import seeds
from ..device.sched import STRATEGIES, Stalls, Strategy, make_strategy
from ..protocol import Workload, WorkloadError
from ..protocol import workload as W

SCHEDULE_KINDS = STRATEGIES + ("stalls",)
SCHEMA = 2      # of the case inside a repro (overlapcheck.repro.format.SCHEMA)


# host memory a request of a run takes at least (its spec, state, output and result, the
# events and checker records about it): what ``--requests N`` and a workload are held to
REQUEST_BYTES = 2048


class CaseError(ValueError):
    """A case (or repro) that does not fit the schema; one line."""


def check_fits(case: "Case") -> None:
    """``CaseError`` naming the field when ``case`` could not fit in this machine's
    memory (its engine's footprint and its requests), before anything is allocated."""
    from ..engine.config import largest_size
    from ..resources import TooLarge, check_fits as fits
    n = len(case.workload.requests)
    footprint = getattr(case.config, "footprint", None)
    try:
        if footprint is not None:
            try:
                fits(footprint(), "its engine")
            except TooLarge as e:
                field = largest_size(case.config)
                raise CaseError(f"config.{field} {getattr(case.config, field)}: {e}") from None
        fits(n * REQUEST_BYTES, f"{n} requests")
    except TooLarge as e:
        raise CaseError(f"workload.requests: {e}") from None


@dataclass(frozen=True)
class ScheduleSpec:
    """How the sim schedules device work: a named strategy with its seed, or explicit
    ``stalls`` (``(stream, first point, end point)``) over the eager schedule."""

    kind: str = "stalls"
    seed: int = 0
    stalls: Tuple[Tuple[str, int, int], ...] = ()

    def make(self) -> Strategy:
        if self.kind == "stalls":
            return Stalls(self.stalls)
        return make_strategy(self.kind, seeds.stream(self.seed, "schedule"))

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "seed": self.seed}
        if self.kind == "stalls":
            d["stalls"] = [list(x) for x in self.stalls]
        return d

    @staticmethod
    def from_dict(d) -> "ScheduleSpec":
        d = _mapping(d, "schedule", {"kind", "seed", "stalls"})
        kind = d.get("kind", "stalls")
        if kind not in SCHEDULE_KINDS:
            raise CaseError(f"schedule.kind: must be one of {', '.join(SCHEDULE_KINDS)}, got {kind!r}")
        seed = _int(d.get("seed", 0), "schedule.seed")
        stalls = d.get("stalls", []) or []
        if not isinstance(stalls, list):
            raise CaseError("schedule.stalls: expected a list of [stream, first, end]")
        out = []
        for i, x in enumerate(stalls):
            if (not isinstance(x, list) or len(x) != 3 or not isinstance(x[0], str)):
                raise CaseError(f"schedule.stalls[{i}]: expected [stream, first, end]")
            out.append((x[0], _int(x[1], f"schedule.stalls[{i}][1]"),
                        _int(x[2], f"schedule.stalls[{i}][2]")))
        return ScheduleSpec(kind, seed, tuple(out))


@dataclass(frozen=True)
class Case:
    """``config`` is the target's config (``EngineConfig`` for the reference engine);
    ``faults`` are switched on for the run (the reference engine's bug zoo, or a
    target's re-created historical bugs)."""

    config: object
    workload: Workload
    schedule: ScheduleSpec = ScheduleSpec()
    checks: Tuple[str, ...] = ()          # empty: every checker that applies
    faults: Tuple[str, ...] = ()
    target: str = "reference"
    # the runtime also infers each declared launch's accesses and reports what its
    # declaration leaves out (``device/audit.py``); a target that audits (``audits``)
    audit: bool = False
    # ``check``: every host-run launch (a kernel's source on numpy views) also runs the
    # kernel on the tensors with the same inputs, and the two must agree
    # (``device/twins.py``); ``off``: the kernels on the tensors only (a target whose
    # kernels have host runs: ``twins = True``)
    twins: str = "run"

    def to_dict(self) -> dict:
        from .. import targets
        d = {"config": targets.get(self.target).config_to_dict(self.config),
             "workload": W.dump(self.workload),
             "schedule": self.schedule.to_dict(),
             "checks": list(self.checks), "faults": list(self.faults)}
        if self.target != "reference":
            d = {"target": self.target, **d}
        if self.audit:        # written only when on: other cases' repros stay as they were
            d["audit"] = True
        if self.twins != "run":
            d["twins"] = self.twins
        return d

    @staticmethod
    def from_dict(d, schema: int = SCHEMA) -> "Case":
        """A validated case. ``schema`` 1 (before targets) also had a ``seed`` field
        that no run read: it is accepted there and ignored."""
        from .. import targets
        allowed = {"target", "config", "workload", "schedule", "checks", "faults", "audit",
                   "twins"}
        d = _mapping(d, "case", allowed | ({"seed"} if schema == 1 else set()))
        for key in ("config", "workload"):
            if key not in d:
                raise CaseError(f"case: missing field {key!r}")
        name = d.get("target", "reference")
        if name not in targets.TARGETS:
            raise CaseError(f"target: unknown target {name!r} (choose from "
                            f"{', '.join(targets.TARGETS)})")
        target = targets.get(name)
        _mapping(d["config"], "config", target.config_fields())
        try:
            cfg = target.config_from_dict(d["config"])
        except (TypeError, ValueError) as e:
            raise CaseError(f"config: {e}") from None
        try:
            wl = W.parse(d["workload"], cfg)
            target.check_workload(wl, cfg)
        except WorkloadError as e:
            raise CaseError(str(e)) from None
        faults = _names(d.get("faults", []), "faults")
        try:
            target.check_faults(faults)
        except ValueError as e:
            raise CaseError(f"faults: {e}") from None
        checks = _names(d.get("checks", []), "checks")
        from invariants.base import check_names
        try:
            check_names(checks)
        except ValueError as e:
            raise CaseError(f"checks: {e}") from None
        audit = d.get("audit", False)
        if not isinstance(audit, bool):
            raise CaseError(f"audit: expected true or false, got {audit!r}")
        if audit and not getattr(target, "audits", False):
            raise CaseError(f"audit: the {name} target does not audit its launches")
        from ..device.twins import TWIN_MODES
        twins = d.get("twins", "run")
        if twins not in TWIN_MODES or not isinstance(twins, str):
            raise CaseError(f"twins: expected one of {', '.join(TWIN_MODES)}, got {twins!r}")
        if twins != "run" and not getattr(target, "twins", False):
            raise CaseError(f"twins: the {name} target has no host twins")
        return Case(cfg, wl, ScheduleSpec.from_dict(d.get("schedule", {})), checks, faults, name,
                    audit, twins)


def _mapping(d, where: str, allowed) -> dict:
    if not isinstance(d, dict):
        raise CaseError(f"{where}: expected a mapping, got {type(d).__name__}")
    unknown = sorted(set(map(str, d)) - set(allowed))
    if unknown:
        raise CaseError(f"{where}: unknown field {unknown[0]!r}")
    return d


def _int(v, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise CaseError(f"{where}: expected a non-negative integer, got {v!r}")
    return v


def _names(v, where: str) -> Tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise CaseError(f"{where}: expected a list of names")
    return tuple(v)

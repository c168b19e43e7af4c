"""The reference engine as a target: overlapcheck's own spec-v2 overlap engine on a
device runtime (``sim`` or ``cuda``), with the bug zoo's faults (``faults.py``), the
fake models' golden reference (``fake_models.golden``) and the fuzzer's case strategy
(``overlapcheck.fuzz.strategies``). Its checkers are the shared ones: every event it
emits is the protocol's."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

from ..device import device_info
from ..protocol.target import Session, Target


class ReferenceSession(Session):
    def __init__(self, engine, runtime):
        self.engine, self.runtime = engine, runtime

    @property
    def iteration(self) -> int:
        return self.engine.iteration

    @property
    def clock(self) -> int:
        return getattr(self.runtime, "calls", 0)

    @property
    def choices(self) -> List[int]:
        return list(self.runtime.choices)

    @property
    def retired(self) -> list:
        return list(getattr(self.runtime, "retired", ()))

    @property
    def races(self) -> list:
        return self.runtime.reports

    def run(self, workload, max_steps: Optional[int] = None, tick=None):
        return self.engine.run(workload, max_steps=max_steps, tick=tick)

    def dispose(self) -> None:
        """Empty the engine and the runtime (their parts point back at them): in a
        campaign the cyclic collector was about 5% of the CPU, nearly all of it spent on
        the graphs of finished runs (docs/design.md §8)."""
        if self.engine is not None:
            self.engine.dispose()
            self.runtime.dispose()
            self.engine = self.runtime = None


class ReferenceTarget(Target):
    name = "reference"
    install = "pip install overlapcheck"
    case_strategy = "overlapcheck.fuzz.strategies:cases"
    case_options = ("models", "draft_kinds", "logical_ranks")
    audits = True
    twins = True

    @property
    def config_type(self):
        from .config import EngineConfig
        return EngineConfig

    def version(self) -> str:
        from .. import __version__
        return __version__

    def reference_config(self, cfg):
        """The standard schedule: non-overlap, one rank, none of the seed variants
        (zero-bubble, verify sync, KV backup), the row-indexed FutureMap, one host
        thread, no prefix cache, no fault."""
        return dataclasses.replace(cfg, overlap=False, tp=1, zero_bubble=False,
                                   verify_sync=False, kv_backup=False, future_map="row",
                                   forward_thread=False, prefix_cache=False, faults=())

    def config_from_dict(self, d: dict):
        """A recorded config; one written before the KV backup's canary existed (no
        ``backup_canary`` field) ran without it, and replays so."""
        return self.config_type(**{"backup_canary": False, **d})

    def faults(self) -> dict:
        from .faults import FAULTS
        return FAULTS

    def checker_context(self, cfg, device: Optional[str] = None) -> dict:
        """The golden reference of the config's model (``fake_models.golden``: on the CPU,
        or on ``device``'s GPU; one per model, row width and device, shared by the runs of
        a process) and the config, for the golden and accept-oracle checkers; whether the
        model's KV carries the canary's tags (``kv_tags``: without them the kv-canary and
        kv-backup checkers have no record to read)."""
        from fake_models import kv_tagged
        from fake_models.golden import shared
        where = "cuda" if device is not None and device_info(device).gpu else "cpu"
        return {"model_golden": shared(cfg.model, cfg.row_width, where), "engine_config": cfg,
                "kv_tags": kv_tagged(cfg.model)}

    def reference_device(self, cfg, device: str, model=None) -> Optional[str]:
        """``device`` when the model's GPU kernels there are not exact (batch invariant
        but not the CPU's bits: ``fake_models.hf.triton_ops``): parity's reference run and
        the golden model then run on it too; else None (the sim and the CPU)."""
        from fake_models.golden import exact_on
        if not device_info(device).gpu or exact_on(model if model is not None else cfg.model, "cuda"):
            return None
        return device

    def straight_runtime(self):
        """The sim's ``StraightRuntime``: no choice point of an eager run without a
        detector has work to decide on, so it runs each op at its host call."""
        from ..device.sim import StraightRuntime
        return StraightRuntime()

    def open(self, cfg, strategy, observer, faults: Sequence[str] = (), *, device="sim",
             model=None, runtime=None, access="declared", detect=True, engine=None,
             trace=False, graphs=False, twins="run", **options) -> ReferenceSession:
        """``runtime``: a runtime built by the caller (``strategy`` and ``device`` are
        then its own); ``engine``: an engine factory ``(cfg, rt, model, observer)``
        (default: ``make_engine``, tensor-parallel ranks when ``cfg.tp > 1``);
        ``trace``: record the device work that runs (replayable runtimes); ``graphs``: a
        GPU device's model calls replay from CUDA graphs (§4.9); ``twins``: the sim's
        host twins run, are each checked against their kernel, or are off (§3.4)."""
        from fake_models import make_model
        from ..device import make_runtime
        from .tp import make_engine
        if options:
            raise ValueError(f"unknown run option {sorted(options)[0]!r} for the reference engine")
        if faults:
            cfg = dataclasses.replace(cfg, faults=tuple(dict.fromkeys(tuple(cfg.faults) + tuple(faults))))
        rt = runtime if runtime is not None else make_runtime(
            device, strategy=strategy, access=access, detect=detect, graphs=graphs,
            twins=twins)
        if runtime is not None and twins != "run":     # the caller's runtime, held to it
            rt.host_runs = rt.host_runs and twins != "off"
            rt.check_twins = twins == "check" and rt.host_runs
        if trace and rt.replayable:
            rt.trace = True
        factory = engine if engine is not None else make_engine
        return ReferenceSession(factory(cfg, rt, model if model is not None else make_model(cfg.model),
                                        observer), rt)

"""The vLLM target: vLLM 0.33.0's real V1 ``Scheduler`` / ``AsyncScheduler`` and
``KVCacheManager``, driven on CPU with a deterministic fake model runner.

Modules: ``config`` (``VllmTargetConfig``), ``env`` (version check, environment,
building the scheduler), ``golden`` (the fake model's token/draft rule), ``runner``
(the fake V2 model runner), ``session`` (the engine-core loop, choice points),
``observe`` (vLLM state -> shared events), ``events`` (target-only events), ``faults``
and ``patching`` (historical bugs as reverse patches), ``strategies`` (Hypothesis).

Importing this package does not import vLLM; ``VllmTarget.version()`` and ``open``
do, and raise ``TargetUnavailable`` (one line naming the install command) when vLLM
is missing or not the pinned version.
"""
from __future__ import annotations

from ..base import Target
from .config import VllmTargetConfig
from .env import INSTALL
from .faults import FAULTS, TargetFault

__all__ = ["VllmTarget", "VllmTargetConfig", "FAULTS", "TargetFault"]


class VllmTarget(Target):
    name = "vllm"
    package = "vllm"
    pinned = "0.33.0"
    install = INSTALL

    def version(self) -> str:
        from .env import check_version
        return check_version()

    def default_config(self) -> VllmTargetConfig:
        return VllmTargetConfig()

    def faults(self) -> dict:
        return FAULTS

    def config_from_dict(self, d: dict) -> VllmTargetConfig:
        return VllmTargetConfig.from_dict(d)

    def config_to_dict(self, cfg: VllmTargetConfig) -> dict:
        return cfg.to_dict()

    def reference_config(self, cfg: VllmTargetConfig) -> VllmTargetConfig:
        """The synchronous ``Scheduler``, one batch in flight, no fault, same sizes."""
        from dataclasses import replace
        return replace(cfg, scheduler="sync", batch_queue=1, faults=())

    def open(self, cfg: VllmTargetConfig, strategy, observer=None, seed: int = 0):
        from .env import build_scheduler, load
        from .session import VllmSession
        V = load()
        return VllmSession(V, cfg, build_scheduler(cfg, V), strategy, observer, seed)

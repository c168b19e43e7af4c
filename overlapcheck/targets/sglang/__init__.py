"""The SGLang target: SGLang 0.5.23's real ``Scheduler``, in-process on CPU.

``SglangTarget().open(cfg, strategy, observer, seed).run(workload)`` drives its overlap
loop (``event_loop_overlap``) or normal loop with a deterministic fake model worker
(spec decode included), or with the tiny random Llama (``model="real"``). Module map:

* ``config``: ``SglangConfig``; ``env``: pin, environment, import stubs, tiny Llama dir;
* ``build``: constructing (and reusing) the scheduler; ``worker``: the fake workers;
  ``kernels``: CPU equivalents of the scheduler-side Triton kernels of spec decode;
* ``session``: the loop bodies, choice points and events; ``observe``: SGLang state ->
  events and snapshots; ``faults``: historical bugs as opt-in patches;
  ``strategies``: Hypothesis strategies for configs and workloads.

Nothing here imports SGLang at module import time.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..base import Target, TargetUnavailable
from . import env
from .config import SglangConfig, from_dict, to_dict

__all__ = ["SglangTarget", "SglangConfig"]


class SglangTarget(Target):
    name = "sglang"
    package = env.PACKAGE
    pinned = env.PINNED
    install = env.INSTALL

    def version(self) -> str:
        from importlib import metadata
        try:
            v = metadata.version(self.package)
        except metadata.PackageNotFoundError:
            raise TargetUnavailable(f"target sglang needs sglang=={self.pinned}, which is not "
                                    f"installed: {self.install}") from None
        if v != self.pinned:
            raise TargetUnavailable(f"target sglang needs sglang=={self.pinned}, found {v}: "
                                    f"{self.install}")
        return v

    def default_config(self) -> SglangConfig:
        return SglangConfig()

    def faults(self) -> dict:
        from .faults import FAULTS
        return FAULTS

    def config_from_dict(self, d: dict) -> SglangConfig:
        return from_dict(d)

    def config_to_dict(self, cfg: SglangConfig) -> dict:
        return to_dict(cfg)

    def reference_config(self, cfg: SglangConfig) -> SglangConfig:
        from dataclasses import replace
        return replace(cfg, overlap=False, faults=())

    def golden(self, cfg: SglangConfig):
        """The fake model's own continuation rule (for the sglang-golden checker)."""
        from .golden import Golden
        return Golden(cfg)

    def open(self, cfg: SglangConfig, strategy, observer: Optional[Callable[[object], None]],
             seed: int = 0):
        self.version()
        from . import build
        from .session import SglangSession
        return SglangSession(build.build(cfg), cfg, strategy, observer, seed)

"""The SGLang target: SGLang 0.5.23's real ``Scheduler``, in-process on CPU.

``SglangTarget().open(cfg, strategy, observer).run(workload)`` drives its overlap loop
(``event_loop_overlap``) or normal loop with a deterministic fake model worker (spec
decode included), or with the tiny random Llama (``model: real``). Module map:

* ``config``: ``SglangConfig``; ``env``: pin, environment, import stubs, tiny Llama dir;
* ``build``: constructing (and keeping) schedulers; ``worker``: the fake workers;
  ``kernels``: CPU equivalents of the scheduler-side Triton kernels of spec decode;
* ``session``: the loop bodies, choice points and events; ``observe``: SGLang state ->
  events and snapshots; ``golden``: the fake model's own continuation, and
  ``checkers`` the sglang-golden checker that holds the run to it; ``faults``:
  historical bugs as opt-in source patches; ``strategies``: the fuzzer's cases.

Nothing here imports SGLang at module import time.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from ...protocol.target import Target, TargetUnavailable
from . import env
from .config import SglangConfig, from_dict, to_dict

__all__ = ["SglangTarget", "SglangConfig"]


class SglangTarget(Target):
    name = "sglang"
    package = env.PACKAGE
    pinned = env.PINNED
    install = env.INSTALL
    config_type = SglangConfig
    case_strategy = "overlapcheck.targets.sglang.strategies:cases"
    case_options = ("config",)
    engine_logs = True        # its log lines go where targets.logs says (fuzz: --out)
    checkers = {"sglang-golden": "overlapcheck.targets.sglang.checkers:SglangGolden"}

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
        """The normal loop (``event_loop_normal``), no fault, same sizes."""
        return dataclasses.replace(cfg, overlap=False, faults=())

    def checker_context(self, cfg: SglangConfig) -> dict:
        """``golden`` for the sglang-golden checker: the fake model's own continuation
        (``golden.Golden``), which also gives every accept length exactly at that
        verify's own context; in real-forward mode the tiny Llama's greedy continuation
        (``golden.LlamaGolden``, transformers on the same checkpoint).

        Parity compares accept lengths by the request's verify count, which a
        retraction shifts in SGLang — its re-prefill of prompt + output samples a token
        (the reference engine's re-prefill samples none), so every later verify starts
        one position on. With the fake worker ``parity_accept`` is off (the golden
        checker's accept lengths are exact regardless); with a real spec worker, whose
        draft no golden model mirrors, parity compares them for each request until
        either run retracts it (``"unretracted"``)."""
        from .golden import golden_for
        return {"golden": golden_for(cfg),
                "parity_accept": "unretracted" if cfg.real_worker else False}

    def check_workload(self, workload, cfg: SglangConfig) -> None:
        from ...protocol.types import SEEDED
        from ...protocol.workload import WorkloadError
        from .session import MAX_RID
        for i, r in enumerate(workload.requests):
            w = f"requests[{i}]"
            if r.rid > MAX_RID:
                raise WorkloadError(f"{w}.id: the sglang target takes ids up to {MAX_RID}, got {r.rid}")
            if len(r.prompt) > cfg.max_prompt:
                raise WorkloadError(f"{w}.prompt: {len(r.prompt)} tokens is longer than SGLang "
                                    f"accepts at context {cfg.context} (at most {cfg.max_prompt})")
            if len(r.prompt) + r.max_new_tokens > cfg.context:
                raise WorkloadError(f"{w}: prompt + max_new_tokens = "
                                    f"{len(r.prompt) + r.max_new_tokens} exceeds the context "
                                    f"length {cfg.context} (SGLang refuses such a request)")
            if cfg.model == "real" and r.sampling == SEEDED:
                raise WorkloadError(f"{w}.sampling: real-forward mode decodes greedily (SGLang "
                                    f"samples a seeded request from torch's global generator "
                                    f"in batch order unless deterministic inference is on, "
                                    f"which no CPU attention backend supports)")
            bad = [t for t in tuple(r.prompt) + tuple(r.stop_ids) if not 0 <= t < cfg.vocab]
            if bad:
                raise WorkloadError(f"{w}: token {bad[0]} is outside the vocabulary "
                                    f"(0..{cfg.vocab - 1})")

    def generate(self, seed: int, n: int, cfg: SglangConfig):
        """``n`` seeded requests that fit ``cfg`` (mixed arrivals, stop ids, sampling
        modes, aborts; greedy only in real-forward mode)."""
        from ...protocol.types import GREEDY
        from ...protocol.workload import Workload, generate
        max_prompt = min(24, cfg.max_prompt)
        wl = generate(seed, n, cfg, vocab=cfg.vocab, max_prompt=max_prompt,
                      max_new=min(40, cfg.context - max_prompt))
        if cfg.model == "real":     # greedy only (check_workload says why)
            wl = Workload(tuple(dataclasses.replace(r, sampling=GREEDY) for r in wl.requests),
                          wl.aborts)
        return wl

    def open(self, cfg: SglangConfig, strategy, observer: Optional[Callable[[object], None]],
             faults: Sequence[str] = (), *, device: str = "sim", detect: bool = True,
             trace: bool = False, model=None, **options):
        """A session on a built scheduler for ``cfg`` with ``faults`` switched on as
        well as the config's. ``device`` must be one without a GPU (SGLang runs on the
        CPU as on the sim). ``detect``: a real spec worker runs under ``watch``'s CPU
        shim on SGLang's CUDA path, its races reported (``cuda_path``); the fake
        worker has no device model to watch. ``trace`` has nothing to act on; the
        model is the config's (``model``: none may be passed)."""
        from ...device import device_info
        if options:
            raise ValueError(f"unknown run option {sorted(options)[0]!r} for the sglang target")
        if device_info(device).gpu:
            raise ValueError(f"the sglang target runs SGLang's scheduler on the CPU; device "
                             f"{device!r} is not for it")
        if model is not None:
            raise ValueError("the sglang target runs its own model worker (config field "
                             "'model': fake or real), not a model passed in")
        self.check_faults(faults)
        if faults:
            cfg = dataclasses.replace(cfg, faults=tuple(dict.fromkeys(tuple(cfg.faults)
                                                                      + tuple(faults))))
        from .. import logs
        from . import build
        if not build.imported():
            self.version()      # before SGLang's import: one line when it is missing
        from .session import SglangSession
        with logs.routed():
            built = build.build(cfg)
        return SglangSession(built, cfg, strategy, observer, detect=detect)

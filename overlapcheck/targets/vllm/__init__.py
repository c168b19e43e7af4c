"""The vLLM target: vLLM 0.33.0's real V1 ``Scheduler`` / ``AsyncScheduler`` and
``KVCacheManager``, driven on CPU with a deterministic fake model runner.

Modules: ``config`` (``VllmTargetConfig``), ``env`` (version check, environment,
building the scheduler), ``golden`` (the fake model's token/draft rule), ``runner``
(the fake V2 model runner), ``session`` (the engine-core loop, choice points),
``observe`` (vLLM state -> shared events), ``events`` (target-only events), ``checkers``
(the checkers that read them), ``faults`` (historical bugs as source patches),
``strategies`` (Hypothesis).

Importing this package does not import vLLM; ``VllmTarget.version()`` and ``open``
do, and raise ``TargetUnavailable`` (one line naming the install command) when vLLM
is missing or not the pinned version.
"""
from __future__ import annotations

from dataclasses import replace

from ...protocol.target import Target
from .config import VllmTargetConfig
from .env import INSTALL
from .faults import FAULTS

__all__ = ["VllmTarget", "VllmTargetConfig", "FAULTS"]


class VllmTarget(Target):
    name = "vllm"
    package = "vllm"
    pinned = "0.33.0"
    install = INSTALL
    config_type = VllmTargetConfig
    case_strategy = "overlapcheck.targets.vllm.strategies:cases"
    case_options = ("config",)
    checkers = {     # they read this target's own events (``events.py``)
        "vllm-placeholders": "overlapcheck.targets.vllm.checkers.placeholders:VllmPlaceholders",
        "vllm-golden": "overlapcheck.targets.vllm.checkers.golden:VllmGolden",
        "vllm-block-reuse": "overlapcheck.targets.vllm.checkers.block_reuse:VllmBlockReuse",
        "vllm-preempt-progress": "overlapcheck.targets.vllm.checkers.preempt_progress:VllmPreemptProgress",
        "vllm-overschedule": "overlapcheck.targets.vllm.checkers.overschedule:VllmOverschedule",
        "vllm-sched-after-end": "overlapcheck.targets.vllm.checkers.sched_after_end:VllmSchedAfterEnd",
    }

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
        return replace(cfg, scheduler="sync", batch_queue=1, faults=())

    def checker_context(self, cfg: VllmTargetConfig) -> dict:
        """Parity compares tokens only: after a preemption vLLM resamples the resumed
        request's next token at a new position, so its later verifies start elsewhere
        than in the reference run; vllm-golden checks every accept length exactly."""
        return {"parity_accept": False, "vllm_runner": cfg.runner}

    def check_workload(self, workload, cfg: VllmTargetConfig) -> None:
        from ...protocol.workload import WorkloadError
        why = cfg.workload_error(workload)
        if why:
            raise WorkloadError(why)

    def generate(self, seed: int, n: int, cfg: VllmTargetConfig):
        """``n`` seeded requests (``protocol.workload.generate``) whose ids lie in the
        config's vocabulary and whose prompt + output fit ``max_context``. With
        ``prefix_caching``, some requests then start with a prefix of an earlier prompt
        (``share_prefixes``, its own sub-stream: the rest of the workload is unchanged)."""
        from dataclasses import replace as _replace

        from ...protocol.workload import generate, share_prefixes
        prompt = max(1, cfg.max_context * 2 // 5)
        wl = generate(seed, n, cfg, vocab=cfg.vocab, max_prompt=prompt,
                      max_new=cfg.max_context - prompt)
        if cfg.prefix_caching:
            wl = _replace(wl, requests=tuple(share_prefixes(seed, wl.requests, prompt)))
        return wl

    def open(self, cfg: VllmTargetConfig, strategy, observer, faults=(), *, device="sim",
             detect=True, trace=False, model=None, **options):
        """A session of vLLM's scheduler for ``cfg`` with ``faults`` added to its own.
        There is no device model: ``device`` must be a CPU backend, ``detect`` has
        nothing to watch, ``trace`` records the scheduler calls; the fake model runner is
        the target's own, so ``model`` is refused."""
        from ...device import device_info
        if options:
            raise ValueError(f"unknown run option {sorted(options)[0]!r} for the vllm target")
        if device_info(device).gpu:
            raise ValueError(f"the vllm target runs vLLM's scheduler with a fake model runner "
                             f"on the CPU; device {device!r} is a GPU backend")
        if model is not None:
            raise ValueError("the vllm target runs its own fake model runner; it takes no model")
        if faults:
            cfg = replace(cfg, faults=tuple(dict.fromkeys(tuple(cfg.faults) + tuple(faults))))
        from .env import build_scheduler, load
        from .session import VllmSession
        V = load()
        if cfg.runner == "real":     # the scheduler is built with the runner's KV cache
            return VllmSession(V, cfg, None, strategy, observer, trace=trace, detect=detect)
        return VllmSession(V, cfg, build_scheduler(cfg, V), strategy, observer, trace=trace)

"""``SglangConfig``: how the SGLang target builds and drives its scheduler.

Frozen and validated in ``__post_init__`` (a bad value is a one-line ``ValueError``).
Sizes are SGLang's own server arguments, kept small so that a fuzzed workload meets
memory pressure (retraction) and the request-pool limit.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Tuple

from .worker_kinds import REAL_WORKERS, WORKERS  # noqa: F401  (the spec worker)

MODELS = ("fake", "real")


@dataclass(frozen=True)
class SglangConfig:
    overlap: bool = True            # event_loop_overlap; False: event_loop_normal
    spec_steps: int = 0             # EAGLE-style chain drafts per verify (0: no spec decode)
    page_size: int = 1
    pool_tokens: int = 256          # max_total_tokens: the KV pool
    max_running: int = 8            # max_running_requests (also the request-pool rows)
    chunk_size: int = 64            # chunked_prefill_size
    context: int = 128              # context length of the model (row width)
    vocab: int = 64
    agreement: int = 70             # percent of drafts the fake model accepts (seeded)
    model: str = "fake"             # fake: the deterministic fake worker; real: tiny Llama
    worker: str = "fake"            # the spec worker (WORKERS); a real one needs model real
    step_bound: int = 4000          # host iterations before EngineStuck
    faults: Tuple[str, ...] = ()    # target faults (see ``faults.FAULTS``)

    def __post_init__(self):
        def need(ok: bool, msg: str):
            if not ok:
                raise ValueError(f"sglang config: {msg}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int):
                need(isinstance(v, int) and not isinstance(v, bool),
                     f"{f.name} must be an integer, got {v!r}")
            if f.type in ("bool", bool):
                need(isinstance(v, bool), f"{f.name} must be true or false, got {v!r}")
        need(0 <= self.spec_steps <= 4, f"spec_steps must be in 0..4, got {self.spec_steps}")
        need(self.page_size in (1, 2, 4, 8, 16),
             f"page_size must be one of 1, 2, 4, 8, 16, got {self.page_size}")
        need(1 <= self.max_running <= 64, f"max_running must be in 1..64, got {self.max_running}")
        need(16 <= self.context <= 4096, f"context must be in 16..4096, got {self.context}")
        need(self.pool_tokens >= 2 * self.context,
             f"pool_tokens ({self.pool_tokens}) must hold two full contexts "
             f"(>= {2 * self.context})")
        need(self.pool_tokens % self.page_size == 0,
             f"pool_tokens ({self.pool_tokens}) must be a multiple of page_size ({self.page_size})")
        need(self.chunk_size >= self.page_size and self.chunk_size % self.page_size == 0,
             f"chunk_size ({self.chunk_size}) must be a positive multiple of page_size")
        need(8 <= self.vocab <= 1 << 16, f"vocab must be in 8..65536, got {self.vocab}")
        need(0 <= self.agreement <= 100, f"agreement must be in 0..100, got {self.agreement}")
        need(self.model in MODELS, f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        need(self.worker in WORKERS,
             f"worker must be one of {', '.join(WORKERS)}, got {self.worker!r}")
        if self.worker == "fake":
            need(self.model == "fake" or self.spec_steps == 0,
                 "spec decode on the real model needs a real spec worker (worker: eagle-v2)")
        else:
            need(self.model == "real", f"worker {self.worker} runs the real tiny pair: "
                                       f"model must be real")
            need(self.spec_steps >= 1, f"worker {self.worker} is a spec worker: spec_steps "
                                       f"must be in 1..4")
        need(self.step_bound >= 16, f"step_bound must be >= 16, got {self.step_bound}")
        need(isinstance(self.faults, tuple) and all(isinstance(x, str) for x in self.faults),
             f"faults must be a list of names, got {self.faults!r}")
        from .faults import FAULTS
        for name in self.faults:
            need(name in FAULTS, f"unknown fault {name!r} (choose from {', '.join(FAULTS)})")

    @property
    def max_context(self) -> int:
        """The longest prompt + output SGLang lets one request reach: its
        ``max_req_len`` (context - 1) less one (``init_req_max_new_tokens`` caps
        max_new_tokens at max_req_len - prompt - 1). Workloads are parsed against it."""
        return self.context - 2

    @property
    def max_prompt(self) -> int:
        """The longest prompt SGLang admits: shorter than its ``max_req_input_len``
        (max_req_len - 5); a longer one is aborted at arrival."""
        return self.context - 7

    def build_key(self) -> tuple:
        """What the built scheduler depends on (everything but the drive settings)."""
        return (self.overlap, self.spec_steps, self.page_size, self.pool_tokens, self.max_running,
                self.chunk_size, self.context, self.vocab, self.model, self.worker)

    @property
    def real_worker(self) -> bool:
        """Does SGLang's own spec-v2 worker run (with its Triton kernels' CPU twins)?"""
        return self.worker in REAL_WORKERS


def to_dict(cfg: SglangConfig) -> dict:
    d = asdict(cfg)
    d["faults"] = list(cfg.faults)
    return d


def from_dict(d: dict) -> SglangConfig:
    if not isinstance(d, dict):
        raise ValueError(f"sglang config: expected a mapping, got {type(d).__name__}")
    known = {f.name for f in fields(SglangConfig)}
    unknown = sorted(set(map(str, d)) - known)
    if unknown:
        raise ValueError(f"sglang config: unknown field {unknown[0]!r}")
    d = dict(d)
    if d.get("worker") in REAL_WORKERS:
        # a real worker runs the real tiny pair with spec decode: say so by default
        d.setdefault("model", "real")
        d.setdefault("spec_steps", 2)
    if "faults" in d:
        if not isinstance(d["faults"], (list, tuple)):
            raise ValueError(f"sglang config: faults must be a list of names, got {d['faults']!r}")
        d["faults"] = tuple(d["faults"])
    return SglangConfig(**d)

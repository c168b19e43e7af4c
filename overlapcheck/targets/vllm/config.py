"""``VllmTargetConfig``: the frozen, validated configuration of one vLLM target run.

Sizes are vLLM's own knobs (``SchedulerConfig``, ``CacheConfig``, ``SpeculativeConfig``)
plus the fake model's (vocabulary, draft agreement) and the driver's (in-flight depth,
step bound). A bad value is a ``ValueError`` with one line.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Tuple

SCHEDULERS = ("async", "sync")
RUNNERS = ("fake", "real")
#: what a config mapping with ``runner: real`` leaves out defaults to (the Triton
#: attention backend's block granularity, the tiny Llama's vocabulary)
REAL_DEFAULTS = {"block_size": 16, "vocab": 32}


@dataclass(frozen=True)
class VllmTargetConfig:
    scheduler: str = "async"          # "async": AsyncScheduler; "sync": Scheduler
    batch_queue: int = 2              # most batches in flight (async); sync runs 1; 3 is
                                      # V2 + pipeline parallel 2 (pp_size + 1 batches)
    num_blocks: int = 32              # KV blocks, vLLM's null block 0 included
    block_size: int = 4               # tokens per block
    max_num_seqs: int = 8             # running-request cap
    max_num_batched_tokens: int = 256  # token budget per step
    long_prefill_token_threshold: int = 8  # prefill chunk cap (0: no cap)
    max_model_len: int = 96           # tokens per request: prompt + output + drafts
    spec_tokens: int = 3              # draft tokens per verify (0: no spec decode)
    agreement: int = 70               # percent of drafts equal to the golden token
    vocab: int = 64                   # the fake model's vocabulary
    defer_block_free: bool = False    # deferred frees, as with a KV-consumer connector
    max_steps: int = 0                # host step bound (0: derived from the workload)
    faults: Tuple[str, ...] = ()      # target faults (``overlapcheck.targets.vllm.faults``)
    runner: str = "fake"              # "fake": the deterministic fake runner; "real":
                                      # vLLM's own V2 GPU model runner on a tiny Llama,
                                      # on the CPU under watch (``real_runner``)
    prefix_caching: bool = False      # vLLM's automatic prefix caching (its own default
                                      # is on): full blocks hashed, shared and evicted LRU

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("scheduler", "faults", "runner"):
                continue
            want = bool if f.name in ("defer_block_free", "prefix_caching") else int
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ValueError(f"vllm config: {f.name} must be {want.__name__}, got {v!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"vllm config: scheduler must be one of {', '.join(SCHEDULERS)}, "
                             f"got {self.scheduler!r}")
        if self.runner not in RUNNERS:
            raise ValueError(f"vllm config: runner must be one of {', '.join(RUNNERS)}, "
                             f"got {self.runner!r}")
        if self.runner == "real":
            # V2's UVA staging pools hold max_concurrent_batches (2 without pipeline
            # parallel) buffers; the Triton attention backend takes blocks of 16
            if self.batch_queue > 2 or self.block_size % 16 or self.vocab < 32 \
                    or self.defer_block_free:
                raise ValueError(f"vllm config: the real runner takes batch_queue <= 2, "
                                 f"block_size a multiple of 16, vocab >= 32 and no deferred "
                                 f"frees, got {self.batch_queue}, {self.block_size}, "
                                 f"{self.vocab}, {self.defer_block_free}")
        if self.runner == "real" and self.prefix_caching:
            raise ValueError("vllm config: prefix_caching needs runner: fake (the real runner's "
                             "prompts of at most 16 tokens fill no 16-token block a later "
                             "prompt could hit, so it runs without the cache)")
        if not 1 <= self.batch_queue <= 3:
            raise ValueError(f"vllm config: batch_queue must be in 1..3, got {self.batch_queue}")
        if self.num_blocks < 2 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("vllm config: needs num_blocks >= 2, block_size >= 1, "
                             f"max_num_seqs >= 1, got {self.num_blocks}, {self.block_size}, "
                             f"{self.max_num_seqs}")
        if not 0 <= self.spec_tokens <= 8:
            raise ValueError(f"vllm config: spec_tokens must be in 0..8, got {self.spec_tokens}")
        if not 0 <= self.agreement <= 100:
            raise ValueError(f"vllm config: agreement must be in 0..100, got {self.agreement}")
        if self.vocab < 2 or self.long_prefill_token_threshold < 0 or self.max_steps < 0:
            raise ValueError("vllm config: needs vocab >= 2, long_prefill_token_threshold >= 0, "
                             f"max_steps >= 0, got {self.vocab}, "
                             f"{self.long_prefill_token_threshold}, {self.max_steps}")
        if self.max_model_len < self.spec_tokens + 3:
            raise ValueError(f"vllm config: max_model_len {self.max_model_len} leaves no room "
                             f"for a prompt, an output token and {self.spec_tokens} drafts")
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ValueError(f"vllm config: long_prefill_token_threshold "
                             f"{self.long_prefill_token_threshold} exceeds max_model_len "
                             f"{self.max_model_len}")
        # vLLM refuses to start when one request of max_model_len cannot fit the KV cache
        if (self.num_blocks - 1) * self.block_size < self.max_model_len:
            raise ValueError(f"vllm config: {self.num_blocks - 1} usable blocks of "
                             f"{self.block_size} tokens cannot hold max_model_len "
                             f"{self.max_model_len}")
        need = self.max_num_seqs * max(self.spec_tokens + 1, self.long_prefill_token_threshold)
        if self.max_num_batched_tokens < need:
            # a smaller budget trims drafts per batch composition: accept lengths would
            # then depend on the schedule (tokens would not)
            raise ValueError(f"vllm config: max_num_batched_tokens must be >= {need} "
                             f"(max_num_seqs x max(spec_tokens + 1, chunk)), "
                             f"got {self.max_num_batched_tokens}")
        if not isinstance(self.faults, tuple) or not all(isinstance(x, str) for x in self.faults):
            raise ValueError(f"vllm config: faults must be a tuple of names, got {self.faults!r}")
        from .faults import FAULTS
        for name in self.faults:
            if name in FAULTS and FAULTS[name].extra["layer"] == "runner" and self.runner != "real":
                raise ValueError(f"vllm config: fault {name!r} is in vLLM's model runner: "
                                 f"it needs runner: real")
            if name not in FAULTS:
                raise ValueError(f"vllm config: unknown fault {name!r} "
                                 f"(choose from {', '.join(sorted(FAULTS))})")

    @property
    def is_async(self) -> bool:
        return self.scheduler == "async"

    @property
    def max_context(self) -> int:
        """The longest prompt + output a request may reach: ``max_model_len`` less a
        verify's drafts and its bonus token, so that vLLM never trims a request's drafts
        at the model length (accept lengths stay a function of the request alone)."""
        return self.max_model_len - self.spec_tokens - 1

    @property
    def depth(self) -> int:
        """The most batches in flight: the batch queue for async, 1 for sync."""
        return self.batch_queue if self.is_async else 1

    def workload_error(self, workload) -> str:
        """Why ``workload`` does not fit this config (a one-line message), or ""."""
        for r in workload.requests:
            if len(r.prompt) + r.max_new_tokens > self.max_context:
                return (f"request {r.rid}: prompt {len(r.prompt)} + max_new_tokens "
                        f"{r.max_new_tokens} exceeds the {self.max_context} tokens a request "
                        f"may reach (max_model_len {self.max_model_len} less "
                        f"{self.spec_tokens} drafts and one bonus token)")
            if any(not 0 <= t < self.vocab for t in tuple(r.prompt) + tuple(r.stop_ids)):
                return f"request {r.rid}: token ids must lie in 0..{self.vocab - 1}"
        return ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["faults"] = list(self.faults)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VllmTargetConfig":
        if not isinstance(d, dict):
            raise ValueError(f"vllm config: expected a mapping, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(map(str, d)) - known)
        if unknown:
            raise ValueError(f"vllm config: unknown field {unknown[0]!r}")
        d = dict(d)
        if d.get("runner") == "real":
            # the real runner's own defaults where the mapping leaves a field out
            d = {**REAL_DEFAULTS, **d}
        if "faults" in d and isinstance(d["faults"], list):
            d["faults"] = tuple(d["faults"])
        return cls(**d)

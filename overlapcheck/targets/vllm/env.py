"""The import environment of the vLLM target: version check, environment variables,
the local model directory, and the scheduler built the way vLLM's own CPU tests
build it (``tests/v1/core/utils.py`` upstream).

vLLM is imported here, lazily, inside functions: importing this module costs nothing,
so ``overlapcheck --help`` and ``overlapcheck faults`` answer without vLLM.

Environment (set by the target, not asked of the user):

* ``VLLM_TARGET_DEVICE=cpu``: no CUDA build is present;
* ``HF_HUB_OFFLINE=1``: the model "directory" is a local ``config.json``, never a hub id;
* ``VLLM_USE_V2_MODEL_RUNNER=1``: the V2 runner's scheduler paths (vLLM refuses async
  scheduling with spec decode on the V1 runner); the fake runner imitates V2;
* ``VLLM_LOGGING_LEVEL=ERROR`` unless the user set a level.

The model directory holds one ``config.json`` of a tiny Llama (the scheduler only reads
its sizes); it is written to a temporary directory for the config's construction and
removed right after, so nothing is shipped as package data and nothing is left behind.

Two things are built once per process and kept: the vLLM names (``load``: importing
vLLM takes seconds) and the ``ModelConfig`` of each ``max_model_len`` (parsing the
model's config through transformers is most of a session's start-up). Both are
immutable facts of the installed vLLM; every session still builds its own
``VllmConfig``, KV cache manager and scheduler.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import tempfile
from types import SimpleNamespace

from ...protocol.target import TargetUnavailable

PINNED = "0.33.0"
INSTALL = ("bash overlapcheck/targets/vllm/install-cpu.sh (from the repository root: vllm==0.33.0 "
           "without its dependencies beside the CPU torch; docs/targets.md)")

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}


def installed_version() -> str:
    """vLLM's installed version, read from its metadata (no import)."""
    from importlib import metadata
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        raise TargetUnavailable(f"the vllm target needs vllm=={PINNED}, which is not "
                                f"installed; install it with: {INSTALL}") from None


def check_version() -> str:
    v = installed_version()
    if v != PINNED:
        raise TargetUnavailable(f"the vllm target is written for vllm=={PINNED}, found {v}; "
                                f"install the pinned version with: {INSTALL}")
    return v


def prepare_environment() -> None:
    # the real runner's Triton kernels run in Triton's interpreter; with no GPU driver
    # visible vLLM keeps Triton (vllm/triton_utils/importing.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        # vLLM configures no handler outside its engine: its CPU-platform warnings
        # (block size, missing kernels) would reach the root logger on every session
        import logging
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
        logging.getLogger("vllm").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=None)
def load() -> SimpleNamespace:
    """The vLLM names the target uses (imports vLLM on first call; ``TargetUnavailable``
    while vLLM is missing or of another version)."""
    check_version()
    prepare_environment()
    import torch
    from vllm.config import (CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig,
                             VllmConfig)
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager
    return SimpleNamespace(**{k: v for k, v in locals().items()})


@functools.lru_cache(maxsize=None)
def _model_config(max_model_len: int):
    """The tiny Llama's ``ModelConfig`` for ``max_model_len`` (kept: see the module
    docstring; callers take a shallow copy)."""
    V = load()
    with tempfile.TemporaryDirectory(prefix="overlapcheck-vllm-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(MODEL_CONFIG, f)
        return V.ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32",
                             seed=0, max_model_len=max_model_len)


@functools.lru_cache(maxsize=None)
def block_hasher(block_size: int):
    """The block hasher the engine core gives each request when prefix caching is on
    (``EngineCore.__init__``: ``init_none_hash`` then ``get_request_block_hasher`` with
    the config's default algorithm, sha256; the hash block size is the block size, no
    lookahead tokens for ngram drafts). sha256 seeds its root hash from
    ``PYTHONHASHSEED`` or a fixed string: never random, so runs stay deterministic."""
    load()
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    fn = get_hash_fn_by_name("sha256")
    init_none_hash(fn)
    return get_request_block_hasher(block_size, fn)


def build_scheduler(cfg, V: SimpleNamespace, vllm_cfg=None, runner_kv=None):
    """A vLLM ``Scheduler`` or ``AsyncScheduler`` for ``cfg`` (a ``VllmTargetConfig``);
    with ``vllm_cfg`` and ``runner_kv`` (a real runner's config and KV cache config),
    the one the engine core builds for that runner."""
    if vllm_cfg is not None:
        from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
        cls = V.AsyncScheduler if cfg.is_async else V.Scheduler
        return cls(vllm_config=vllm_cfg,
                   kv_cache_config=generate_scheduler_kv_cache_config([runner_kv]),
                   structured_output_manager=V.StructuredOutputManager(vllm_cfg),
                   block_size=cfg.block_size, log_stats=True)
    sched_cfg = V.SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=cfg.max_model_len, enable_chunked_prefill=True,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        async_scheduling=cfg.is_async, is_encoder_decoder=False)
    # VllmConfig marks its ModelConfig as verified (``config_updated``): a copy each, so
    # every session's VllmConfig runs vLLM's own verification (the parsed HF config it
    # shares is only read)
    model_cfg = copy.copy(_model_config(cfg.max_model_len))
    cache_cfg = V.CacheConfig(block_size=cfg.block_size,
                              enable_prefix_caching=cfg.prefix_caching)
    spec_cfg = (V.SpeculativeConfig(method="ngram", num_speculative_tokens=cfg.spec_tokens,
                                    prompt_lookup_min=1, prompt_lookup_max=2)
                if cfg.spec_tokens else None)
    vllm_cfg = V.VllmConfig(scheduler_config=sched_cfg, model_config=model_cfg,
                            cache_config=cache_cfg, speculative_config=spec_cfg)
    # vLLM's CPU platform switches async scheduling off because its CPU workers cannot
    # overlap; the target emulates a GPU deployment, whose scheduler runs async.
    vllm_cfg.scheduler_config.async_scheduling = cfg.is_async
    vllm_cfg.cache_config.enable_prefix_caching = cfg.prefix_caching
    cache_cfg.num_gpu_blocks = cfg.num_blocks
    kv_cfg = V.KVCacheConfig(
        num_blocks=cfg.num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[V.KVCacheGroupSpec(["layer"], V.FullAttentionSpec(
            block_size=cfg.block_size, num_kv_heads=1, head_size=1, dtype=V.torch.float32))])
    cls = V.AsyncScheduler if cfg.is_async else V.Scheduler
    sched = cls(vllm_config=vllm_cfg, kv_cache_config=kv_cfg,
                structured_output_manager=V.StructuredOutputManager(vllm_cfg),
                block_size=cfg.block_size, log_stats=True)
    # As vLLM's tests/v1/core/test_deferred_block_free.py does: the production gate needs
    # a KV-consumer connector; the fence mechanism itself does not.
    sched.defer_block_free = cfg.defer_block_free
    if cfg.is_async and cfg.batch_queue == 3:
        # three batches in flight is V2 + async + pipeline parallel 2 (pp_size + 1); its
        # scheduler spaces a request's decodes pp_size steps apart (AsyncScheduler
        # decode_stagger), which a CPU build cannot get from a real PP config
        sched.decode_stagger = 2
    return sched

"""vLLM's own V2 GPU model runner (``GPUModelRunner``), built and stepped on the CPU
under ``watch``'s shim, on the CUDA path.

``runner: real`` runs vLLM 0.33.0's ``vllm/v1/worker/gpu/model_runner.py`` unmodified
on a tiny seeded Llama checkpoint (``targets/checkpoint.py``'s weights: logits of order
one, so greedy choices do not hinge on the last bit of a batch-dependent sum):
``execute_model`` -> ``sample_tokens`` -> ``AsyncOutput`` (its copy stream, its fresh
event per step, its non-blocking copies into pinned memory) -> ``get_output`` ->
the scheduler's ``update_from_output``, ngram spec decode included
(``NgramGPUSpeculator``, rejection sampling, drafts kept on the device).

``built`` (inside an active ``watch(device="cpu")`` block) builds the runner for a
config and yields it, with what a CPU process lacks for the CUDA path in place for
the block, and undone after:

* **device**: the runner is built on ``torch.device("cuda")``: its buffers, KV cache,
  weights and outputs are the shim's device memory; ``output_copy_stream`` and the
  main stream are shim streams;
* **attention**: the CUDA platform's Triton backend (``TRITON_ATTN``) instead of the
  CPU platform's ``CPU_ATTN`` (whose C++ ops the CUDA wheel lacks), its two entry
  points computed by exact twins (``twins``); every Triton launch of the runner is
  declared by its reads and writes (``twins.ACCESSES``) or run by a twin;
* **pinned memory and UVA**: ``PIN_MEMORY`` answers as on CUDA (``async_tensor_h2d``
  stages each copy in fresh pinned memory); vLLM's own ``UvaBuffer`` (pinned CPU
  memory with a device view) gets the shim's meaning of a UVA view: the pinned
  tensor itself, which a kernel reaches on its stream (``watch.mode.kernel``);
* **platform stubs the CPU process needs** (each with no effect on the run's
  streams): ``torch.accelerator``'s ``synchronize``/``empty_cache``/
  ``get_memory_info`` are never reached on the stepping path (``load_model`` calls
  ``empty_cache``; profiling and shutdown, not run here, synchronize); a
  ``synchronize`` here would order the host after every stream, so it is counted
  (``Syncs``) and a test holds it at zero across a run.

The runner is built per run (a run's scheduler sizes are its own): about 1-2 s on
this machine, the process's first build more (vLLM's import, the model config).
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import tempfile
from typing import Iterator

import torch


def checkpoint_dir(vocab: int, max_model_len: int) -> str:
    """The tiny Llama's HF-format directory for this shape (written once per machine
    into a private scratch directory)."""
    from .. import checkpoint
    root = os.path.join(tempfile.gettempdir(), f"overlapcheck-vllm-{os.getuid()}")
    return checkpoint.model_dir(vocab, max_model_len, root)


@functools.lru_cache(maxsize=None)
def _model_config(vocab: int, max_model_len: int):
    """vLLM's ``ModelConfig`` of the checkpoint (parsing it through transformers costs
    seconds: kept per process; callers take a shallow copy)."""
    from vllm.config import ModelConfig
    return ModelConfig(model=checkpoint_dir(vocab, max_model_len), skip_tokenizer_init=True,
                       dtype="float32", seed=0, max_model_len=max_model_len,
                       enforce_eager=True)


@functools.lru_cache(maxsize=None)
def _distributed() -> None:
    """vLLM's world of one rank (gloo), once per process."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)


def vllm_config(cfg, V):
    """The ``VllmConfig`` of a real-runner run of ``cfg``."""
    import copy

    from vllm.config import CompilationConfig, DeviceConfig, LoadConfig
    sched_cfg = V.SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=cfg.max_model_len, enable_chunked_prefill=True,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        async_scheduling=cfg.is_async, is_encoder_decoder=False)
    spec_cfg = (V.SpeculativeConfig(method="ngram", num_speculative_tokens=cfg.spec_tokens,
                                    prompt_lookup_min=1, prompt_lookup_max=2)
                if cfg.spec_tokens else None)
    vc = V.VllmConfig(
        model_config=copy.copy(_model_config(cfg.vocab, cfg.max_model_len)),
        scheduler_config=sched_cfg,
        cache_config=V.CacheConfig(block_size=cfg.block_size, enable_prefix_caching=False),
        device_config=DeviceConfig("cpu"),
        load_config=LoadConfig(load_format="safetensors", use_tqdm_on_load=False),
        compilation_config=CompilationConfig(custom_ops=["none"]), speculative_config=spec_cfg)
    # the CPU platform turns async scheduling off; the target runs a GPU deployment's
    vc.scheduler_config.async_scheduling = cfg.is_async
    vc.cache_config.num_gpu_blocks_override = cfg.num_blocks
    return vc


def _kv_cache_config(runner, vc):
    """What the engine core resolves before the workers allocate: the KV layout and
    the per-worker KV cache config for ``num_gpu_blocks_override`` blocks."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                  resolve_kv_cache_layout)
    from vllm.v1.core import kv_cache_planning as plan
    specs = runner.get_kv_cache_spec()
    layouts = [layout.name for layout in
               get_supported_kv_cache_layouts(get_current_attn_backends(vc))]
    resolve_kv_cache_layout(vc, [layouts], list(specs.values()))
    groups = plan.get_global_kv_cache_groups(vc, [specs])
    return plan.get_kv_cache_configs(vc, [specs], [1 << 34], groups)[0]


class Syncs:
    """Host synchronizations of the whole device the CPU process would add."""

    def __init__(self) -> None:
        self.accelerator = 0


@contextlib.contextmanager
def cuda_path(syncs: Syncs) -> Iterator[None]:
    """The CUDA platform's answers for the duration of the block (module docstring)."""
    import vllm.utils.torch_utils as torch_utils
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.gpu import buffer_utils
    saved = []

    def put(owner, name, value):
        saved.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    def synchronize(*args, **kwargs):
        syncs.accelerator += 1
        torch.cuda.synchronize()

    triton_attn = AttentionBackendEnum.TRITON_ATTN.get_path()
    from overlapcheck.watch.kernel import active_backend
    b = active_backend()
    if b is None or getattr(b, "name", "") != "cpu":
        raise RuntimeError("vLLM's CUDA path runs inside watch(device='cpu') only")
    # device memory reports "cpu:0", which names the device: a tensor placed "where x
    # is" (``torch.empty(n, device=x.device)``, as the runner does for its logits
    # indices) is device memory, as on a GPU, not host memory
    b.alias_device(ALIAS)
    try:
        put(CpuPlatform, "get_attn_backend_cls",
            classmethod(lambda cls, *a, **k: triton_attn))
        put(torch_utils, "PIN_MEMORY", True)
        put(buffer_utils, "get_accelerator_view_from_cpu_tensor", _uva_view)
        put(torch.accelerator, "synchronize", synchronize)
        put(torch.accelerator, "empty_cache", lambda *a, **k: None)
        put(torch.accelerator, "get_memory_info", lambda *a, **k: (1 << 34, 1 << 34))
        yield
    finally:
        for owner, name, old in reversed(saved):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


_ABSENT = object()
ALIAS = "cpu:0"     # the CPU device name that stands for the GPU (cuda_path)


def _adopt_model(model) -> None:
    """The model's weights and buffers are device memory, as after loading on a GPU:
    buffers a layer builds on the host at construction (the rotary embedding's cos/sin
    cache) would otherwise be copied to the device at the first forward, a host wait a
    GPU never makes."""
    from overlapcheck.watch.kernel import active_backend
    b = active_backend()
    for t in [*model.parameters(), *model.buffers()]:
        if b.device_key(t) is None:
            b.adopt(t)


def _uva_view(cpu_tensor: torch.Tensor) -> torch.Tensor:
    """``get_accelerator_view_from_cpu_tensor`` on the shim: the device's view of pinned
    host memory is that memory (a kernel given it reaches it on its stream)."""
    if not cpu_tensor.is_pinned():
        raise ValueError("a UVA view needs pinned memory")
    return cpu_tensor


def pointees(runner) -> dict:
    """The tensors the runner's block-table address tables hold, by address."""
    bt = runner.block_tables
    out = {}
    for t in [b.gpu for b in bt.block_tables] + list(bt.input_block_tables):
        out[t.data_ptr()] = t
    return out


@contextlib.contextmanager
def built(cfg, V, launches=None) -> Iterator[object]:
    """vLLM's ``GPUModelRunner`` for ``cfg``, built on the shim's device with its KV
    cache, the twins and the CUDA path in place while the block runs; yields
    ``(runner, vllm_config, kv_cache_config, syncs, launches)``."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.sample import gumbel

    from ..triton_launch import require_interpreted
    from . import twins
    require_interpreted(gumbel._gumbel_sample_kernel, "vLLM", "vllm")
    _distributed()
    vc = vllm_config(cfg, V)
    syncs = Syncs()
    table: dict = {}
    with set_current_vllm_config(vc), cuda_path(syncs), \
            twins.installed(launches, table) as counts:
        runner = GPUModelRunner(vc, torch.device("cuda"))
        runner.load_model()
        _adopt_model(runner.model)
        kv = _kv_cache_config(runner, vc)
        runner.initialize_kv_cache(kv)
        table.update(pointees(runner))
        vc.cache_config.num_gpu_blocks = kv.num_blocks
        yield runner, vc, kv, syncs, counts


class RealRunner:
    """The session's runner when ``runner: real``: a batch is executed and sampled when
    it is scheduled (``execute_model`` then ``sample_tokens``, as the engine core's
    batch queue does), and its output is taken when the session applies it
    (``AsyncOutput.get_output``, as the executor's future does). Frame entries are
    built from what vLLM returns, at that point."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.sampled: set = set()       # requests that sampled since (re)admission

    def execute(self, so):
        out = self.runner.execute_model(so)
        if so.total_num_scheduled_tokens > 0:
            out = self.runner.sample_tokens(None)
        return out, ()

    def output(self, so, handle):
        """(ModelRunnerOutput, frame entries) of an executed batch."""
        from .events import FrameEntry
        out = handle.get_output() if hasattr(handle, "get_output") else handle
        for rid in so.finished_req_ids | so.preempted_req_ids:
            self.sampled.discard(int(rid))
        for nr in so.scheduled_new_reqs:
            self.sampled.discard(int(nr.req_id))
        entries = []
        index = getattr(out, "req_id_to_index", None) or {}
        for rid_s, n in so.num_scheduled_tokens.items():
            rid = int(rid_s)
            spec = len(so.scheduled_spec_decode_tokens.get(rid_s, ()))
            i = index.get(rid_s)
            toks = tuple(out.sampled_token_ids[i]) if i is not None and out.sampled_token_ids else ()
            kind = "chunk" if not toks else ("decode" if rid in self.sampled else "prefill")
            if toks:
                self.sampled.add(rid)
            entries.append(FrameEntry(rid, -1, n, spec, bool(toks), kind, "none",
                                      max(len(toks) - 1, 0), toks, (), -1, -1))
        return out, tuple(entries)

    def draft_token_ids(self, rids):
        return self.runner.take_draft_token_ids()

"""Building SGLang's real ``Scheduler`` in this process.

``build(cfg)`` turns a ``SglangConfig`` into SGLang's ``ServerArgs``, publishes them as
SGLang's process-wide runtime context and constructs ``Scheduler(server_args,
port_args)`` exactly as its scheduler process does, on CPU with the tiny Llama
(``load_format=dummy``, fp32, ``attention_backend=torch_native``). Two things differ
from a server, both at the edges:

* its ZMQ sockets are replaced by in-process queues (``Pipes``): requests are fed as
  its ``recv_requests`` would return them, outputs are captured instead of sent;
* with spec decode, the draft worker class SGLang would build (``EAGLEWorkerV2``, whose
  kernels need CUDA) is replaced by the fake spec worker while the scheduler is built.

A build costs seconds (SGLang's import and model registry, the model, the pools), so the
last one is kept per process and reused while the build key matches: SGLang's runtime
context is process-wide, so two differently configured schedulers cannot live side by
side anyway. Between sessions the reused scheduler is reset by ``reset`` (its own
``flush_cache`` plus the per-run counters), and is dropped when a run left it busy.
"""
from __future__ import annotations

import contextlib
import socket
from typing import List, Optional

from . import env
from .config import SglangConfig


class Pipes:
    """Stands in for the scheduler's sockets: ``inbox`` is what its next
    ``recv_requests`` returns; ``outbox`` collects what it sends."""

    def __init__(self) -> None:
        self.inbox: List[object] = []
        self.outbox: List[object] = []

    # the request receiver's interface (SchedulerRequestReceiver.recv_requests)
    def recv_requests(self, local_reqs=None):
        out = list(local_reqs or ()) + self.inbox
        self.inbox = []
        return out

    # SenderWrapper's interface
    def send_output(self, output, recv_obj=None):
        self.outbox.append(output)


class Built:
    """A scheduler and what the target needs around it."""

    def __init__(self, key, scheduler, pipes: Pipes, fake_worker):
        self.key = key
        self.scheduler = scheduler
        self.pipes = pipes
        self.fake_worker = fake_worker      # None in real_forward mode
        self.busy = False                   # a run left it in an unknown state


_LAST: List[Built] = []


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(cfg: SglangConfig, path: str):
    from sglang.srt.server_args import ServerArgs
    spec = {}
    if cfg.spec_steps:
        spec = dict(speculative_algorithm="EAGLE", speculative_draft_model_path=path,
                    speculative_num_steps=cfg.spec_steps, speculative_eagle_topk=1,
                    speculative_num_draft_tokens=cfg.spec_steps + 1)
    return ServerArgs(
        model_path=path, tokenizer_path=path, skip_tokenizer_init=True, device="cpu",
        attention_backend="torch_native", sampling_backend="pytorch", load_format="dummy",
        dtype="float32", random_seed=0, disable_cuda_graph=True,
        disable_radix_cache=True, page_size=cfg.page_size,
        max_total_tokens=cfg.pool_tokens, max_running_requests=cfg.max_running,
        chunked_prefill_size=cfg.chunk_size, max_prefill_tokens=max(cfg.chunk_size, cfg.context),
        context_length=cfg.context, disable_overlap_schedule=not cfg.overlap,
        nccl_port=_free_port(), log_level="error", **spec)


def build(cfg: SglangConfig) -> Built:
    """The scheduler for ``cfg`` (reused when the last build matches)."""
    key = cfg.build_key()
    if _LAST and _LAST[0].key == key and not _LAST[0].busy:
        return _LAST[0]
    drop()
    with env.stubbed():
        built = _construct(cfg, key)
    _LAST.append(built)
    return built


def drop() -> None:
    while _LAST:
        b = _LAST.pop()
        # its watchdog thread watches forward_ct only while a batch is current
        b.scheduler.cur_batch_for_debug = None
        # SGLang's own teardown of its process groups: the next build makes new ones
        from sglang.srt.distributed import parallel_state
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


def _construct(cfg: SglangConfig, key) -> Built:
    from sglang.srt.managers import scheduler as sched_mod
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs
    from sglang.srt.speculative import spec_info
    from .worker import FakeModelWorker, FakeSpecWorker

    path = env.model_dir(cfg.vocab, cfg.context, env.scratch_root())
    sa = server_args(cfg, path)
    pa = PortArgs.init_new(sa)
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    saved = (spec_info.SpeculativeAlgorithm.create_worker,
             MHATokenToKVPool._init_kv_copy_and_warmup)
    if cfg.spec_steps:
        # the draft worker SGLang would build; and the KV pool's tiled-copy warm-up, a
        # Triton launch (the copy serves topk > 1 tree compaction only; topk is 1 here)
        spec_info.SpeculativeAlgorithm.create_worker = lambda self, server_args: FakeSpecWorker
        MHATokenToKVPool._init_kv_copy_and_warmup = _no_kv_copy
    try:
        sch = sched_mod.Scheduler(sa, pa)
    finally:
        (spec_info.SpeculativeAlgorithm.create_worker,
         MHATokenToKVPool._init_kv_copy_and_warmup) = saved
    pipes = Pipes()
    _close_sockets(sch)
    sch.request_receiver = pipes
    sch.ipc_channels = _Channels(sch.ipc_channels, pipes)
    sch.output_streamer.send_to_detokenizer = pipes
    fake = None
    if cfg.model == "fake":
        fake = FakeModelWorker(sch, cfg)
        fake.install()
    return Built(key, sch, pipes, fake)


def _no_kv_copy(pool) -> None:
    pool._kv_copy_config = None


class _Channels:
    """The scheduler's ``ipc_channels`` with both senders pointed at ``pipes``."""

    def __init__(self, orig, pipes: Pipes):
        self.recv_from_tokenizer = None
        self.recv_from_rpc = None
        self.send_to_tokenizer = pipes
        self.send_to_detokenizer = pipes
        self.send_metrics_from_scheduler = None


def _close_sockets(sch) -> None:
    ch = sch.ipc_channels
    for s in (ch.recv_from_tokenizer, ch.recv_from_rpc, ch.send_metrics_from_scheduler,
              getattr(ch.send_to_tokenizer, "socket", None),
              getattr(ch.send_to_detokenizer, "socket", None)):
        if s is not None:
            with contextlib.suppress(Exception):
                s.close(linger=0)

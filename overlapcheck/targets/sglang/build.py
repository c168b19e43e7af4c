"""Building SGLang's real ``Scheduler`` in this process, and keeping the builds.

``build(cfg)`` turns a ``SglangConfig`` into SGLang's ``ServerArgs`` and constructs
``Scheduler(server_args, port_args)`` as its scheduler process does, on CPU with the
tiny Llama (``checkpoint``: fp32, ``attention_backend=torch_native``; the fake worker's
builds skip its weights with ``load_format=dummy``). What
differs from a server is at the edges:

* its ZMQ sockets are replaced by in-process queues (``Pipes``): requests are fed as
  its ``recv_requests`` would return them, outputs are captured instead of sent;
* with spec decode, the draft worker SGLang would build (``EAGLEWorkerV2``, whose
  kernels need CUDA) is the fake spec worker, and the overlap loop is kept: SGLang's
  argument resolution turns overlap off for spec decode on CPU
  (``_disable_overlap_schedule_for_cpu``: its CPU kernels are missing, not its
  scheduler), which would leave spec v2's overlap path — the one users run on GPUs —
  untested;
* no watchdog thread: in a server it sends SIGQUIT to the scheduler's *parent* when a
  batch makes no progress for five minutes; here the parent is the user's shell or
  test runner, and the target's step bound and the liveness checker stand for it;
* the KV pool is not sized by profiling free memory (``max_total_tokens`` sizes it),
  so the ``gc.collect()`` that precedes the profile is skipped: it is most of a
  build's cost once SGLang is imported.

Each build lives in its own SGLang runtime context (``create_context`` /
``use_context``, SGLang's API for embedded engines), so builds of several configs can
live side by side and a session activates its build's context while it runs. They
share the process groups of the first build (world size 1 everywhere: the same
groups), as SGLang's draft workers share their target's. The first build of a
process pays SGLang's import (10-18 s on a 2-core machine); a later one about 0.1 s;
a cached one nothing. Between sessions a build is reset by SGLang's own
``flush_cache`` (see ``SglangSession``); a run that ended without finishing marks it
``busy`` and the next session gets a fresh one.
"""
from __future__ import annotations

import contextlib
import socket
from collections import OrderedDict
from typing import Iterator, List

from . import checkpoint, env
from .config import SglangConfig

#: builds kept per process, least recently used first out (about 1 MB each)
MAX_BUILDS = 64


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

    def __init__(self, key, scheduler, context, pipes: Pipes, fake_worker):
        self.key = key
        self.scheduler = scheduler
        self.context = context              # its SGLang runtime context
        self.pipes = pipes
        self.fake_worker = fake_worker      # None in real-forward mode
        self.busy = False                   # a run left it in an unknown state

    def active(self):
        """Make this build's runtime context the current one (a context manager)."""
        from sglang.srt.runtime_context import use_context
        return use_context(self.context)


_BUILDS: "OrderedDict[tuple, Built]" = OrderedDict()
_FIRST: List[object] = []        # the runtime context whose process groups all builds share


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_paths(cfg: SglangConfig) -> "tuple[str, str]":
    """(target, draft) checkpoint directories: the spec pair for a real worker (the
    Gemma4 pair for the frozen-KV MTP worker), else the tiny Llama (the fake worker's
    draft needs no weights: its path is the target's)."""
    if cfg.worker == "frozen-kv-mtp-v2":
        return checkpoint.mtp_pair_dirs(cfg.vocab, cfg.context)
    if cfg.real_worker:
        return checkpoint.pair_dirs(cfg.vocab, cfg.context)
    path = checkpoint.model_dir(cfg.vocab, cfg.context)
    return path, path


def server_args(cfg: SglangConfig, path: str, draft: str = ""):
    from sglang.srt.server_args import ServerArgs
    spec = {}
    if cfg.spec_steps:
        spec = dict(speculative_algorithm="EAGLE", speculative_draft_model_path=draft or path,
                    speculative_num_steps=cfg.spec_steps, speculative_eagle_topk=1,
                    speculative_num_draft_tokens=cfg.spec_steps + 1)
    # a real spec worker runs SGLang's Triton attention backend (its kernels' CPU twins,
    # twins.py): the torch-native backend has no EAGLE draft or verify support, and
    # SGLang refuses it for Gemma4 (arg_groups/model_hook.py l.656)
    return ServerArgs(
        model_path=path, tokenizer_path=path, skip_tokenizer_init=True, device="cpu",
        attention_backend="triton" if cfg.real_worker else "torch_native",
        sampling_backend="pytorch",
        load_format="dummy" if cfg.model == "fake" else "safetensors",
        dtype="float32", random_seed=0, disable_cuda_graph=True,
        disable_radix_cache=True, page_size=cfg.page_size,
        max_total_tokens=cfg.pool_tokens, max_running_requests=cfg.max_running,
        chunked_prefill_size=cfg.chunk_size, max_prefill_tokens=max(cfg.chunk_size, cfg.context),
        context_length=cfg.context, disable_overlap_schedule=not cfg.overlap,
        nccl_port=_free_port(), log_level="error", **spec)


def build(cfg: SglangConfig) -> Built:
    """The scheduler for ``cfg`` (a kept build when one matches and is not busy)."""
    key = cfg.build_key()
    b = _BUILDS.pop(key, None)
    if b is None or b.busy:
        with env.stubbed():
            b = _construct(cfg, key)
    _BUILDS[key] = b
    while len(_BUILDS) > MAX_BUILDS:
        _BUILDS.popitem(last=False)
    return b


def imported() -> bool:
    """Has this process built a scheduler (so SGLang imports, at the pinned version)?"""
    return bool(_FIRST)


def forget() -> None:
    """Drop every kept build (the process groups stay: later builds reuse them)."""
    _BUILDS.clear()


def _construct(cfg: SglangConfig, key) -> Built:
    from sglang.srt import runtime_context as rc
    from sglang.srt.managers import scheduler as sched_mod
    from sglang.srt.server_args import PortArgs
    from .worker import FakeModelWorker

    path, draft = model_paths(cfg)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_cpu_overrides(cfg))
        sa = server_args(cfg, path, draft)
        pa = PortArgs.init_new(sa)
        ctx = rc.create_context(sa, role="scheduler",
                                ranks=rc.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        stack.enter_context(rc.use_context(ctx))
        if _FIRST:
            stack.enter_context(_shared_groups(_FIRST[0]))
        sch = sched_mod.Scheduler(sa, pa)
        if not _FIRST:
            _FIRST.append(ctx)
        pipes = Pipes()
        _close_sockets(sch)
        sch.request_receiver = pipes
        sch.ipc_channels = _Channels(pipes)
        sch.output_streamer.send_to_detokenizer = pipes
        fake = None
        if cfg.model == "fake":
            fake = FakeModelWorker(sch, cfg)
            fake.install()
    return Built(key, sch, ctx, pipes, fake)


@contextlib.contextmanager
def _cpu_overrides(cfg: SglangConfig) -> Iterator[None]:
    """The construction-time replacements listed in the module docstring, undone on
    exit: nothing of them stays patched while a session runs."""
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.managers import scheduler as sched_mod
    from sglang.srt.mem_cache import kv_cache_configurator, memory_pool
    from sglang.srt.speculative import spec_info
    from sglang.srt.utils.watchdog import Watchdog
    from .worker import FakeSpecWorker
    saved = [(speculative_hook, "_disable_overlap_schedule_for_cpu"),
             (sched_mod, "create_scheduler_watchdog"),
             (kv_cache_configurator, "gc")]
    fake_spec = cfg.spec_steps and not cfg.real_worker
    if fake_spec:
        saved += [(spec_info.SpeculativeAlgorithm, "create_worker"),
                  (memory_pool.MHATokenToKVPool, "_init_kv_copy_and_warmup")]
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr in saved]
    speculative_hook._disable_overlap_schedule_for_cpu = lambda server_args: None
    sched_mod.create_scheduler_watchdog = (
        lambda scheduler, watchdog_timeout, soft=False: Watchdog.create("Scheduler", None))
    kv_cache_configurator.gc = _NoCollect
    if fake_spec:
        # the draft worker SGLang would build; and the KV pool's tiled-copy warm-up, a
        # Triton launch (the copy serves topk > 1 tree compaction only; topk is 1 here)
        spec_info.SpeculativeAlgorithm.create_worker = lambda self, server_args: FakeSpecWorker
        memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup = _no_kv_copy
    try:
        yield
    finally:
        for owner, attr, orig in reversed(saved):
            setattr(owner, attr, orig)


class _NoCollect:
    """``gc`` as the KV pool's sizing sees it while a scheduler is built."""

    @staticmethod
    def collect(*args) -> int:
        return 0


@contextlib.contextmanager
def _shared_groups(first) -> Iterator[None]:
    """Build a scheduler on the process groups ``first`` (a runtime context) built:
    SGLang builds them once per process (``init_parallel_runtime`` refuses a second
    call), so a later build's context is handed the same groups instead."""
    from sglang.srt.distributed import bootstrap
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.runtime_context import get_parallel
    names = ("world_group", "tp_group", "pp_group", "moe_ep_group", "moe_dp_group",
             "moe_tp_group", "attn_tp_group", "attn_cp_group", "shared_experts_tp_group",
             "dcp_group")
    groups = {}
    for name in names:
        with contextlib.suppress(AttributeError, RuntimeError, ValueError):
            g = getattr(first.parallel, name)
            if g is not None:
                groups[name] = g

    def reuse(*, server_args, device, dist_port):
        get_parallel().override_permanently(**groups)
        initialize_dp_attention(server_args=server_args)

    orig = bootstrap.init_parallel_runtime
    bootstrap.init_parallel_runtime = reuse
    try:
        yield
    finally:
        bootstrap.init_parallel_runtime = orig


def _no_kv_copy(pool) -> None:
    pool._kv_copy_config = None


class _Channels:
    """The scheduler's ``ipc_channels`` with both senders pointed at ``pipes``."""

    def __init__(self, pipes: Pipes):
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

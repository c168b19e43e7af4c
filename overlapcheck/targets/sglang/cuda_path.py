"""SGLang's CUDA path, run on the CPU under ``watch``'s shim.

On the CPU device SGLang 0.5.23 turns its overlap machinery into no-ops: ``torch.cpu``
streams and events do nothing, ``async_d2h`` hands back the device tensor itself
instead of a pinned copy, ``record_stream`` is skipped, the FutureMap's pinned
``new_seq_lens`` mirror and private copy stream and the scheduler's WAR barrier exist
only when ``is_cuda()``. A race in that machinery cannot show there. ``on_shim``
(entered inside an active ``watch(device="cpu")`` block) makes the same run take the
CUDA path's semantics, so that SGLang's own streams, events, ``wait_stream``,
``record_stream``, pinned copies and allocator reuse feed the happens-before detector:

* **device memory**: SGLang's placement device becomes ``cpu:0``, which the shim
  takes for the GPU (``ShimBackend.alias_device``); plain ``"cpu"`` stays the host.
  Every SGLang object reachable from the scheduler that places tensors by its
  ``device`` attribute gets the alias for the run (process groups keep theirs), and
  the buffers they allocated at construction (KV pools, request->token table,
  FutureMap rows, attention metadata) are adopted as device memory;
* **streams**: ``torch.cpu``'s stream API is the shim's; the scheduler's schedule,
  forward and copy streams are fresh shim streams for the run, and the loop runs with
  the schedule stream current, as ``run_event_loop`` does;
* **CUDA branches**: ``is_pin_memory_available`` answers as on CUDA (pinned staging,
  non-blocking copies); the FutureMap gets its pinned mirror and private copy stream;
  the WAR barrier is on; and the platform tests that decide ``async_d2h``'s pinned
  copy and three ``record_stream`` calls (``GATES``) are edited to ask whether the
  tensor is device memory, each edit matching SGLang's source exactly once.

Everything is undone when the block ends; the build can run unwatched next.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Tuple

import torch

from overlapcheck.watch.kernel import active_backend

from . import source_patch

ALIAS = torch.device("cpu", 0)
#: classes whose ``device`` is not a placement of SGLang's device tensors (its
#: distributed groups communicate through the host)
HOST_SIDE = frozenset({"GroupCoordinator"})


def _is_device(t) -> bool:
    b = active_backend()
    return b is not None and isinstance(t, torch.Tensor) and b.device_key(t) is not None


#: (function, edits): SGLang's platform tests that pick the CUDA branch, asked about
#: the tensor instead of the platform
GATES: Tuple[Tuple[str, Tuple[Tuple[str, str], ...]], ...] = (
    ("sglang.srt.utils.common:async_d2h", (
        ('    if tensor.device.type == "cpu":\n',
         '    if not _oc_is_device(tensor):\n'),
        ("    if not is_pin_memory_available(tensor.device):\n",
         "    if not is_pin_memory_available(_oc_alias):\n"))),
    ("sglang.srt.managers.overlap_utils:resolve_forward_inputs", (
        ('            if batch.mix_running_indices.device.type != "cpu":\n',
         '            if _oc_is_device(batch.mix_running_indices):\n'),)),
    ("sglang.srt.managers.overlap_utils:FutureMap._resolve_spec_extras", (
        ('        if indices.device.type != "cpu":\n',
         '        if _oc_is_device(indices):\n'),)),
    ("sglang.srt.speculative.spec_utils:record_stream_each", (
        ("        if isinstance(t, torch.Tensor) and t.is_cuda:\n",
         "        if isinstance(t, torch.Tensor) and _oc_is_device(t):\n"),)),
)


def gate_patches():
    extra = {"_oc_is_device": _is_device, "_oc_alias": ALIAS}
    return [source_patch.edited(fn, edits, "CUDA branch", extra) for fn, edits in GATES]


def _cuda_pin_memory_available(device=None) -> bool:
    """``CudaPlatform.is_pin_memory_available``: pinned memory serves every device
    but the host."""
    return not (device is not None and str(device) == "cpu")


def _walk(root) -> Iterator[Tuple[object, str, object]]:
    """``(owner, attribute, value)`` of the attributes of SGLang objects reachable
    from ``root`` through SGLang objects, lists, tuples and dicts (never into torch
    modules other than attention backends: a model's weights are only read)."""
    seen = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if type(obj).__name__ in HOST_SIDE:
            continue
        d = getattr(obj, "__dict__", None)
        if d is None:
            continue
        for k, v in list(d.items()):
            yield obj, k, v
            for x in _members(v):
                if isinstance(x, torch.nn.Module) and "AttnBackend" not in type(x).__name__ \
                        and "DraftBackend" not in type(x).__name__:
                    continue
                if not isinstance(x, type) and type(x).__module__.startswith("sglang"):
                    todo.append(x)


def _members(v) -> tuple:
    if isinstance(v, (list, tuple)):
        return tuple(v)
    if isinstance(v, dict):
        return tuple(v.values())
    return (v,)


def _placements(scheduler) -> Tuple[List[Tuple[object, object]], List[torch.Tensor]]:
    """(objects whose ``device`` is the CPU placement, their tensors made before)."""
    owners, tensors = [], []
    for obj, k, v in _walk(scheduler):
        if k == "device" and (v == "cpu" or (isinstance(v, torch.device) and v == torch.device("cpu"))):
            owners.append((obj, v))
        elif not k.endswith("_cpu") and not k.endswith("_pinned") and "data_ptrs" not in k:
            for x in _members(v):
                if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter) \
                        and x.dtype != torch.uint64:
                    tensors.append(x)
    return owners, tensors


class _Saved:
    def __init__(self) -> None:
        self.items: List[Tuple[object, str, bool, object]] = []

    def put(self, obj, name: str, value) -> None:
        d = getattr(obj, "__dict__", {})
        self.items.append((obj, name, name in d, d.get(name)))
        setattr(obj, name, value)

    def restore(self) -> None:
        while self.items:
            obj, name, had, old = self.items.pop()
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)


@contextlib.contextmanager
def on_shim(scheduler) -> Iterator[None]:
    """The run in the block takes SGLang's CUDA path on the active CPU shim."""
    from sglang.srt.platforms import current_platform
    b = active_backend()
    if b is None or getattr(b, "name", "") != "cpu":
        raise RuntimeError("SGLang's CUDA path runs inside watch(device='cpu') only")
    b.alias_device(ALIAS)
    b.route_cpu_streams()
    saved = _Saved()
    try:
        owners, tensors = _placements(scheduler)
        for obj, v in owners:
            saved.put(obj, "device", str(ALIAS) if isinstance(v, str) else ALIAS)
        for t in tensors:
            b.adopt(t)
        dm = torch.cpu
        sched_stream, fwd, copy = dm.Stream(priority=0), dm.Stream(), dm.Stream()
        for st, role, code in ((sched_stream, "schedule stream", "self.schedule_stream"),
                               (fwd, "forward stream", "self.forward_stream"),
                               (copy, "copy stream", "self.copy_stream")):
            b.tr.name_stream(st.cuda_stream, role, code)
        saved.put(scheduler, "schedule_stream", sched_stream)
        saved.put(scheduler, "forward_stream", fwd)
        saved.put(scheduler.tp_worker.model_runner, "forward_stream", fwd)
        saved.put(scheduler, "forward_stream_ctx", dm.stream(fwd))
        saved.put(scheduler, "copy_stream", copy)
        saved.put(scheduler, "copy_stream_ctx", dm.stream(copy))
        saved.put(scheduler, "_war_barrier_enabled", True)
        fm = scheduler.future_map
        if fm is not None:
            saved.put(fm, "new_seq_lens_cpu_pinned",
                      torch.empty((fm.req_pool_size,), dtype=torch.int64, pin_memory=True))
            d2h = dm.Stream()
            b.tr.name_stream(d2h.cuda_stream, "FutureMap's seq-lens copy stream",
                             "self.fwd_prepare_d2h_stream")
            saved.put(fm, "fwd_prepare_d2h_stream", d2h)
            saved.put(fm, "publish_ready", None)
        saved.put(current_platform, "is_pin_memory_available", _cuda_pin_memory_available)
        with source_patch.installed(gate_patches()):
            with dm.StreamContext(sched_stream):
                yield
    finally:
        saved.restore()

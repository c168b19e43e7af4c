"""The CPU backend of ``watch``: ``torch.cuda`` code run on the CPU, in issue order.

For the duration of the context, CUDA things get a CPU meaning:

* ``torch.cuda`` streams and events (``shim_cuda``);
* device tensors: a factory given ``device="cuda"`` (or ``"cuda:0"``) makes a CPU
  tensor that the shim records as device memory, placed by a model of the caching
  allocator on the current stream (``shim_alloc``); an op with a device input makes
  device outputs; ``.cuda()``, ``.to("cuda")``, ``.to(tensor)``, ``torch.tensor`` and
  ``torch.as_tensor`` with a device copy into fresh device memory, and ``.cpu()`` /
  ``.to("cpu")`` back (``.to("cpu", non_blocking=True)`` into pinned memory, as
  PyTorch does);
* pinned memory: ``pin_memory()``, factories with ``pin_memory=True``; ``is_pinned()``
  answers for it;
* ``record_stream`` pledges the stream to the allocator model and the detector.

Tensors keep ``device == cpu`` (code that branches on ``t.is_cuda`` sees a CPU
tensor), and a CUDA-only op has its CPU meaning. Everything patched is restored on
leaving the context.

An engine that runs on the CPU device itself (SGLang's CPU path) can have its own
device watched: ``alias_device("cpu:0")`` makes that device name stand for the GPU
(a factory given it makes device memory, ``.to("cpu:0")`` copies to the device, a
plain ``"cpu"`` stays the host), ``route_cpu_streams()`` gives ``torch.cpu``'s stream
API (which PyTorch makes a no-op) the shim's streams and events, and ``adopt(t)``
makes a tensor allocated before the block device memory.
"""
from __future__ import annotations

import weakref
from typing import Dict, Optional

import torch

from .mode import host_key
from .tracker import BEFORE
from .shim_alloc import CachingAllocatorModel
from .shim_cuda import ShimCuda


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return getattr(device, "type", None) == "cuda"


class ShimBackend:
    name = "cpu"

    def __init__(self, tracker):
        self.tr = tracker
        self.alloc = CachingAllocatorModel()
        self.dev: Dict[int, int] = {}       # storage address -> modelled block address
        self.pinned: Dict[int, object] = {}  # storage address -> its finalizer
        self._fin: Dict[int, object] = {}
        self.cuda: Optional[ShimCuda] = None
        self.active = False
        self.aliases: set = set()           # CPU device names standing for the GPU
        self.alias = None                   # the first of them: what device memory reports
        self._tensor_device = torch.Tensor.device
        self._patcher = None

    def names_device(self, device) -> bool:
        """Does ``device`` (a factory's or ``.to``'s argument) name the device?"""
        if _is_cuda(device):
            return True
        if not self.aliases or device is None or isinstance(device, int):
            return False
        return torch.device(device) in self.aliases

    def alias_device(self, device) -> None:
        """From now on ``device`` (a CPU device with an index, e.g. ``"cpu:0"``) names
        the device, as ``"cuda"`` does, and device memory reports it as its
        ``.device`` (code placing a tensor "where ``t`` is" places it on the device)."""
        d = torch.device(device)
        if d.type != "cpu" or d.index is None:
            raise ValueError(f"an alias of the device is a CPU device with an index, "
                             f"not {device!r}")
        self.aliases.add(d)
        if self.alias is None:
            self.alias = d
            # device memory reports the alias as its device from now on
            self._patcher.set(torch.Tensor, "device", property(self._device_of))

    def _device_of(self, t):
        if self.device_key(t) is not None:
            return self.alias
        return self._tensor_device.__get__(t)

    def route_cpu_streams(self) -> None:
        """``torch.cpu``'s streams, events and stream contexts are the shim's."""
        streams = ("Stream", "Event", "StreamContext", "current_stream", "default_stream",
                   "set_stream", "stream", "synchronize")
        for name, value in self.cuda.functions().items():
            if name in streams and hasattr(torch.cpu, name):
                self._patcher.set(torch.cpu, name, value)

    def adopt(self, t) -> Optional[int]:
        """Count ``t``'s storage (made before the block, or outside the shim's view)
        as device memory, allocated before watching began."""
        if self.device_key(t) is not None:
            return self.device_key(t)
        return self.register_device(t, 0, site=BEFORE)

    # -- what the dispatch mode asks ------------------------------------------------------
    def current_stream(self) -> int:
        return self.cuda.current.cuda_stream

    def device_key(self, t) -> Optional[int]:
        return self.dev.get(host_key(t)) if self.dev else None

    def is_pinned(self, t) -> bool:
        return host_key(t) in self.pinned

    def prepare(self, plan, args, kwargs):
        target, pin = None, False
        dev = kwargs.get("device")
        if dev is not None:
            target = "cuda" if self.names_device(dev) else "cpu"
            if target == "cuda":
                kwargs = dict(kwargs, device=torch.device("cpu"))
        if kwargs.get("pin_memory"):
            kwargs, pin = dict(kwargs, pin_memory=False), True
        return args, kwargs, target, pin

    def new_output(self, o, target, sid) -> Optional[int]:
        if target == "cpu":
            return None
        return self.register_device(o, sid)

    def pinned_outputs(self, outs) -> None:
        for o in outs:
            self.register_pinned(o)

    # -- registries --------------------------------------------------------------------------
    def register_device(self, t, sid, site: Optional[str] = None) -> Optional[int]:
        storage = t.untyped_storage()
        ptr, n = storage.data_ptr(), storage.nbytes()
        if not ptr or not n:
            return None
        addr = self.dev.get(ptr)
        if addr is None:
            addr = self.dev[ptr] = self.alloc.malloc(n, sid)
            self._fin[ptr] = weakref.finalize(storage, self._device_dead, ptr)
            self.tr.device_alloc(addr, sid, n, site=site)
        return addr

    def register_pinned(self, t) -> None:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self.pinned:
            self.pinned[ptr] = weakref.finalize(storage, self.pinned.pop, ptr, None)

    def _device_dead(self, ptr: int) -> None:
        addr = self.dev.pop(ptr)
        self._fin.pop(ptr, None)
        self.tr.device_free(addr)
        self.alloc.free(addr)

    # -- copies as the shim performs them ----------------------------------------------------
    def to_device(self, t, non_blocking: bool):
        out = torch.empty_like(t, device="cuda")
        out.copy_(t, non_blocking=non_blocking)
        return out

    def to_host(self, t, non_blocking: bool):
        # PyTorch's D2H with non_blocking=True lands in fresh pinned memory
        out = torch.empty_like(t, device="cpu", pin_memory=non_blocking)
        out.copy_(t, non_blocking=non_blocking)
        return out

    # -- install / uninstall -------------------------------------------------------------------
    def install(self, patcher) -> None:
        self._patcher = patcher
        self.cuda = ShimCuda(self.tr, torch.cuda.is_available, torch.cuda._lazy_init)
        for name, value in self.cuda.functions().items():
            patcher.set(torch.cuda, name, value)
        _patch_tensor(self, patcher)
        self.active = True

    def uninstall(self) -> None:
        """Detach the finalizers: tensors outliving the context are plain CPU tensors."""
        self.active = False
        for fin in list(self._fin.values()) + list(self.pinned.values()):
            fin.detach()
        self._fin.clear()
        self.pinned.clear()
        self.dev.clear()
        self.aliases.clear()
        self.alias = None


def _patch_tensor(b: ShimBackend, patcher) -> None:
    T = torch.Tensor

    def is_device(t) -> bool:
        return b.device_key(t) is not None

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self if is_device(self) else b.to_device(self, non_blocking)

    def cpu(self, memory_format=torch.preserve_format):
        return b.to_host(self, False) if is_device(self) else orig_cpu(self)

    def to(self, *args, **kwargs):
        copy = kwargs.pop("copy", False)
        if args and isinstance(args[0], torch.Tensor):
            other = args[0]
            device = "cuda" if is_device(other) else "cpu"
            dtype = other.dtype
            nb = bool(args[1]) if len(args) > 1 else kwargs.get("non_blocking", False)
            fmt = kwargs.get("memory_format")
        else:
            device, dtype, nb, fmt = torch._C._nn._parse_to(*args, **kwargs)
        if device is None:
            return orig_to(self, dtype=dtype, non_blocking=nb, copy=copy,
                           **({"memory_format": fmt} if fmt is not None else {}))
        src_dev, dst_dev = is_device(self), b.names_device(device)
        t = self
        if dtype is not None and dtype != self.dtype or fmt is not None:
            t = orig_to(self, dtype=dtype or self.dtype,
                        **({"memory_format": fmt} if fmt is not None else {}))
        if src_dev == dst_dev:
            return t.clone() if copy and t is self else t
        return b.to_device(t, nb) if dst_dev else b.to_host(t, nb)

    def pin_memory(self, device=None):
        if is_device(self):
            raise RuntimeError("cannot pin 'torch.cuda.LongTensor' only dense CPU tensors "
                               "can be pinned")
        if b.is_pinned(self):
            return self
        out = torch.empty_like(self, pin_memory=True)
        out.copy_(self)
        return out

    def is_pinned(self, device=None):
        return b.is_pinned(self)

    def record_stream(self, stream):
        key = b.device_key(self)
        if key is None:
            raise RuntimeError("record_stream: expected a CUDA tensor (cpu shim)")
        b.tr.record_stream(b.tr.device_unit(key, self), stream.cuda_stream)

    def tensor(data, *args, dtype=None, device=None, requires_grad=False,
               pin_memory=False, **kwargs):
        t = orig_tensor(data, *args, dtype=dtype, requires_grad=requires_grad, **kwargs)
        if b.names_device(device):
            return b.to_device(t, False)
        return t.pin_memory() if pin_memory else t

    def as_tensor(data, dtype=None, device=None):
        if isinstance(data, torch.Tensor):
            return data.to(device=device if device is not None else
                           ("cuda" if is_device(data) else "cpu"), dtype=dtype or data.dtype)
        t = orig_as_tensor(data, dtype=dtype)
        return b.to_device(t, False) if b.names_device(device) else t

    orig_cpu = patcher.set(T, "cpu", cpu)
    orig_to = patcher.set(T, "to", to)
    patcher.set(T, "cuda", cuda)
    patcher.set(T, "pin_memory", pin_memory)
    patcher.set(T, "is_pinned", is_pinned)
    patcher.set(T, "record_stream", record_stream)
    orig_tensor = patcher.set(torch, "tensor", tensor)
    orig_as_tensor = patcher.set(torch, "as_tensor", as_tensor)

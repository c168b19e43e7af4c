"""Op reads and writes, from a ``TorchDispatchMode``.

Which arguments an op reads and writes comes from its schema, as the device
runtime's access inference reads it (``overlapcheck.device.infer``): ``(a!)``
arguments are written, other tensor arguments read, views and metadata-only ops
touch nothing. On top of that, watching plain PyTorch needs what the runtime API
made explicit:

* where an op runs: an op on device memory runs on the current stream, under the
  clock it was enqueued with; an op on host memory only is the host's own access;
* fresh outputs: an op's new (non-aliasing) outputs are written by it, which is how
  a recycled caching-allocator block meets its new owner (``empty*`` write nothing);
* copies between the host and the device, by CUDA's rules: with ``non_blocking`` and
  pinned host memory the copy is asynchronous (the stream reads or writes the host
  memory); from pageable memory, a non-blocking host-to-device copy stages the source
  at once (the host reads it) and performs no device synchronization, as CUDA's
  ``cudaMemcpyAsync`` documents; every other copy returns when it is done (the host
  synchronizes with the stream);
* ops that need a value from device memory on the host (``item``, or the size of a
  ``nonzero``, a boolean-mask index, ...) make the host wait for the stream in the middle
  of the op; what the op queues after that wait is queued work like any other
  (``sized``).

The backend (``gpu`` or ``shim``) says which tensors are device memory, which host
memory is pinned, and what the current stream is.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..device.infer import InferMode
from . import sized

COPY_OPS = frozenset({"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "copy"})
# ops that look at a tensor's metadata only, though their schemas list it as an input
NO_ACCESS = frozenset({"is_pinned", "record_stream", "is_same_size", "is_set_to"})
EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                       "new_empty_strided", "empty_permuted"})


class Plan:
    """What an op does to memory, derived once per op from its schema."""

    __slots__ = ("name", "inputs", "fresh", "many", "writes_out", "copy", "wait", "args",
                 "lift", "inert")

    def __init__(self, func):
        self.name = func._schema.name.split("::")[-1]
        self.inputs = (() if self.name in NO_ACCESS
                       else InferMode._plan(func)[0])  # ((position, name, written), ...)
        self.fresh = tuple(i for i, r in enumerate(func._schema.returns)
                           if r.alias_info is None and "Tensor" in str(r.type))
        self.many = len(func._schema.returns) > 1
        self.writes_out = not func.is_view and self.name not in EMPTY_OPS
        self.copy = self.name in COPY_OPS
        self.wait = sized.RULES.get(self.name)  # a host wait inside the op, maybe
        self.args = {a.name: i for i, a in enumerate(func._schema.arguments)}
        self.lift = self.name == "lift_fresh"
        self.inert = not (self.inputs or self.fresh or self.lift)  # views, metadata


_PLANS: Dict[object, Plan] = {}


def plan_of(func) -> Plan:
    p = _PLANS.get(func)
    if p is None:
        p = _PLANS[func] = Plan(func)
    return p


def _tracked(v) -> bool:
    return isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_meta


def host_key(t: torch.Tensor) -> int:
    """The address of ``t``'s storage: the key of host memory while it lives."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def inputs(plan: Plan, args, kwargs) -> Iterator[Tuple[torch.Tensor, bool]]:
    for i, name, write in plan.inputs:
        v = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(v, (list, tuple)):
            for x in v:
                if _tracked(x):
                    yield x, write
        elif _tracked(v):
            yield v, write


def one_per_view(ins):
    """``(tensor, write)`` pairs with one entry per view: an op that reads a view it also
    writes (``torch.mul(x, 5, out=x)``, ``x.add_(x)``) makes one access, a write."""
    if len(ins) < 2:
        return ins
    merged: Dict[tuple, list] = {}
    for t, write in ins:
        key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        seen = merged.get(key)
        if seen is None:
            merged[key] = [t, write]
        else:
            seen[1] = seen[1] or write
    return [(t, write) for t, write in merged.values()]


def all_tensors(args, kwargs) -> Iterator[torch.Tensor]:
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    yield x


def outputs(plan: Plan, out) -> Iterator[Tuple[int, torch.Tensor]]:
    """The op's new outputs, each with its position among the returns."""
    if not plan.fresh:
        return
    values = out if plan.many else (out,)
    for i in plan.fresh:
        v = values[i]
        if isinstance(v, (list, tuple)):
            yield from ((i, x) for x in v if _tracked(x))
        elif _tracked(v):
            yield i, v


def argument(plan: Plan, args, kwargs, name: str):
    """The argument ``name`` of a call (None when absent or not in the schema)."""
    i = plan.args.get(name)
    if i is not None and i < len(args):
        return args[i]
    return kwargs.get(name)


def non_blocking(plan: Plan, args, kwargs) -> bool:
    if plan.name == "copy_" and len(args) > 2:
        return bool(args[2])
    return bool(kwargs.get("non_blocking", False))


class WatchMode(TorchDispatchMode):
    """Feeds every op's accesses to the session's tracker."""

    def __init__(self, backend, tracker):
        super().__init__()
        self.b = backend
        self.tr = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True
        kwargs = kwargs or {}
        plan = plan_of(func)
        if plan.inert:
            return func(*args, **kwargs)
        b = self.b
        self.tr.ops += 1
        args, kwargs, target, pin = b.prepare(plan, args, kwargs)
        ins = one_per_view(list(inputs(plan, args, kwargs)))
        # An op runs on the device when it makes device memory or reads or writes
        # some; ``empty_like(x, device="cpu")`` of a device ``x`` is a host op.
        dev_op = target == "cuda" or any(b.device_key(t) is not None for t, _ in ins) or (
            target is None and any(b.device_key(t) is not None
                                   for t in all_tensors(args, kwargs)))
        if not dev_op:
            out = func(*args, **kwargs)
            if pin or kwargs.get("pin_memory") or plan.name == "_pin_memory":
                made = [o for _, o in outputs(plan, out)]
                if pin:  # the shim pins it
                    b.pinned_outputs(made)
                for o in made:
                    self.tr.pinned_allocated(host_key(o), o)
            if ins:
                self._host_op(plan, ins)
            return out
        return self._device_op(func, plan, args, kwargs, ins, target)

    def _host_op(self, plan: Plan, ins) -> None:
        """The host runs the op itself: it accesses the host memory in place."""
        __tracebackhide__ = True
        tr = self.tr
        op = None
        for t, write in ins:
            u = tr.host_unit_if_tracked(host_key(t))
            if u is None:
                continue
            if op is None:
                op, frame = tr.op(plan.name)
            tr.host_access(u, t, write, op, frame)

    def _device_op(self, func, plan: Plan, args, kwargs, ins, target):
        __tracebackhide__ = True
        b, tr = self.b, self.tr
        sid = b.current_stream()
        nb = plan.copy and non_blocking(plan, args, kwargs)
        staged = nb and any(not w and b.device_key(t) is None and not b.is_pinned(t)
                            for t, w in ins)
        wait = None
        if plan.wait is not None:  # decided on the arguments as the op gets them
            wait = plan.wait(lambda n: argument(plan, args, kwargs, n),
                             lambda t: b.device_key(t) is not None)
        ctx, clock = tr.enqueue(sid)
        allocs = tr.allocs
        out = func(*args, **kwargs)
        outs = [(i, o, b.new_output(o, target, sid)) for i, o in outputs(plan, out)
                if o.numel()]
        name = plan.name + (" (non_blocking)" if nb else "")
        op, frame = tr.op(name, is_copy=plan.copy or plan.lift)
        later = []  # (unit, tensor, write): the accesses queued after the host's wait
        host_side = None
        for t, write in ins:
            key = b.device_key(t)
            if key is not None:
                if wait is not None and wait.input_after(t, write):
                    later.append((tr.device_unit(key, t), t, write))
                else:
                    tr.access(ctx, clock, tr.device_unit(key, t), t, write, op, frame)
            elif plan.copy and not staged:
                host_side = t
                u = tr.host_unit(host_key(t), t, b.is_pinned(t))
                u.streams.add(sid)
                tr.access(ctx, clock, u, t, write, op, frame)
            else:  # a host scalar operand, or a staged source: read by the host now
                u = tr.host_unit_if_tracked(host_key(t))
                if u is not None:
                    tr.host_access(u, t, write, op, frame)
        if tr.allocs != allocs:
            # blocks handed out while the op ran: its writes to them come after that
            ctx, clock = tr.enqueue(sid)
        for i, o, key in outs:
            if key is not None:
                if not plan.writes_out:
                    continue
                if wait is not None and wait.output_after(i):
                    later.append((tr.device_unit(key, o), o, True))
                else:
                    tr.access(ctx, clock, tr.device_unit(key, o), o, True, op, frame)
            else:  # a device-to-host copy's new host tensor
                host_side = o
                u = tr.host_unit(host_key(o), o, b.is_pinned(o))
                u.streams.add(sid)
                tr.access(ctx, clock, u, o, True, op, frame)
        if plan.lift and args and b.device_key(args[0]) is not None:
            # torch.tensor(..., device="cuda"): a blocking copy into a fresh block
            t = args[0]
            tr.access(ctx, clock, tr.device_unit(b.device_key(t), t), t, True, op, frame)
            tr.sync_stream(sid)
        blocking = (plan.copy and host_side is not None and not staged
                    and not (nb and b.is_pinned(host_side)))
        if blocking or wait is not None:
            tr.sync_stream(sid)
        if later:
            # queued on the same stream once the host has its size: not waited for
            ctx, clock = tr.enqueue(sid)
            op = dataclasses.replace(op, after_wait=True)
            for u, t, write in later:
                tr.access(ctx, clock, u, t, write, op, frame)
        return out

    def kernel(self, name: str, reads, writes) -> None:
        """A device kernel the dispatcher does not see (``kernel.device_kernel``): one
        operation on the current stream reading ``reads`` and writing ``writes``. A
        pinned host tensor among them is accessed by the stream, as a kernel reaches
        host memory through a mapped (UVA) pointer; a pageable one is read (or
        written) by the host at the launch, as a kernel argument staged from pageable
        memory is."""
        __tracebackhide__ = True
        b, tr = self.b, self.tr
        tr.ops += 1
        sid = b.current_stream()
        ctx, clock = tr.enqueue(sid)
        op, frame = tr.op(name)
        for ts, write in ((reads, False), (writes, True)):
            for t in ts:
                key = b.device_key(t)
                if key is not None:
                    tr.access(ctx, clock, tr.device_unit(key, t), t, write, op, frame)
                    continue
                if b.is_pinned(t):
                    u = tr.host_unit(host_key(t), t, True)
                    u.streams.add(sid)
                    tr.access(ctx, clock, u, t, write, op, frame)
                    continue
                u = tr.host_unit_if_tracked(host_key(t))
                if u is not None:
                    tr.host_access(u, t, write, op, frame)

"""Triton launches of an engine run on the CPU, seen by ``watch`` as device kernels.

Triton's interpreter (``TRITON_INTERPRET=1``) runs an engine's ``@triton.jit``
kernels on CPU tensors exactly, one program instance at a time. ``routed`` intercepts
every interpreted launch (``InterpretedFunction.run``) for the duration of a block and
gives each kernel one of three treatments, by its ``"module:name"``:

* a *twin* (``twins[key]``): an exact CPU implementation of the kernel over the whole
  grid, called as ``twin(grid, args)`` with the launch's arguments bound by the
  kernel's own parameter names; it declares its reads and writes itself
  (``overlapcheck.watch.kernel.device_kernel``) and may answer ``INTERPRET`` for a
  variant it does not cover;
* an *access declaration* (``accesses[key]``): the kernel runs interpreted, as one
  device kernel writing the tensors of the named parameters and reading its other
  tensor arguments; or, for a kernel that reaches tensors through a table of
  addresses, a function ``(args, pointees) -> (reads, writes)`` (``pointees``: the
  tensors such tables may address, by ``data_ptr()``);
* neither: the kernel runs interpreted as a device kernel that reads and writes every
  tensor argument (the interpreter copies every argument back: exact values, an
  over-approximation of its writes).

``Launches`` counts launches per kernel by treatment, so a run that falls back to the
interpreter shows in the benchmarks.
"""
from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from overlapcheck.watch.kernel import device_kernel

INTERPRET = object()   # a twin's answer for a variant it does not cover

Accesses = object   # the written parameters' names, or (args, pointees) -> (reads, writes)


class Launches:
    """Per kernel name: launches run by a twin, interpreted with declared accesses,
    and interpreted with every tensor read and written."""

    def __init__(self) -> None:
        self.twin: Counter = Counter()
        self.declared: Counter = Counter()
        self.interpreted: Counter = Counter()


def require_interpreted(kernel, engine: str, target: str) -> None:
    """An engine's Triton kernels must have been defined as interpreted functions:
    ``TRITON_INTERPRET=1`` before the engine (or Triton) was imported, which the target
    sets. A process that imported the engine before that has compiled kernels, whose
    helpers refuse to run in the interpreter; say so in one line instead."""
    from triton.runtime.interpreter import InterpretedFunction

    from ..protocol.target import TargetUnavailable
    if not isinstance(kernel, InterpretedFunction):
        raise TargetUnavailable(f"{engine} was imported before the {target} target set "
                           f"TRITON_INTERPRET=1; its Triton kernels are compiled ones, which "
                           f"need a GPU: let the target import {engine} (or set "
                           f"TRITON_INTERPRET=1 before importing it)")


def key(fn) -> str:
    return f"{fn.__module__}:{fn.__name__}"


def as_np(t: torch.Tensor) -> np.ndarray:
    """The tensor's memory as a NumPy view (torch's own accessor, never a patched one)."""
    return torch._C.TensorBase.numpy(t)


def flat(t: torch.Tensor) -> np.ndarray:
    """A kernel's view of a tensor argument: its storage from the tensor's first
    element on (Triton pointers address the storage; strides are the kernel's)."""
    if t.is_contiguous():
        return as_np(t).reshape(-1)
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return as_np(t.as_strided((n,), (1,)))


def grid3(grid, args: dict) -> Tuple[int, int, int]:
    g = grid(args) if callable(grid) else grid
    g = tuple(int(x) for x in g) + (1, 1, 1)
    return g[0], g[1], g[2]


def tensors(args: dict, names) -> List[torch.Tensor]:
    return [args[n] for n in names if isinstance(args.get(n), torch.Tensor)]


def pointed(table: torch.Tensor, pointees: Dict[int, torch.Tensor]) -> List[torch.Tensor]:
    """The tensors a table of addresses (a kernel's ``uint64`` pointer argument)
    points at; an address of no known tensor is an error (its accesses would go
    unseen)."""
    out = []
    for addr in as_np(table).reshape(-1).tolist():
        t = pointees.get(int(addr))
        if t is None:
            raise LookupError(f"a kernel's pointer table holds address {int(addr):#x}, "
                              f"which no tensor known to the run starts at")
        out.append(t)
    return out


@contextlib.contextmanager
def routed(twins: Dict[str, Callable], accesses: Dict[str, Accesses],
           launches: Optional[Launches] = None,
           pointees: Optional[Dict[int, torch.Tensor]] = None) -> Iterator[Launches]:
    """Route interpreted Triton launches to ``twins`` or declare them by
    ``accesses`` for the duration of the block."""
    pointees = pointees if pointees is not None else {}
    from triton.runtime.interpreter import InterpretedFunction
    launches = launches if launches is not None else Launches()
    sigs: Dict[object, inspect.Signature] = {}
    orig_run = InterpretedFunction.run

    def bind(fn, args, kwargs) -> dict:
        sig = sigs.get(fn)
        if sig is None:
            sig = sigs[fn] = inspect.signature(fn)
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items()
                                           if k in sig.parameters})
        bound.apply_defaults()
        return bound.arguments

    def run(self, *args, grid, warmup, **kwargs):
        k = key(self.fn)
        twin = twins.get(k)
        if twin is not None and not warmup:
            if twin(grid, bind(self.fn, args, kwargs)) is not INTERPRET:
                launches.twin[self.fn.__name__] += 1
                return None
        decl = accesses.get(k)
        if decl is not None:
            a = bind(self.fn, args, kwargs)
            if callable(decl):
                reads, writes = decl(a, pointees)
            else:
                writes = tensors(a, decl)
                reads = [t for n, t in a.items() if isinstance(t, torch.Tensor) and n not in decl]
            launches.declared[self.fn.__name__] += 1
        else:
            reads = writes = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
            launches.interpreted[self.fn.__name__] += 1
        with device_kernel(self.fn.__name__, reads, writes):
            return orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield launches
    finally:
        InterpretedFunction.run = orig_run

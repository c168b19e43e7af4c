"""Device kernels that no dispatch mode sees: a launch declared by its reads and writes.

A Triton kernel (or a C++ extension op) reads and writes device memory behind the
dispatcher's back: ``watch`` sees its launch only if someone says what it touches.
Code that runs such a kernel on the CPU in its stead (an exact CPU twin of a kernel
with no CPU build) wraps the computation in ``device_kernel``:

    with device_kernel("fill_bonus_tokens", reads=(tokens, lens), writes=(bonus,)):
        ...compute on the raw CPU tensors...

Inside a ``watch`` block, the launch is one operation on the current stream, issued
at the caller's line: it reads every tensor of ``reads`` and writes every tensor of
``writes`` (whole views: a kernel's index arithmetic is not followed), and the block
runs with the dispatch mode off, so that the twin's own ops (and its raw reads
through NumPy) add nothing. Outside a ``watch`` block it only runs the block.

A twin must not allocate inside the block (an allocation there is not seen) and must
not read device values on the host (a kernel cannot): its inputs and outputs are
allocated by the caller, as a kernel's are.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Optional


def _active_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from .mode import WatchMode
    for m in _get_current_dispatch_mode_stack():
        if isinstance(m, WatchMode):
            return m
    return None


@contextlib.contextmanager
def device_kernel(name: str, reads: Iterable = (), writes: Iterable = ()) -> Iterator[None]:
    """Run the block as the device kernel ``name`` reading ``reads`` and writing
    ``writes`` on the current stream (``None`` entries are skipped)."""
    __tracebackhide__ = True
    mode = _active_mode()
    if mode is None:
        yield
        return
    mode.kernel(name, [t for t in reads if t is not None], [t for t in writes if t is not None])
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        yield


def watching() -> bool:
    """Is a ``watch`` block active in this thread?"""
    return _active_mode() is not None


def active_backend() -> Optional[object]:
    """The active ``watch`` block's backend (``shim.ShimBackend`` on the CPU), or None."""
    mode = _active_mode()
    return mode.b if mode is not None else None

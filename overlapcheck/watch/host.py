"""Host reads that never reach the dispatcher.

``Tensor.tolist()`` and ``Tensor.numpy()`` (and so ``np.asarray(t)`` and
``t.__array__()``, which call it) read a CPU tensor's memory directly: a dispatch
mode does not see them, and this is exactly how engines read pinned buffers filled
by non-blocking copies. They are patched for the duration of the context to record
a host read first. Other host reads and writes go through ops the dispatch mode
sees: ``t[i].item()``, ``int(t[i])``, ``t[i] == x``, ``t.sum()``, ``t[i] = v``,
``t.copy_(...)``, ``t.fill_(...)``.

Limitation: a NumPy array from ``numpy()`` is a live view; later reads and writes
through it are not seen (the read is recorded when the view is made).

On device tensors, ``tolist()`` is a blocking copy to the host (it goes through
``.cpu()``, which the dispatch mode sees); ``numpy()`` refuses, as PyTorch does.
"""
from __future__ import annotations

import threading

import torch

from .mode import host_key


def install_host_accessors(patcher, backend, tracker) -> None:
    watched = threading.get_ident()  # another thread's reads are not the watched host's

    def host_read(t, name: str) -> None:
        __tracebackhide__ = True
        if threading.get_ident() != watched:
            return
        u = tracker.host_unit_if_tracked(host_key(t))
        if u is not None:
            op, frame = tracker.op(name)
            tracker.host_access(u, t, False, op, frame)

    def tolist(self):
        __tracebackhide__ = True
        if tracker.paused:
            return orig_tolist(self)
        if backend.device_key(self) is not None:
            return self.cpu().tolist()
        host_read(self, "tolist")
        return orig_tolist(self)

    def numpy(self, *, force=False):
        __tracebackhide__ = True
        if tracker.paused:
            return orig_numpy(self, force=force)
        if backend.device_key(self) is not None:
            if force:
                return self.cpu().numpy()
            if backend.name == "cpu":
                raise TypeError("can't convert cuda:0 device type tensor to numpy. Use "
                                "Tensor.cpu() to copy the tensor to host memory first.")
            return orig_numpy(self, force=force)
        host_read(self, "numpy")
        return orig_numpy(self, force=force)

    orig_tolist = patcher.set(torch.Tensor, "tolist", tolist)
    orig_numpy = patcher.set(torch.Tensor, "numpy", numpy)

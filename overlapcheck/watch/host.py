"""Host reads that never reach the dispatcher.

``Tensor.tolist()`` and ``Tensor.__array__()`` (``np.asarray(t)``) read a CPU
tensor's memory directly: a dispatch mode does not see them, and this is exactly how
engines read pinned buffers filled by non-blocking copies. They are patched for the
duration of the context to record a host read first. Other host reads and writes go
through ops the dispatch mode sees: ``t[i].item()``, ``int(t[i])``, ``t[i] == x``,
``t.sum()``, ``t[i] = v``, ``t.copy_(...)``, ``t.fill_(...)``.

``Tensor.numpy()`` makes a live view. Of pageable memory it records a host read when
the view is made. Of pinned memory (what streams copy into and out of, and what
kernels reach through mapped pointers) it returns a ``WatchedArray``: reads and
writes through the view are recorded when they happen (``tolist``, ``item``, scalar
indexing, iteration, ``copy``, assignment, NumPy functions and ufuncs that take it
as input or ``out``), so an engine may make the view before a copy lands and read
it after the copy's event, or refill a staging buffer through it.

On device tensors, ``tolist()`` is a blocking copy to the host (it goes through
``.cpu()``, which the dispatch mode sees); ``numpy()`` refuses, as PyTorch does.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from .mode import host_key


class WatchedArray(np.ndarray):
    """A NumPy view of pinned host memory whose reads and writes are recorded when
    they happen (``_oc``: the session's recorder, ``(array, write, op) -> None``).
    Views of it are watched too; a copy made from it (fancy indexing, ``copy``,
    arithmetic) is plain NumPy memory."""

    _oc = None

    def __array_finalize__(self, obj) -> None:
        self._oc = getattr(obj, "_oc", None)

    def _note(self, arr, write: bool, op: str) -> None:
        if self._oc is not None:
            self._oc(arr, write, op)

    # -- reads ---------------------------------------------------------------------------
    def __getitem__(self, idx):
        out = np.ndarray.__getitem__(self, idx)
        if isinstance(out, np.ndarray) and _aliases(out, self):
            return out                         # a view: nothing read yet
        self._note(self, False, "numpy read")
        return out.view(np.ndarray) if isinstance(out, WatchedArray) else out

    def tolist(self):
        self._note(self, False, "tolist")
        return np.ndarray.tolist(self)

    def item(self, *args):
        self._note(self, False, "item")
        return np.ndarray.item(self, *args)

    def copy(self, order="C"):
        self._note(self, False, "numpy copy")
        return np.ndarray.copy(self.view(np.ndarray), order)

    def __iter__(self):
        self._note(self, False, "numpy iteration")
        return iter(self.view(np.ndarray))

    def __int__(self):
        self._note(self, False, "int")
        return int(self.view(np.ndarray))

    def __float__(self):
        self._note(self, False, "float")
        return float(self.view(np.ndarray))

    def __index__(self):
        self._note(self, False, "index")
        return self.view(np.ndarray).__index__()

    def __bool__(self):
        self._note(self, False, "bool")
        return bool(self.view(np.ndarray))

    # -- writes --------------------------------------------------------------------------
    def __setitem__(self, idx, value) -> None:
        target = np.ndarray.__getitem__(self, idx)
        shared = isinstance(target, np.ndarray) and _aliases(target, self)
        self._note(target if shared else self, True, "numpy write")
        np.ndarray.__setitem__(self.view(np.ndarray), idx, value)

    # -- NumPy functions and ufuncs ----------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _through(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func in _NO_DATA:
            return func(*(_plain(a) for a in args), **kwargs)
        writes = ()
        if func in _FIRST_ARG_WRITTEN and args:
            writes = (args[0],)
            args = (args[0].view(np.ndarray) if isinstance(args[0], WatchedArray)
                    else args[0],) + tuple(args[1:])
        for a in writes:
            if isinstance(a, WatchedArray):
                a._note(a, True, func.__name__)
        out = _plain(kwargs.get("out"))
        for a in _watched(args):
            a._note(a, False, func.__name__)
        for a in _watched((kwargs.get("out"),)):
            a._note(a, True, func.__name__)
        kwargs = dict(kwargs, out=out) if "out" in kwargs else kwargs
        return func(*(_plain(a) for a in args), **kwargs)


_FIRST_ARG_WRITTEN = {np.copyto, np.put, np.place, np.putmask}
_NO_DATA = {np.shares_memory, np.may_share_memory, np.shape, np.ndim, np.size}


def _aliases(a: np.ndarray, b: np.ndarray) -> bool:
    return a.base is not None and np.shares_memory(a.view(np.ndarray), b.view(np.ndarray))


def _watched(xs):
    for x in xs:
        if isinstance(x, WatchedArray):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _watched(x)


def _plain(x):
    if isinstance(x, WatchedArray):
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_plain(a) for a in x)
    return x


def _through(self, ufunc, method, inputs, kwargs):
    for a in _watched(inputs):
        a._note(a, False, ufunc.__name__)
    outs = kwargs.get("out")
    for a in _watched(outs or ()):
        a._note(a, True, ufunc.__name__)
    if outs is not None:
        kwargs = dict(kwargs, out=_plain(outs))
    res = getattr(ufunc, method)(*(_plain(a) for a in inputs), **kwargs)
    if outs is not None:
        return outs if len(outs) > 1 else outs[0]
    return res


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

    def array_access(t, arr, write: bool, name: str) -> None:
        """``arr`` (a view of ``t``'s memory) is read or written now."""
        __tracebackhide__ = True
        if tracker.paused or threading.get_ident() != watched:
            return
        u = tracker.host_unit_if_tracked(host_key(t))
        if u is None:
            return
        lo, hi = np.lib.array_utils.byte_bounds(arr)
        base = t.untyped_storage().data_ptr()
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            view = torch.empty(0, dtype=torch.uint8).set_(
                t.untyped_storage(), lo - base, (max(hi - lo, 0),), (1,))
        op, frame = tracker.op(name)
        tracker.host_access(u, view, write, op, frame)

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
        if backend.is_pinned(self) and threading.get_ident() == watched:
            arr = orig_numpy(self, force=force).view(WatchedArray)
            owner = self
            arr._oc = lambda a, write, name: array_access(owner, a, write, name)
            return arr
        host_read(self, "numpy")
        return orig_numpy(self, force=force)

    def as_array(self, dtype=None):
        __tracebackhide__ = True
        if tracker.paused or backend.device_key(self) is not None:
            return orig_array(self, dtype)
        host_read(self, "numpy")     # np.asarray(t): the caller reads what it gets
        arr = orig_numpy(self)
        return arr if dtype is None else arr.astype(dtype, copy=False)

    orig_tolist = patcher.set(torch.Tensor, "tolist", tolist)
    orig_numpy = patcher.set(torch.Tensor, "numpy", numpy)
    orig_array = patcher.set(torch.Tensor, "__array__", as_array)

"""One kernel source for both backends: the array namespace a kernel computes with
(docs/design.md §3.4, "One source per kernel").

A kernel written once, against ``xp = of(some_argument)``, runs on the sim on numpy
views of its tensors and on a GPU on the tensors themselves. Indexing, slicing,
arithmetic, comparisons, ``reshape``, ``sum``/``any``/``argmax`` along an axis and
``[:, None]`` are spelled the same in numpy and torch and are used as they are; the
operations that are spelled differently go through the namespace, each with torch's
meaning:

* ``where(c, a, b)``, ``arange(n, like)``, ``ones_like``, ``zeros(shape, like)``;
* ``long(x)``: int64, ``cast(x, like)``: ``like``'s dtype (no copy when it already is);
* ``cumprod(x, axis)``, ``clamp(x, lo, hi)``, ``expand(x, shape)`` (a broadcast view),
  ``repeat_each(x, n)`` (each value of a 1-d ``x`` ``n`` times in a row);
* ``gather(x, axis, idx)``: torch's ``gather``, which refuses an index out of
  ``[0, size)`` (numpy would wrap a negative one) and lets the index be shorter than
  ``x`` along the other axes;
* ``model(m)``: the model or draft head a kernel calls: itself on torch; on numpy its
  host mirror (``m.host``, the oracle family's), and ``NoHostModel`` where it has
  none, so the runtime runs the kernel on the tensors instead.

Integer arithmetic wraps in both (int64), ``%`` floors in both, and a fancy-indexed
store's duplicates keep the last writer on the sim in both. Nothing here syncs.
"""
from __future__ import annotations

import numpy as np
import torch

from .twins import NoTwin


class NoHostModel(NoTwin):
    """The kernel's model has no host mirror: the kernel runs on the tensors."""


class _Numpy:
    where = staticmethod(np.where)
    ones_like = staticmethod(np.ones_like)
    cumprod = staticmethod(np.cumprod)
    expand = staticmethod(np.broadcast_to)

    @staticmethod
    def arange(n, like=None):
        return np.arange(n, dtype=np.int64)

    @staticmethod
    def zeros(shape, like=None, dtype=None):
        return np.zeros(shape, dtype=np.int64 if dtype is None else dtype)

    @staticmethod
    def long(x):
        return x.astype(np.int64, copy=False)

    @staticmethod
    def clamp(x, lo=None, hi=None):
        # np.clip's Python wrapper costs several of these ufunc calls
        if lo is not None:
            x = np.maximum(x, lo)
        return x if hi is None else np.minimum(x, hi)

    @staticmethod
    def cast(x, like):
        return x.astype(like.dtype, copy=False)

    @staticmethod
    def gather(x, axis, idx):
        if idx.size and idx.min() < 0:
            raise IndexError("gather index out of range (torch refuses it)")
        if axis == 1 and x.ndim == 2 and idx.ndim == 2:
            # one fancy index (it refuses an index past the end, and more rows than x has)
            return x[np.arange(idx.shape[0])[:, None], idx]
        if idx.ndim != x.ndim:
            raise IndexError("gather index must have as many dimensions as its input")
        # out[i, j, ...] = x[i, ..., idx[i, j, ...], ...]: the other axes run over idx's
        # own extent, which may be shorter than x's (torch's rule, not take_along_axis's)
        grid = list(np.ogrid[tuple(slice(n) for n in idx.shape)])
        grid[axis] = idx
        return x[tuple(grid)]

    @staticmethod
    def repeat_each(x, n: int):
        return np.repeat(x, n)

    @staticmethod
    def model(m):
        host = getattr(m, "host", None)
        if host is None:
            raise NoHostModel(type(m).__name__)
        return host


class _Torch:
    where = staticmethod(torch.where)
    ones_like = staticmethod(torch.ones_like)
    cumprod = staticmethod(torch.cumprod)

    @staticmethod
    def arange(n, like=None):
        return torch.arange(n, device=None if like is None else like.device)

    @staticmethod
    def zeros(shape, like=None, dtype=None):
        return torch.zeros(shape, dtype=torch.int64 if dtype is None else dtype,
                           device=None if like is None else like.device)

    @staticmethod
    def long(x):
        return x.long()

    @staticmethod
    def clamp(x, lo=None, hi=None):
        return x.clamp(lo, hi)

    @staticmethod
    def cast(x, like):
        return x.to(like.dtype)

    @staticmethod
    def expand(x, shape):
        return x.expand(*shape)

    @staticmethod
    def gather(x, axis, idx):
        return x.gather(axis, idx)

    @staticmethod
    def repeat_each(x, n: int):
        return x.unsqueeze(1).expand(x.shape[0], n).reshape(-1)

    @staticmethod
    def model(m):
        return m


NUMPY, TORCH = _Numpy(), _Torch()


def of(x):
    """The namespace of array ``x``: numpy for a numpy array, torch otherwise."""
    return NUMPY if isinstance(x, np.ndarray) else TORCH


def one_source(kernel):
    """Mark ``kernel`` as written against ``of(...)``: the sim runs it on numpy views
    of its tensors (its host run, ``kernel.host_run is kernel``), and a checked run
    (``twins: check``) holds its numpy run to its torch run."""
    kernel.host_run = kernel
    kernel.one_source = True
    return kernel


TWINNED: list = []   # kernels whose host run is a twin (none in the engine today)


def twin(kernel):
    """Register the decorated function as ``kernel``'s *twin*: a second implementation
    on numpy that the sim runs in place of the kernel's one source. One is kept only
    where ``bench/twins.py`` shows it buys at least 20% of campaign throughput over the
    one source (docs/design.md §3.4); a checked run holds it to the kernel."""
    def register(fn):
        kernel.host_run = fn
        TWINNED.append(kernel)
        return fn
    return register

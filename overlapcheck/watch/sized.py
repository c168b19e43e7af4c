"""Ops that make the host wait for the stream in the middle: a size (or a value) that
only device data can tell.

CUDA allocates an output once its size is known. ``nonzero`` on device memory counts
the nonzero elements on the stream, copies the count to the host and waits for it,
allocates the output, and only then queues the kernels that write it — and those read
the input again. When the op returns, the host has waited for the counting only: the
rest is queued work like any other, so a later access to the input or the output from
another stream needs an edge, exactly as if the host had not waited at all.

``wait_of(plan, get, on_device)`` says, for one call on device memory, whether the host
waits and what the op accesses after that wait (``Wait``); the dispatch mode (``mode``)
records the rest of the op before the wait, the wait itself, and then the accesses
after it, on the same stream. What comes after the wait follows PyTorch's CUDA
implementations (ATen's ``Nonzero.cu``, ``IndexKernel.cpp``, ``TensorAdvancedIndexing.cpp``,
``Repeat.h``, ``SummaryOps.cu``, ``Unique.cu``, ``UniqueCub.cu``):

* ``nonzero`` (``argwhere`` and ``torch.where(cond)`` reach it): after the count, the
  selection re-reads ``self`` (in place when contiguous; otherwise it reads a copy made
  before the wait) and writes the indices;
* ``index`` with a boolean (or uint8) mask, or with an index tensor in host memory:
  the mask's ``nonzero`` (above), or the blocking copy of host indices to the device,
  then the index kernel reads ``self`` and the device indices and writes the result;
* ``masked_select``: ``index`` with the mask broadcast to ``self`` (a broadcast mask
  is copied before the wait);
* ``index_put_`` (``x[mask] = v``) and ``index_put``: as ``index``, writing ``self``
  (``index_put``: its copy of it) and reading ``values``; a host scalar value is copied
  to the device by a blocking copy, a wait too — except for a single device mask and a
  host scalar value, which is ``masked_fill_``: no wait at all;
* ``repeat_interleave(repeats)`` without ``output_size``: the total of ``repeats``,
  then a kernel re-reads ``repeats`` (in place when contiguous) and writes the result;
* ``bincount``: the minimum and the maximum of ``self``, then the histogram reads
  ``self`` and ``weights`` and writes the counts;
* ``unique`` over a dimension (``unique_dim``, ``unique_dim_consecutive``,
  ``unique_consecutive(dim=...)``): the count of unique slices (inside thrust, which
  PyTorch's GPU trace does not report), then ``index_select`` reads ``self`` and the
  counts are written; the inverse indices come before the wait;
* flat ``unique`` (``_unique``, ``_unique2``, ``unique_consecutive``), ``item``,
  ``equal`` and ``is_nonzero``: every kernel comes before the wait — the host has waited
  for the whole op.

``one_hot`` and other composite ops reach the dispatcher as their parts (``item``, then
the kernels it sizes), which are followed as they come.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Optional, Tuple

import torch

_MASKS = (torch.bool, torch.uint8)


@dataclass(frozen=True)
class Wait:
    """The host waits for the current stream while the op runs. After the wait the op
    reads ``reads`` (input tensors, by identity), writes its outputs at the positions
    ``returns`` (None: all of them) and, with ``writes_after``, writes its written
    arguments (``out=``, ``self`` of ``index_put_``); everything else it does comes
    before the wait."""

    reads: Tuple[torch.Tensor, ...] = ()
    returns: Optional[FrozenSet[int]] = frozenset()
    writes_after: bool = False

    def input_after(self, t: torch.Tensor, write: bool) -> bool:
        """Is the op's access to input ``t`` (written with ``write``) after the wait?"""
        if write:
            return self.writes_after
        return any(t is r for r in self.reads)

    def output_after(self, position: int) -> bool:
        """Is the op's output at ``position`` written after the wait?"""
        return self.returns is None or position in self.returns


DONE = Wait()   # all of the op's work is queued before the wait

Get = Callable[[str], object]         # an argument by its schema name (None: absent)
OnDevice = Callable[[torch.Tensor], bool]


def _tensors(v) -> Tuple[torch.Tensor, ...]:
    return tuple(x for x in (v or ()) if isinstance(x, torch.Tensor))


def _in_place(t) -> Tuple[torch.Tensor, ...]:
    """``t`` as ``nonzero`` reads it after the wait: only when it is contiguous."""
    return (t,) if isinstance(t, torch.Tensor) and t.is_contiguous() else ()


def _index_reads(indices, on_device: OnDevice) -> Tuple[torch.Tensor, ...]:
    """The index tensors the kernel after the wait reads: device indices, and device
    masks that ``nonzero`` reads in place."""
    out = []
    for i in indices:
        if not on_device(i):
            continue            # host memory: read by the host before the wait
        if i.dtype in _MASKS:
            out.extend(_in_place(i))
        else:
            out.append(i)
    return tuple(out)


def _needs_wait(indices, on_device: OnDevice) -> bool:
    return any(i.dtype in _MASKS or not on_device(i) for i in indices)


def _nonzero(get: Get, on_device: OnDevice) -> Optional[Wait]:
    return Wait(_in_place(get("self")), None, True)


def _index(get: Get, on_device: OnDevice) -> Optional[Wait]:
    indices = _tensors(get("indices"))
    if not _needs_wait(indices, on_device):
        return None
    return Wait((get("self"),) + _index_reads(indices, on_device), None, True)


def _masked_select(get: Get, on_device: OnDevice) -> Optional[Wait]:
    self, mask = get("self"), get("mask")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    own = on_device(mask) and tuple(mask.shape) == tuple(shape)
    return Wait((self,) + (_in_place(mask) if own else ()), None, True)


def _masked_fill(indices, values, on_device: OnDevice) -> bool:
    """``index_put_`` that ATen turns into ``masked_fill_`` (no wait): one device mask
    as the only index tensor, and a scalar value in host memory."""
    return (len(indices) == 1 and indices[0].dtype in _MASKS and on_device(indices[0])
            and values.numel() == 1 and not on_device(values))


def _index_put(in_place: bool) -> Callable[[Get, OnDevice], Optional[Wait]]:
    def rule(get: Get, on_device: OnDevice) -> Optional[Wait]:
        indices, values = _tensors(get("indices")), get("values")
        if not get("accumulate") and _masked_fill(indices, values, on_device):
            return None
        host_scalar = not on_device(values) and values.numel() == 1 and values.dim() == 0
        if not (_needs_wait(indices, on_device) or host_scalar):
            return None
        reads = ((values,) if on_device(values) else ()) + _index_reads(indices, on_device)
        # index_put copies self before the wait; index_put_ writes it after
        return Wait(reads, None, in_place)
    return rule


def _repeat_interleave(get: Get, on_device: OnDevice) -> Optional[Wait]:
    repeats = get("repeats")
    if not isinstance(repeats, torch.Tensor) or get("output_size") is not None:
        return None
    return Wait(_in_place(repeats), None, True)


def _bincount(get: Get, on_device: OnDevice) -> Optional[Wait]:
    self, weights = get("self"), get("weights")
    if self.numel() == 0:
        return None
    return Wait((self,) + _tensors((weights,)), None, True)


def _unique_dim(get: Get, on_device: OnDevice) -> Optional[Wait]:
    return Wait((get("self"),), frozenset({0, 2}), True)   # values, counts


def _unique_consecutive(get: Get, on_device: OnDevice) -> Optional[Wait]:
    return DONE if get("dim") is None else _unique_dim(get, on_device)


def _equal(get: Get, on_device: OnDevice) -> Optional[Wait]:
    self, other = get("self"), get("other")
    if self.shape != other.shape or self.numel() == 0 or (
            self.data_ptr() == other.data_ptr() and self.stride() == other.stride()
            and self.dtype == other.dtype):
        return None     # answered without the device: by the shapes, or one same view
    return DONE


def _done(get: Get, on_device: OnDevice) -> Optional[Wait]:
    return DONE


RULES: Dict[str, Callable[[Get, OnDevice], Optional[Wait]]] = {
    "nonzero": _nonzero,
    "index": _index,
    "masked_select": _masked_select,
    "index_put_": _index_put(True),
    "_index_put_impl_": _index_put(True),
    "index_put": _index_put(False),
    "repeat_interleave": _repeat_interleave,
    "bincount": _bincount,
    "unique_dim": _unique_dim,
    "unique_dim_consecutive": _unique_dim,
    "unique_consecutive": _unique_consecutive,
    "_unique": _done,
    "_unique2": _done,
    "_local_scalar_dense": _done,
    "is_nonzero": _done,
    "equal": _equal,
}

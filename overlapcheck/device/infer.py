"""Access inference: which tracked buffers (and rows) a closure reads and writes.

A ``TorchDispatchMode`` looks at each op's schema, as PyTorch's CUDA sanitizer does:
tensor arguments marked ``(a!)`` are writes, other tensor arguments are reads, views
and metadata-only ops access nothing. Rows come from view geometry (a slice of a
buffer touches only its rows); an index op on a buffer counts as touching the whole
buffer, because its indices live on the device. An annotation may narrow that
(``buf.rows(...)``); on the sim, where indices are plain CPU tensors, ``exact`` mode
also computes the rows index ops really touch, so the runtime can check that an
annotation did not hide a real access, and flags indexed writes (``index_put_``,
``index_copy_``) whose duplicate indices carry different values: on CUDA the winner
among duplicates is unspecified, so such a write is not portable. On cuda the rows an index op touches cannot be
seen without a sync: there only the buffer (and row-view geometry) is checked.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .buffers import Buffer

Rows = Optional[FrozenSet[int]]

aten = torch.ops.aten

_NO_DATA = {
    "empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros",
    "new_ones", "new_full", "new_empty_strided", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "size", "stride", "is_same_size", "detach", "alias",
    "lift_fresh", "record_stream", "resize_", "set_",
}

# op name -> (position of the indexed tensor, position of dim or None, position of index)
_INDEX_OPS = {
    "index_select": (0, 1, 2),
    "index_copy_": (0, 1, 2), "index_copy": (0, 1, 2),
    "index_add_": (0, 1, 2), "index_add": (0, 1, 2),
    "index_fill_": (0, 1, 2), "index_fill": (0, 1, 2),
    "gather": (0, 1, 2),
    "scatter_": (0, 1, 2), "scatter": (0, 1, 2),
    "scatter_add_": (0, 1, 2), "scatter_add": (0, 1, 2),
    "embedding": (0, None, 1),
    "index": (0, None, 1), "index_put_": (0, None, 1), "index_put": (0, None, 1),
    "_index_put_impl_": (0, None, 1),
}


def geometry_rows(t: torch.Tensor, base: torch.Tensor) -> Rows:
    """Rows of ``base`` (first dimension) that view ``t`` can touch; None = all."""
    if t.numel() == 0:
        return frozenset()
    if base.dim() == 0 or base.shape[0] <= 1:
        return None
    row = base.stride(0)
    if row <= 0:
        return None
    off = t.storage_offset() - base.storage_offset()
    last = off
    for size, stride in zip(t.shape, t.stride()):
        if stride < 0:
            return None
        last += (size - 1) * stride
    first_row, last_row = off // row, last // row
    if first_row <= 0 and last_row >= base.shape[0] - 1:
        return None
    return frozenset(range(max(first_row, 0), min(last_row, base.shape[0] - 1) + 1))


def _index_values(idx) -> Optional[List[int]]:
    if isinstance(idx, (list, tuple)):
        idx = idx[0] if idx else None
    if not isinstance(idx, torch.Tensor) or idx.device.type != "cpu":
        return None
    if idx.dtype == torch.bool:
        return [int(i) for i in idx.reshape(idx.shape[0], -1).any(1).nonzero().flatten()]
    return [int(i) for i in idx.flatten()]


class AccessSet:
    """Accesses of one closure: ``mem -> [buffer, read rows, write rows]`` where rows
    are None (all) or a frozenset; ``exact`` holds the index-exact rows (sim only)."""

    def __init__(self) -> None:
        self.by_mem: Dict[object, list] = {}
        self.exact: Dict[object, list] = {}
        self.touched: Dict[object, List[bool]] = {}  # mem -> [read, written]
        self.hazards: List[str] = []  # indexed writes whose result depends on duplicate order

    @staticmethod
    def _merge(table: Dict[object, list], buf: Buffer, write: bool, rows: Rows) -> None:
        ent = table.get(buf.mem)
        if ent is None:
            ent = table[buf.mem] = [buf, frozenset(), frozenset()]
        i = 2 if write else 1
        old = ent[i]
        ent[i] = None if (old is None or rows is None) else (old | rows)

    def add(self, buf: Buffer, write: bool, rows: Rows, exact: Rows) -> None:
        self._merge(self.by_mem, buf, write, rows)
        self._merge(self.exact, buf, write, exact)
        self.touched.setdefault(buf.mem, [False, False])[1 if write else 0] = True

    def items(self):
        for buf, r, w in self.by_mem.values():
            yield buf, r, w


class InferMode(TorchDispatchMode):
    """Collect the tracked-buffer accesses of every op run under it into ``self.acc``."""

    _schema_cache: Dict[object, Tuple] = {}

    def __init__(self, lookup: Dict[int, Buffer], exact: bool):
        super().__init__()
        self.lookup = lookup
        self.exact = exact
        self.acc = AccessSet()

    @classmethod
    def _plan(cls, func):
        plan = cls._schema_cache.get(func)
        if plan is None:
            name = func._schema.name.split("::")[-1]
            if name in _NO_DATA or func.is_view:
                plan = ()
            else:
                plan = tuple((i, a.name, bool(a.alias_info is not None and a.alias_info.is_write))
                             for i, a in enumerate(func._schema.arguments)
                             if "Tensor" in str(a.type))
            plan = (plan, _INDEX_OPS.get(name))
            cls._schema_cache[func] = plan
        return plan

    def _note(self, t, write: bool, indexed: bool, index_rows: Optional[List[int]]) -> None:
        if not isinstance(t, torch.Tensor):
            return
        buf = self.lookup.get(t.untyped_storage().data_ptr())
        if buf is None or buf.t is None:
            return
        rows = geometry_rows(t, buf.t)
        exact = rows
        if indexed and not self.exact:
            exact = frozenset()  # the rows hide in device indices: nothing to verify
        elif index_rows is not None:
            first = 0 if rows is None else min(rows, default=0)
            if t.dim() > 0 and buf.t.dim() > 0 and t.stride(0) == buf.t.stride(0):
                exact = frozenset(first + r for r in index_rows)
        self.acc.add(buf, write, rows, exact)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        plan, index_op = self._plan(func)
        if plan:
            index_rows = None
            if index_op is not None and self.exact:
                pos_t, pos_dim, pos_idx = index_op
                dim_ok = pos_dim is None or (len(args) > pos_dim and args[pos_dim] == 0)
                if dim_ok and len(args) > pos_idx:
                    index_rows = _index_values(args[pos_idx])
            for i, name, write in plan:
                v = args[i] if i < len(args) else kwargs.get(name)
                indexed = index_op is not None and i == index_op[0]
                if isinstance(v, (list, tuple)):
                    for x in v:
                        self._note(x, write, False, None)
                else:
                    self._note(v, write, indexed, index_rows if indexed else None)
        if self.exact and index_op is not None:
            self._check_duplicates(func, args, kwargs)
        return func(*args, **kwargs)

    def _check_duplicates(self, func, args, kwargs) -> None:
        """Note an indexed write into a tracked buffer whose duplicate indices carry
        different values (CPU applies the last one; CUDA picks any)."""
        name = func._schema.name.split("::")[-1]
        if name in ("index_put_", "_index_put_impl_"):
            acc = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            if acc or not isinstance(args[1], (list, tuple)):
                return
            dst, idx, vals = args[0], list(args[1]), args[2]
        elif name == "index_copy_":
            if args[1] != 0:
                return
            dst, idx, vals = args[0], [args[2]], args[3]
        else:
            return
        buf = self.lookup.get(dst.untyped_storage().data_ptr())
        if buf is None or buf.t is None:
            return
        where = order_dependent_write(dst, idx, vals)
        if where is not None:
            self.acc.hazards.append(f"'{buf.owner}' {where}")


def order_dependent_write(dst: torch.Tensor, idx: list, vals: torch.Tensor) -> Optional[str]:
    """For ``dst[idx] = vals`` (no accumulate): a description of the first index that
    occurs more than once with different values, or None when the result does not
    depend on the order duplicates are applied in. Only CPU integer index tensors that
    lead the index list are judged (others: None)."""
    if not idx or any(not isinstance(i, torch.Tensor) or i.device.type != "cpu"
                      or i.dtype in (torch.bool, torch.uint8) for i in idx):
        return None
    try:
        keys = torch.broadcast_tensors(*idx)
    except RuntimeError:
        return None
    n = keys[0].numel()
    if n < 2:
        return None
    key = torch.stack([k.reshape(-1) for k in keys], 1)
    key = torch.where(key < 0, key + torch.tensor(dst.shape[:len(idx)]), key)
    uniq, inv = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == n:
        return None
    shape = tuple(keys[0].shape) + tuple(dst.shape[len(idx):])
    v = vals.to(dst.dtype).expand(shape).reshape(n, -1)
    first = torch.full((uniq.shape[0],), n).scatter_reduce(0, inv, torch.arange(n), "amin")
    ref = v[first[inv]]
    differ = v != ref
    if v.is_floating_point() or v.is_complex():
        differ &= ~(v.isnan() & ref.isnan())
    bad = differ.any(1).nonzero().flatten()
    if bad.numel() == 0:
        return None
    i = int(bad[0])
    return (f"index {tuple(int(x) for x in key[i])} written twice with different values "
            f"(entries {int(first[inv[i]])} and {i})")

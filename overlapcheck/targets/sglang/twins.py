"""Exact CPU twins of the Triton kernels SGLang's spec-v2 workers launch.

SGLang 0.5.23 has no CPU build of these kernels: off CUDA it routes them to
``sgl_kernel``'s CPU ops (not on PyPI for this torch) or to nothing. Triton's
interpreter (``TRITON_INTERPRET=1``) runs them on CPU tensors exactly, but one
program instance at a time in Python: a decode step of the EAGLE worker takes about
1.5 s that way (measured on a 2-core machine, 2 spec steps). Each twin below does
what its kernel does over the whole launch grid with torch and NumPy on the same
CPU tensors, written from the kernel's source, and is tested against the
interpreted kernel (``tests/targets/test_sglang_twins.py``).

Two levels, both installed only while a run runs (``installed``):

* **kernels** (``KERNELS``): a launch of a ``@triton.jit`` function with a twin
  runs the twin on the launch's arguments, bound by the kernel's own parameter
  names (``twin(grid, args)``). A twin may decline a variant it does not cover
  (it returns ``INTERPRET``), which then runs interpreted: exact, only slow;
  ``Launches`` counts both, so a config that falls back shows in the benchmark.
* **attention** (``ATTENTION``): the Triton attention backend binds its
  ``decode_attention_fwd``/``extend_attention_fwd`` per instance; the twins replace
  those bindings on the backends of the run's workers. They compute what the
  functions document (softmax attention over the KV slots ``kv_indices`` lists, the
  extend part causal or under the custom mask), not the split-KV partial sums the
  kernels use inside, so their floats round differently from a GPU's; every run,
  overlap or not, uses the same twins.

Under ``watch`` every twin is one device kernel on the current stream that reads its
inputs and writes its outputs (``overlapcheck.watch.kernel.device_kernel``): the race
detector sees SGLang's Triton launches as it sees its torch ops. A twin reads the raw
memory with NumPy inside that kernel and allocates nothing there.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator

import numpy as np
import torch

from overlapcheck.watch.kernel import device_kernel

from ..triton_launch import INTERPRET, Launches, routed
from ..triton_launch import as_np as _np
from ..triton_launch import flat as _flat
from ..triton_launch import grid3 as _grid
from ..triton_launch import tensors as _tensors

__all__ = ["INTERPRET", "Launches", "KERNELS", "ATTENTION", "KernelOutOfBounds", "installed"]


class KernelOutOfBounds(IndexError):
    """A launch whose kernel would store outside the buffer it is given: on a GPU an
    out-of-bounds write (memory of whatever lies past the tensor), or a store into a
    region another program of the same launch writes (a race inside the kernel).
    The twin stops the run there and names the launch."""


def _launch_site() -> str:
    """``file:line`` of the innermost SGLang frame that launched the kernel."""
    import os
    import sys as _sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(_sys.modules["sglang"].__file__)))
    f = _sys._getframe(1)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if name.startswith(root + os.sep + "sglang" + os.sep):
            return f"{name[len(root) + 1:]}:{f.f_lineno}"
        f = f.f_back
    return "?"


# -- kernel twins --------------------------------------------------------------------------
def create_flashinfer_kv_indices(grid, a) -> object:
    """``kv_indices[kv_indptr[i] + j] = req_to_token[req_pool_indices[i], start_i + j]``
    for ``j < page_kernel_lens[i]``, ``start_i = kv_start_idx[i]`` (0 without it);
    page-granular tables and a token mapping as the kernel's docstring says."""
    reads = _tensors(a, ("req_to_token_ptr", "req_pool_indices_ptr", "page_kernel_lens_ptr",
                         "kv_indptr", "kv_start_idx", "token_mapping"))
    with device_kernel("create_flashinfer_kv_indices_triton", reads, (a["kv_indices_ptr"],)):
        table = _flat(a["req_to_token_ptr"])
        rows, lens = _np(a["req_pool_indices_ptr"]), _np(a["page_kernel_lens_ptr"])
        indptr, out = _np(a["kv_indptr"]), _flat(a["kv_indices_ptr"])
        start = a.get("kv_start_idx")
        starts = _np(start) if isinstance(start, torch.Tensor) else None
        mapping = a.get("token_mapping")
        mapping = _flat(mapping) if isinstance(mapping, torch.Tensor) else None
        stride, ps = int(a["req_to_token_ptr_stride"]), int(a.get("ENTRY_PAGE_SIZE", 1))
        for i in range(_grid(grid, a)[0]):
            s = int(starts[i]) if starts is not None else 0
            n = int(lens[i])
            base = int(rows[i]) * stride
            pos = np.arange(s, s + n, dtype=np.int64)
            if ps == 1:
                data = table[base + pos].astype(np.int64)
            else:
                data = table[base + pos // ps].astype(np.int64) * ps + pos % ps
            if mapping is not None:
                ok = data >= 0
                data = np.where(ok, mapping[np.where(ok, data, 0)], -1)
            o = int(indptr[i])
            out[o:o + n] = data
    return None


def gather_rows(grid, a) -> object:
    """One fused gather: ``d_k[r] = s_k[idx[r]]`` for the three (four) buffers, each
    row ``n_k`` elements wide."""
    pairs = [("s0", "d0", "n0"), ("s1", "d1", "n1"), ("s2", "d2", "n2")]
    if a.get("HAS3"):
        pairs.append(("s3", "d3", "n3"))
    reads = [a["idx_ptr"]] + [a[s] for s, _, _ in pairs]
    with device_kernel("_gather_rows_kernel", reads, [a[d] for _, d, _ in pairs]):
        idx = _np(a["idx_ptr"]).astype(np.int64)
        m = _grid(grid, a)[0]
        for s, d, n in pairs:
            w = int(a[n])
            src, dst = _flat(a[s]), _flat(a[d])
            rows = src[(idx[:m, None] * w + np.arange(w)).reshape(-1)]
            dst[:m * w] = rows
    return None


def assign_draft_cache_locs(grid, a) -> object:
    """Request ``i``'s draft slots: ``topk * steps`` table cells from its
    ``seq_lens[i]`` on, packed per request; its draft positions when asked."""
    reads = _tensors(a, ("req_pool_indices", "req_to_token", "seq_lens"))
    writes = _tensors(a, ("out_cache_loc", "positions", "mrope"))
    with device_kernel("assign_draft_cache_locs_contiguous", reads, writes):
        rows, table = _np(a["req_pool_indices"]), _flat(a["req_to_token"])
        seq, out = _np(a["seq_lens"]), _flat(a["out_cache_loc"])
        pool_len, topk = int(a["pool_len"]), int(a["topk"])
        n = topk * int(a["speculative_num_steps"])
        bs = _grid(grid, a)[0]
        pos = _flat(a["positions"]) if a.get("WRITE_POSITIONS") else None
        mrope = _flat(a["mrope"]) if a.get("WRITE_MROPE") else None
        for i in range(bs):
            start = int(rows[i]) * pool_len + int(seq[i])
            out[i * n:(i + 1) * n] = table[start:start + n]
            if pos is not None:
                pos[i * topk:(i + 1) * topk] = seq[i]
                if mrope is not None:
                    big = int(a["BS"]) * topk
                    for axis in range(3):
                        mrope[axis * big + i * topk:axis * big + (i + 1) * topk] = seq[i]
    return None


def assign_extend_cache_locs(grid, a) -> object:
    """Request ``i``'s table cells ``[start_i, end_i)`` packed after the requests
    before it: ``out[sum_{j<i}(end_j - start_j) + k] = table[row_i, start_i + k]``."""
    reads = _tensors(a, ("req_pool_indices", "req_to_token", "start_offset", "end_offset"))
    with device_kernel("assign_extend_cache_locs", reads, (a["out_cache_loc"],)):
        rows, table = _np(a["req_pool_indices"]), _flat(a["req_to_token"])
        starts, ends = _np(a["start_offset"]), _np(a["end_offset"])
        out, pool_len = _flat(a["out_cache_loc"]), int(a["pool_len"])
        at = 0
        for i in range(_grid(grid, a)[0]):
            s, e = int(starts[i]), int(ends[i])
            base = int(rows[i]) * pool_len
            out[at:at + e - s] = table[base + s:base + e]
            at += e - s
    return None


def assign_extend_cache_locs_uniform(grid, a) -> object:
    """Each request's ``draft_token_num`` cells from ``start_offset[i]``:
    ``out[i * n + k] = table[row_i, start_i + k]``; with ``positions_out``, ``start_i +
    k`` there; with ``anchor_out``, ``anchor_out[i * stride] = anchor_src[i]``
    (physical translation through ``full_v2p``/``swa_v2p`` is not covered:
    interpreted)."""
    if a.get("full_v2p") is not None:
        return INTERPRET
    reads = _tensors(a, ("req_pool_indices", "req_to_token", "start_offset", "anchor_src"))
    writes = _tensors(a, ("out_cache_loc", "positions_out", "anchor_out"))
    with device_kernel("assign_extend_cache_locs_uniform", reads, writes):
        rows, table = _np(a["req_pool_indices"]), _flat(a["req_to_token"])
        starts, out = _np(a["start_offset"]), _flat(a["out_cache_loc"])
        pool_len, n = int(a["pool_len"]), int(a["draft_token_num"])
        pos = a.get("positions_out")
        pos = _flat(pos) if isinstance(pos, torch.Tensor) else None
        anchor = a.get("anchor_out")
        if isinstance(anchor, torch.Tensor):
            src, dst, stride = _flat(a["anchor_src"]), _flat(anchor), int(a["anchor_stride"])
        for i in range(_grid(grid, a)[0]):
            s = int(starts[i])
            base = int(rows[i]) * pool_len + s
            out[i * n:(i + 1) * n] = table[base:base + n]
            if pos is not None:
                pos[i * n:(i + 1) * n] = np.arange(s, s + n)
            if isinstance(anchor, torch.Tensor):
                dst[i * stride] = src[i]
    return None


def draft_decode_kv_indices(grid, a) -> object:
    """Per draft step ``it`` (grid axis 0), request ``b`` and branch ``t``: the
    request's ``seq_len`` committed slots then ``it + 1`` draft slots, packed in
    ``kv_indices[it]``, and ``kv_indptr[it]``'s running sums (window, translated and
    page-granular sources are not covered: interpreted)."""
    if (int(a.get("window_size", 0)) or a.get("TRANSLATE") or int(a.get("ENTRY_PAGE_SIZE", 1)) != 1
            or int(a.get("NUM_STEPS", 0))):
        return INTERPRET
    reads = _tensors(a, ("req_pool_indices", "req_to_token", "paged_kernel_lens", "positions"))
    writes = _tensors(a, ("kv_indices", "kv_indptr"))
    with device_kernel("generate_draft_decode_kv_indices", reads, writes):
        steps, bs, topk = _grid(grid, a)
        rows, table = _np(a["req_pool_indices"]), _flat(a["req_to_token"])
        lens, positions = _np(a["paged_kernel_lens"]), _flat(a["positions"])
        kv_indices, kv_indptr = _flat(a["kv_indices"]), _flat(a["kv_indptr"])
        row_stride, ps = int(a["row_stride"]), int(a["page_size"])
        si, sp = int(a["kv_indices_stride"]), int(a["kv_indptr_stride"])
        need = max(int(lens[:bs].sum()) * topk + bs * topk * (it0 + 1) for it0 in range(steps))
        if need > si:
            raise KernelOutOfBounds(
                f"generate_draft_decode_kv_indices launched at {_launch_site()} stores "
                f"{need} entries in a draft step's kv_indices row of {si} (sequence lengths "
                f"{[int(x) for x in lens[:bs]]}, {steps} steps, topk {topk}): past its row, "
                f"into the next step's (a race between the launch's programs) and, for the "
                f"last step, past the end of the buffer")
        for it0 in range(steps):
            it = it0 + 1
            for b in range(bs):
                seq_len = int(lens[b])
                cum = int(lens[:b].sum())
                row = int(rows[b]) * row_stride
                for t in range(topk):
                    off = si * it0 + cum * topk + b * it * topk + t * (seq_len + it)
                    kv_indices[off:off + seq_len] = table[row:row + seq_len]
                    if ps == 1 or topk == 1:
                        start = seq_len + t * steps
                    else:
                        last = seq_len % ps
                        pages = (last + steps + ps - 1) // ps
                        start = seq_len // ps * ps + t * pages * ps + last
                    kv_indices[off + seq_len:off + seq_len + it] = table[row + start:row + start + it]
                    zid = b * topk + t
                    if zid == 0:
                        zid = bs * topk
                    kv_indptr[sp * it0 + zid] = int(positions[:zid].sum()) + zid * it
    return None


def fill_bonus_tokens(grid, a) -> object:
    """``bonus[i] = accept_tokens[i * stride + accept_lens[i] - 1]``."""
    with device_kernel("fill_bonus_tokens", (a["accept_tokens"], a["accept_lens"]),
                       (a["bonus_tokens_ptr"],)):
        toks, lens = _flat(a["accept_tokens"]), _np(a["accept_lens"])
        out, stride = _flat(a["bonus_tokens_ptr"]), int(a["accept_stride"])
        for i in range(_grid(grid, a)[0]):
            out[i] = toks[stride * i + int(lens[i]) - 1]
    return None


def build_tree(grid, a) -> object:
    """EAGLE's tree for each request: retrieve indices, next-token/sibling links,
    positions and the tree mask (full or query-length layout), from the selected
    draft indices and their parents; the kernel's own loops, per request."""
    names = ("parent_list_ptr", "selected_index_ptr", "verified_seq_len_ptr",
             "seq_len_prefix_sum_ptr")
    outs = ("tree_mask_ptr", "positions_ptr", "retrieve_index_ptr", "retrieve_next_token_ptr",
            "retrieve_next_sibling_ptr")
    with device_kernel("sgl_build_tree_kernel_efficient_triton", _tensors(a, names),
                       _tensors(a, outs)):
        parent, sel = _flat(a["parent_list_ptr"]), _flat(a["selected_index_ptr"])
        seq, prefix = _np(a["verified_seq_len_ptr"]), _np(a["seq_len_prefix_sum_ptr"])
        mask, pos = _flat(a["tree_mask_ptr"]), _flat(a["positions_ptr"])
        ridx, rnext = _flat(a["retrieve_index_ptr"]), _flat(a["retrieve_next_token_ptr"])
        rsib = _flat(a["retrieve_next_sibling_ptr"])
        topk, depth, n = int(a["topk"]), int(a["depth"]), int(a["draft_token_num"])
        mode, ps, ss = int(a["tree_mask_mode"]), int(a["parent_list_stride"]), \
            int(a["selected_index_stride"])

        def parent_pos(b: int, i: int):
            """(found, position) of the parent of selected token i, as the kernel
            searches it: position 0 is the root."""
            ptb = int(sel[b * ss + i]) // topk
            if ptb == 0:
                return True, -1
            ptok = int(parent[b * ps + ptb])
            for pp in range(n - 1):
                if int(sel[b * ss + pp]) == ptok:
                    return True, pp
            return False, 0

        for b in range(_grid(grid, a)[0]):
            seq_len, pre = int(seq[b]), int(prefix[b])
            tree_idx = n * n * b + pre * n
            pos[b * n] = seq_len
            base = b * n
            for i in range(n - 1, 0, -1):
                ridx[base + i] = base + i
                found, p = parent_pos(b, i - 1)
                if found:
                    slot = base + (0 if p < 0 else p + 1)
                    nxt = int(rnext[slot])
                    rnext[slot] = i
                    if nxt != -1:
                        rsib[base + i] = nxt
            ridx[base] = base
            for x in range(n):
                if mode == 0:
                    t = tree_idx + (seq_len + n) * x + seq_len + 1
                else:
                    t = n * n * b + n * x + 1
                mask[t - 1] = 1
                mask[t:t + n - 1] = 0
                if x > 0:
                    cur, position, go = x - 1, 0, True
                    for _ in range(depth):
                        if not go:
                            break
                        position += 1
                        mask[t + cur] = 1
                        found, p = parent_pos(b, cur)
                        if not found or p < 0:
                            go = False
                        else:
                            cur = p
                    pos[b * n + x] = position + seq_len
    return None


def verify_tree_greedy(grid, a) -> object:
    """Greedy tree verify per request: walk from the root, at each depth take the
    first child (then its siblings) whose draft token is the target's prediction;
    accepted indices, their count (bonus excluded) and the predictions along the
    path, the kernel's loops per request."""
    names = ("candidates_ptr", "retrieve_index_ptr", "retrieve_next_token_ptr",
             "retrieve_next_sibling_ptr", "target_predict_ptr")
    outs = ("predicts_ptr", "accept_index_ptr", "accept_token_num_ptr")
    with device_kernel("verify_tree_greedy_kernel_triton", _tensors(a, names), _tensors(a, outs)):
        pred, acc_idx = _flat(a["predicts_ptr"]), _flat(a["accept_index_ptr"])
        acc_num, cand = _flat(a["accept_token_num_ptr"]), _flat(a["candidates_ptr"])
        ridx, rnext = _flat(a["retrieve_index_ptr"]), _flat(a["retrieve_next_token_ptr"])
        rsib, target = _flat(a["retrieve_next_sibling_ptr"]), _flat(a["target_predict_ptr"])
        spec, n = int(a["num_speculative_tokens"]), int(a["num_draft_tokens"])
        for b in range(_grid(grid, a)[0]):
            last = int(ridx[b * n])
            acc_idx[b * spec] = last
            num, cur = 0, 0
            for j in range(1, spec):
                cur = int(rnext[b * n + cur])
                tok = int(target[last])
                found = 0
                for _ in range(n):
                    if cur == -1:
                        found = -1
                        break
                    k = b * n + cur
                    if int(cand[k]) == tok:
                        pred[last] = tok
                        num += 1
                        acc_idx[b * spec + num] = ridx[k]
                        last = int(ridx[k])
                        found = 1
                        break
                    cur = int(rsib[k])
                if found != 1:
                    break
            acc_num[b] = num
            pred[last] = target[last]
    return None


def compute_position(grid, a) -> object:
    """Request ``i``'s new tokens sit at positions ``prefix_i .. prefix_i + len_i - 1``,
    packed in batch order from ``extend_start_loc[i]`` (the running sum of lengths)."""
    with device_kernel("compute_position_kernel", (a["extend_prefix_lens"], a["extend_seq_lens"]),
                       (a["positions"], a["extend_start_loc"])):
        pos, start = _flat(a["positions"]), _flat(a["extend_start_loc"])
        lens = _np(a["extend_seq_lens"]).astype(np.int64)
        pre = _np(a["extend_prefix_lens"]) if a["has_prefix"] else None
        at = 0
        for i in range(_grid(grid, a)[0]):
            n = int(lens[i])
            p = int(pre[i]) if pre is not None else 0
            pos[at:at + n] = np.arange(p, p + n)
            start[i] = at
            at += n
    return None


def write_req_to_token_pool(grid, a) -> object:
    """Request ``i``'s table row gets its prefix slots (``pre_lens[i]`` int64 values at
    the address ``prefix_tensors[i]``) then its new slots (``out_cache_loc`` packed in
    batch order). The prefix tensors are reached through raw addresses, as the kernel
    reaches them: their reads are not declared."""
    import ctypes
    reads = (a["req_pool_indices"], a["prefix_tensors"], a["pre_lens"], a["seq_lens"],
             a["extend_lens"], a["out_cache_loc"])
    with device_kernel("write_req_to_token_pool_triton", reads, (a["req_to_token_ptr"],)):
        table, stride = _flat(a["req_to_token_ptr"]), int(a["req_to_token_ptr_stride"])
        rows, ptrs = _np(a["req_pool_indices"]), _np(a["prefix_tensors"])
        pre, seq = _np(a["pre_lens"]), _np(a["seq_lens"])
        ext, locs = _np(a["extend_lens"]).astype(np.int64), _flat(a["out_cache_loc"])
        for i in range(_grid(grid, a)[0]):
            base, p, n = int(rows[i]) * stride, int(pre[i]), int(seq[i]) - int(pre[i])
            if p > 0:
                src = ctypes.cast(int(ptrs[i]), ctypes.POINTER(ctypes.c_int64))
                table[base:base + p] = np.ctypeslib.as_array(src, shape=(p,))
            at = int(ext[:i].sum())
            if n > 0:
                table[base + p:base + p + n] = locs[at:at + n]
    return None


def get_last_loc(grid, a) -> object:
    """Each request's last prefix slot: ``result[i] = table[row_i, prefix_i - 1]``, or
    -1 without a prefix (paged allocation continues from it)."""
    reads = (a["req_to_token"], a["req_pool_indices_tensor"], a["prefix_lens_tensor"])
    with device_kernel("get_last_loc_kernel", reads, (a["result"],)):
        table, stride = _flat(a["req_to_token"]), int(a["req_to_token_stride"])
        rows, pre = _np(a["req_pool_indices_tensor"]), _np(a["prefix_lens_tensor"])
        out = _flat(a["result"])
        for i in range(int(a["num_tokens"])):
            p = int(pre[i])
            out[i] = table[int(rows[i]) * stride + p - 1] if p > 0 else -1
    return None


KERNELS: Dict[str, Callable] = {
    "sglang.kernels.ops.attention.position:compute_position_kernel": compute_position,
    "sglang.kernels.ops.memory.common:write_req_to_token_pool_triton": write_req_to_token_pool,
    "sglang.kernels.ops.memory.common:get_last_loc_kernel": get_last_loc,
    "sglang.kernels.ops.attention.kv_indices:create_flashinfer_kv_indices_triton":
        create_flashinfer_kv_indices,
    "sglang.kernels.ops.speculative.gather_spec_extras:_gather_rows_kernel": gather_rows,
    "sglang.kernels.ops.speculative.cache_locs:assign_draft_cache_locs_contiguous":
        assign_draft_cache_locs,
    "sglang.kernels.ops.speculative.cache_locs:assign_extend_cache_locs": assign_extend_cache_locs,
    "sglang.kernels.ops.speculative.cache_locs:assign_extend_cache_locs_uniform":
        assign_extend_cache_locs_uniform,
    "sglang.kernels.ops.speculative.cache_locs:generate_draft_decode_kv_indices":
        draft_decode_kv_indices,
    "sglang.kernels.ops.speculative.eagle:fill_bonus_tokens": fill_bonus_tokens,
    "sglang.kernels.ops.speculative.spec_tree:sgl_build_tree_kernel_efficient_triton":
        build_tree,
    "sglang.kernels.ops.speculative.spec_tree:verify_tree_greedy_kernel_triton":
        verify_tree_greedy,
}


# -- attention -----------------------------------------------------------------------------
def _unsupported(what: str) -> None:
    raise NotImplementedError(f"the CPU attention twin does not implement {what} "
                              f"(the target's tiny models never use it)")


def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits,
                         attn_lse, num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale,
                         logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=False,
                         use_pdl=False, page_size: int = 1, score_mod=None, aux_tensors=None,
                         **_lean):
    """One query per request: ``o[b] = softmax(q[b] . K^T * scale) V`` over the KV
    slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (grouped heads share a KV
    head). ``attn_logits``/``attn_lse`` are the kernels' scratch: not written."""
    if logit_cap and logit_cap > 0 or sinks is not None or xai_temperature_len > 0 \
            or has_mla or score_mod is not None:
        _unsupported("logit caps, sinks, XAI temperature, MLA or score mods")
    with device_kernel("decode_attention_fwd", (q, k_buffer, v_buffer, kv_indptr, kv_indices),
                       (o,)):
        heads, kvh = q.shape[1], v_buffer.shape[-2]
        kb = k_buffer.reshape(-1, kvh, k_buffer.shape[-1])
        vb = v_buffer.reshape(-1, kvh, v_buffer.shape[-1])
        hmap = torch.arange(heads) // (heads // kvh)
        ptr, idx = _np(kv_indptr), torch.from_numpy(_np(kv_indices).astype(np.int64))
        scale = float(sm_scale) * float(k_scale)
        for b in range(q.shape[0]):
            locs = idx[int(ptr[b]):int(ptr[b + 1])]
            k = kb[locs][:, hmap].float()                       # [n, H, D]
            v = vb[locs][:, hmap].float()
            s = (k * q[b].float()[None]).sum(-1) * scale        # [n, H]
            p = torch.softmax(s, dim=0)
            o[b] = ((p[:, :, None] * v).sum(0) * float(v_scale)).to(o.dtype)


def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer,
                         qo_indptr, kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr,
                         max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
                         skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None,
                         window_kv_offsets=None, xai_temperature_len=-1, lse_extend=None,
                         skip_prefix=False, skip_extend=False, page_size: int = 1,
                         score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None,
                         identity_kv_indices: bool = False):
    """Request ``b``'s ``m`` new tokens (``qo_indptr[b]..``) attend to its ``n`` prefix
    KV slots (``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``) and to the new tokens, with
    the kernel's masks (``_fwd_kernel``), new token ``i`` and key ``j``:

    * prefix: all, under the custom mask's prefix columns unless
      ``skip_prefix_custom_mask``; with a sliding window ``W > 0``, ``n + i <= j + W``
      (the slots are the window's: positions are relative to its first slot);
    * new tokens: under ``custom_mask`` (row ``i`` of a row-major ``[m, off + n + m]``
      block from ``mask_indptr[b]``, ``off = window_kv_offsets[b]`` with a window, the
      columns from ``off`` on read), else ``j <= i`` when causal, else all; with a
      window ``i <= j + W`` (and ``j <= i + W`` when not causal).

    Prefix scores are scaled by ``sm_scale * k_scale`` and prefix values by
    ``v_scale``, new-token ones by ``sm_scale`` alone, as the kernel does; a row
    with no key left is zero. A causal launch with a custom mask that opens a later
    token is refused: the kernel's tiles would cut it at a block edge."""
    if logit_cap and logit_cap > 0 or sinks is not None \
            or xai_temperature_len > 0 or score_mod is not None or lse_extend is not None \
            or skip_prefix or skip_extend:
        _unsupported("logit caps, sinks, XAI temperature, score mods, "
                     "LSE outputs or split prefix/extend passes")
    window = int(sliding_window_size)
    reads = [q_extend, k_extend, v_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
             kv_indices, custom_mask, mask_indptr]
    if window > 0 and custom_mask is not None:
        reads.append(window_kv_offsets)
    with device_kernel("extend_attention_fwd", reads, (o_extend,)):
        heads, kvh = q_extend.shape[1], k_extend.shape[1]
        sm = float(sm_scale or 1.0 / (q_extend.shape[-1] ** 0.5))
        kb = k_buffer.reshape(-1, kvh, k_buffer.shape[-1])
        vb = v_buffer.reshape(-1, kvh, v_buffer.shape[-1])
        hmap = torch.arange(heads) // (heads // kvh)
        qo, kp = _np(qo_indptr), _np(kv_indptr)
        idx = torch.from_numpy(_np(kv_indices).astype(np.int64))
        cm = _np(custom_mask) if custom_mask is not None else None
        mp = _np(mask_indptr) if custom_mask is not None else None
        offs = _np(window_kv_offsets) if window > 0 and cm is not None else None
        for b in range(qo_indptr.shape[0] - 1):
            a, e = int(qo[b]), int(qo[b + 1])
            m = e - a
            if m == 0:
                continue
            p0, p1 = int(kp[b]), int(kp[b + 1])
            locs = torch.arange(p0, p1) if identity_kv_indices else idx[p0:p1]
            n = p1 - p0
            i = torch.arange(m)[:, None]
            jp, je = torch.arange(n)[None, :], torch.arange(m)[None, :]
            allow_p = torch.ones(m, n, dtype=torch.bool)
            if cm is not None:
                off = int(offs[b]) if offs is not None else 0
                o0 = int(mp[b])
                rows = torch.from_numpy(cm[o0:o0 + m * (off + n + m)].reshape(m, off + n + m)
                                        != 0)[:, off:]
                allow_e = rows[:, n:].clone()
                if not skip_prefix_custom_mask:
                    allow_p &= rows[:, :n]
                if is_causal and bool((allow_e & (je > i)).any()):
                    _unsupported("a causal launch whose custom mask opens a later token")
            elif is_causal:
                allow_e = je <= i
            else:
                allow_e = torch.ones(m, m, dtype=torch.bool)
            if window > 0:
                allow_p &= n + i <= jp + window
                allow_e &= i <= je + window
                if not is_causal:
                    allow_e &= je <= i + window
            q = q_extend[a:e].float()
            sp = torch.einsum("qhd,khd->qhk", q, kb[locs][:, hmap].float()) * (sm * float(k_scale))
            se = torch.einsum("qhd,khd->qhk", q, k_extend[a:e][:, hmap].float()) * sm
            s = torch.cat([sp.masked_fill(~allow_p[:, None, :], float("-inf")),
                           se.masked_fill(~allow_e[:, None, :], float("-inf"))], dim=-1)
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)       # an empty row: zero
            v = torch.cat([vb[locs][:, hmap].float() * float(v_scale),
                           v_extend[a:e][:, hmap].float()])
            o_extend[a:e] = torch.einsum("qhk,khd->qhd", p, v).to(o_extend.dtype)


ATTENTION = {"decode_attention_fwd": decode_attention_fwd,
             "extend_attention_fwd": extend_attention_fwd}


# -- installing ------------------------------------------------------------------------------
@contextlib.contextmanager
def installed(backends=(), launches: "Launches | None" = None) -> Iterator[Launches]:
    """Route Triton launches to their twins (others run interpreted, as device kernels
    reading and writing every tensor argument) and bind the attention twins on
    ``backends`` (objects carrying ``decode_attention_fwd`` / ``extend_attention_fwd``),
    for the duration of the block."""
    saved = []
    for be in backends:
        for name, fn in ATTENTION.items():
            if name in getattr(be, "__dict__", {}):
                saved.append((be, name, be.__dict__[name]))
                setattr(be, name, fn)
    try:
        with routed(KERNELS, {}, launches) as counts:
            yield counts
    finally:
        for be, name, fn in reversed(saved):
            setattr(be, name, fn)

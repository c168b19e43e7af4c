"""Exact CPU twins of the Triton code vLLM's V2 model runner launches.

vLLM 0.33.0 has no CPU build of its V2 runner's kernels or of the CUDA attention
path: on the CPU platform it routes attention to ``CPU_ATTN``, whose C++ ops the
CUDA wheel does not carry. The real runner here takes the CUDA platform's Triton
attention backend (``TRITON_ATTN``), with its two entry points computed by the
twins below; the runner's own Triton kernels run through Triton's interpreter, each
declared by the tensors it reads and writes (``ACCESSES``), or by a twin
(``KERNELS``). Tested against the interpreted kernels
(``tests/targets/test_vllm_twins.py``).

Under ``watch`` each twin is one device kernel on the current stream reading its
inputs and writing its outputs (``device_kernel``); it reads raw memory with NumPy
or torch inside that kernel and allocates nothing there that outlives it.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator

import torch

from overlapcheck.watch.kernel import device_kernel

from .. import triton_launch as TL


def _unsupported(what: str) -> None:
    raise NotImplementedError(f"the CPU attention twin does not implement {what} "
                              f"(the target's tiny model never uses it)")


# -- attention: vllm/v1/attention/ops -------------------------------------------------------
def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale=None, v_scale=None):
    """``triton_reshape_and_cache_flash`` (NHD layout, unquantized cache): token ``i``'s
    key and value go to block ``slot // block_size``, offset ``slot % block_size``;
    a negative slot (padding) is skipped."""
    if kv_cache_dtype not in ("auto", None) or key_cache.dtype != key.dtype:
        _unsupported(f"a quantized KV cache ({kv_cache_dtype})")
    if key_cache.dim() != 4:
        _unsupported("the head-major KV cache layout")
    with device_kernel("reshape_and_cache_kernel_flash", (key, value, slot_mapping),
                       (key_cache, value_cache)):
        n = slot_mapping.shape[0]
        slots = slot_mapping[:n].to(torch.int64)
        keep = (slots >= 0).nonzero().flatten()
        bs = key_cache.shape[1]
        s = slots[keep]
        key_cache[s // bs, s % bs] = key[keep]
        value_cache[s // bs, s % bs] = value[keep]


def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                      softmax_scale, causal, window_size, block_table, softcap, q_descale,
                      k_descale, v_descale, seq_threshold_3D=None, num_par_softmax_segments=None,
                      softmax_segm_output=None, softmax_segm_max=None,
                      softmax_segm_expsum=None, alibi_slopes=None, output_scale=None,
                      qq_bias=None, sinks=None, mm_prefix_range=None, rswa_prefix_lens=None,
                      rswa_window=None, use_alibi_sqrt=False, kv_quant_mode=None,
                      k_scale_cache=None, v_scale_cache=None, chunk_lookback=-1, use_td=False,
                      mm_prefix_clamp_sliding_window=False):
    """``unified_attention`` over a paged KV cache: sequence ``i``'s queries
    ``q[cu_seqlens_q[i]:cu_seqlens_q[i+1]]`` are its last tokens, at positions
    ``seqused_k[i] - len .. seqused_k[i] - 1``; each attends (causally) to the
    positions up to its own, read through ``block_table[i]`` from ``k``/``v``
    (``[blocks, block_size, kv_heads, head_size]``), a query head ``h`` to KV head
    ``h // (heads / kv_heads)``: ``out = softmax(q . K^T * scale) V``. The 3D
    kernel's split-softmax scratch (``softmax_segm_*``) is the kernels' own: not
    written. Computed per sequence in float32; floats round unlike a GPU's."""
    if (alibi_slopes is not None or sinks is not None or qq_bias is not None
            or mm_prefix_range is not None or rswa_prefix_lens is not None
            or output_scale is not None or (softcap or 0) > 0
            or tuple(window_size or (-1, -1)) != (-1, -1) or chunk_lookback not in (-1, 0)
            or k_scale_cache is not None or q_descale is not None
            or isinstance(causal, torch.Tensor) or not causal):
        _unsupported("ALiBi, sinks, prefix ranges, windows, soft caps, quantized caches "
                     "or non-causal attention")
    reads = (q, k, v, cu_seqlens_q, seqused_k, block_table, k_descale, v_descale)
    with device_kernel("unified_attention", reads, (out,)):
        heads, kvh = q.shape[1], k.shape[2]
        bs = k.shape[1]
        hmap = torch.arange(heads) // (heads // kvh)
        cu = TL.as_np(cu_seqlens_q).tolist()
        lens = TL.as_np(seqused_k).tolist()
        for i in range(len(cu) - 1):
            a, e = cu[i], cu[i + 1]
            m, n = e - a, lens[i]
            if m == 0 or n == 0:
                continue
            pos = torch.arange(n)
            blocks = block_table[i, pos // bs].to(torch.int64)
            kk = k[blocks, pos % bs][:, hmap].float()                  # [n, H, D]
            vv = v[blocks, pos % bs][:, hmap].float()
            ks = float(k_descale[i, 0]) if k_descale is not None else 1.0
            vs = float(v_descale[i, 0]) if v_descale is not None else 1.0
            s = torch.einsum("qhd,khd->qhk", q[a:e].float(), kk) * (float(softmax_scale) * ks)
            qpos = torch.arange(n - m, n)
            allow = pos[None, :] <= qpos[:, None]                        # [m, n]
            s = s.masked_fill(~allow[:, None, :], float("-inf"))
            p = torch.softmax(s, dim=-1)
            out[a:e] = (torch.einsum("qhk,khd->qhd", p, vv) * vs).to(out.dtype)


#: module -> name -> twin: the attention entry points, replaced where the Triton
#: backend imported them
FUNCTIONS = {
    "vllm.v1.attention.backends.triton_attn": {
        "unified_attention": unified_attention,
        "triton_reshape_and_cache_flash": reshape_and_cache_flash,
    },
}

# -- the runner's own kernels ---------------------------------------------------------------
def ngram_finalize(grid, a) -> object:
    """``_ngram_finalize_kernel``: per batch row ``b`` (request row ``r``), the best
    scan score over ``N_BLOCKS`` (``(n * (L + 1) + pos) + 1``, 0: no match) gives the
    draft start ``pos + n``; draft ``k`` is the request's token there (clamped to
    ``L - 1``) when the row sampled, a match exists and the token is within its
    length, else its last sampled token. (Triton's interpreter refuses the kernel's
    integer-typed load mask.)"""
    reads = TL.tensors(a, ("token_ids_ptr", "idx_mapping_ptr", "total_len_ptr",
                           "num_sampled_ptr", "last_sampled_ptr", "scratch_ptr"))
    with device_kernel("_ngram_finalize_kernel", reads, (a["drafts_ptr"],)):
        tokens, rows = TL.flat(a["token_ids_ptr"]), TL.as_np(a["idx_mapping_ptr"])
        total, sampled = TL.flat(a["total_len_ptr"]), TL.as_np(a["num_sampled_ptr"])
        last, scratch = TL.flat(a["last_sampled_ptr"]), TL.flat(a["scratch_ptr"])
        drafts = TL.flat(a["drafts_ptr"])
        L, nb, k = int(a["L"]), int(a["N_BLOCKS"]), int(a["K"])
        ts, ss = int(a["token_ids_stride"]), int(a["scratch_stride"])
        for b in range(TL.grid3(grid, a)[0]):
            r = int(rows[b])
            score = int(scratch[b * ss:b * ss + nb].max())
            has = score > 0
            s1 = score - 1
            n = s1 // (L + 1) if has else 0
            start = (s1 - n * (L + 1)) + n if has else 0
            avail = max(int(total[r]) - start, 0)
            ok = int(sampled[b]) > 0 and has
            for i in range(k):
                if ok and i < avail:
                    drafts[b * k + i] = int(tokens[r * ts + min(start + i, L - 1)])
                else:
                    drafts[b * k + i] = int(last[r])
    return None


#: the runner's own kernels with a twin (``"module:name" -> twin(grid, args)``)
KERNELS: Dict[str, object] = {
    "vllm.v1.worker.gpu.spec_decode.ngram.speculator:_ngram_finalize_kernel": ngram_finalize,
}


def _block_tables(a, pointees):
    """``_gather_block_tables_kernel``: the source tables are read and the
    destination tables written through address tables."""
    reads = [t for n, t in a.items() if isinstance(t, torch.Tensor)]
    return (reads + TL.pointed(a["src_block_table_ptrs"], pointees),
            TL.pointed(a["dst_block_table_ptrs"], pointees))


def _slot_mappings(a, pointees):
    reads = [t for n, t in a.items() if isinstance(t, torch.Tensor) and n != "slot_mappings_ptr"]
    return reads + TL.pointed(a["block_table_ptrs"], pointees), [a["slot_mappings_ptr"]]


def _apply_write(a, pointees):
    """``_apply_write_kernel``: one output tensor, or (``MULTI_GROUP``) the tensors of
    an address table."""
    if a.get("MULTI_GROUP"):
        reads = [t for n, t in a.items() if isinstance(t, torch.Tensor)]
        return reads, TL.pointed(a["output_ptr"], pointees)
    reads = [t for n, t in a.items() if isinstance(t, torch.Tensor) and n != "output_ptr"]
    return reads, [a["output_ptr"]]


_W = "vllm.v1.worker.gpu."
#: the runner's own kernels run interpreted: the parameters each stores to (its other
#: tensor arguments are read), from the kernels' ``tl.store`` targets in 0.33.0
ACCESSES: Dict[str, TL.Accesses] = {
    _W + "buffer_utils:_apply_write_kernel": _apply_write,
    _W + "block_table:_gather_block_tables_kernel": _block_tables,
    _W + "block_table:_compute_slot_mappings_kernel": _slot_mappings,
    _W + "input_batch:_prepare_prefill_inputs_kernel": ("input_ids_ptr", "next_prefill_tokens_ptr"),
    _W + "input_batch:_prepare_pos_seq_lens_kernel": ("pos_ptr", "seq_lens_ptr"),
    _W + "input_batch:_combine_sampled_and_draft_tokens_kernel": ("input_ids_ptr",
                                                                  "logits_indices_ptr"),
    _W + "input_batch:_get_num_sampled_and_rejected_kernel": ("num_sampled_ptr",
                                                              "num_rejected_ptr"),
    _W + "input_batch:_post_update_kernel": (
        "num_computed_tokens_ptr", "last_sampled_tokens_ptr", "output_bin_counts_ptr",
        "all_token_ids_ptr", "total_len_ptr", "draft_tokens_out_ptr"),
    _W + "input_batch:_expand_idx_mapping_kernel": ("expanded_idx_mapping_ptr",
                                                    "expanded_local_pos_ptr"),
    _W + "sample.gumbel:_gumbel_sample_kernel": ("local_argmax_ptr", "local_max_ptr"),
    _W + "spec_decode.ngram.speculator:_ngram_scan_kernel": ("scratch_ptr",),
    _W + "spec_decode.rejection_sampler:_gather_draft_sampled_kernel": ("draft_sampled_ptr",
                                                                         "pos_ptr"),
    _W + "spec_decode.rejection_sampler_utils:_compute_local_logits_stats_kernel": (
        "target_local_argmax_ptr", "target_local_max_ptr", "target_local_sumexp_ptr",
        "draft_local_max_ptr", "draft_local_sumexp_ptr"),
    _W + "spec_decode.rejection_sampler_utils:_rejection_kernel": (
        "sampled_ptr", "rejected_steps_ptr", "target_rejected_logsumexp_ptr",
        "draft_rejected_logsumexp_ptr"),
    _W + "spec_decode.rejection_sampler_utils:_resample_kernel": (
        "resampled_local_argmax_ptr", "resampled_local_max_ptr"),
    _W + "spec_decode.rejection_sampler_utils:_insert_resampled_kernel": (
        "num_sampled_ptr", "sampled_ptr"),
}


@contextlib.contextmanager
def installed(launches: "TL.Launches | None" = None,
              pointees=None) -> Iterator[TL.Launches]:
    """The attention twins in place and the runner's launches routed, for the block
    (``pointees``: the tensors the runner's address tables hold, by address)."""
    import importlib
    saved = []
    try:
        for modname, fns in FUNCTIONS.items():
            mod = importlib.import_module(modname)
            for name, fn in fns.items():
                saved.append((mod, name, getattr(mod, name)))
                setattr(mod, name, fn)
        with TL.routed(KERNELS, ACCESSES, launches, pointees) as counts:
            yield counts
    finally:
        for mod, name, fn in reversed(saved):
            setattr(mod, name, fn)

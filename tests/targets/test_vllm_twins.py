"""The CPU twins of vLLM's Triton code against the kernels themselves, run by Triton's
interpreter on the same seeded inputs (skipped where vLLM or Triton is missing):
the KV write and the ngram drafts exactly; attention to float rounding, against the
kernel and against its documented semantics; and the access
declarations of the runner's interpreted kernels against their stores.

Cost with vLLM: about 15-25 s (vLLM's import; the interpreted attention kernels)."""
import importlib

import pytest
import torch


@pytest.fixture(scope="module")
def vl():
    from overlapcheck.protocol.target import TargetUnavailable
    from overlapcheck.targets.vllm import env
    env.prepare_environment()       # TRITON_INTERPRET before vLLM's and Triton's import
    pytest.importorskip("vllm")
    pytest.importorskip("triton")
    try:
        env.load()
    except TargetUnavailable as e:
        pytest.skip(str(e))
    from triton.runtime.interpreter import InterpretedFunction
    ops = importlib.import_module("vllm.v1.attention.ops.triton_reshape_and_cache_flash")
    assert isinstance(ops.reshape_and_cache_kernel_flash, InterpretedFunction), \
        "vLLM's kernels must be interpreted functions (TRITON_INTERPRET=1 at import)"
    return {"cache": ops,
            "attn": importlib.import_module("vllm.v1.attention.ops.triton_unified_attention"),
            "ngram": importlib.import_module("vllm.v1.worker.gpu.spec_decode.ngram.speculator")}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _paged(g, blocks=6, bs=16, kvh=2, d=16):
    k = torch.randn(blocks, bs, kvh, d, generator=g)
    v = torch.randn(blocks, bs, kvh, d, generator=g)
    return k, v


def test_reshape_and_cache_flash(vl, monkeypatch):
    from overlapcheck.targets.vllm import twins
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    g = _gen(1)
    key, value = torch.randn(5, 2, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    slots = torch.tensor([3, 17, -1, 40, 95], dtype=torch.int64)
    caches = [_paged(_gen(2)) for _ in range(2)]
    one = torch.ones(1)
    vl["cache"].triton_reshape_and_cache_flash(key, value, *caches[0], slots, "auto", one, one)
    twins.reshape_and_cache_flash(key, value, *caches[1], slots, "auto", one, one)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])


@pytest.mark.parametrize("qlens,seqlens", [((1, 1, 1), (5, 17, 33)), ((3, 1, 6), (9, 20, 6))])
def test_unified_attention(vl, qlens, seqlens):
    """Against the interpreted kernels (the 2D/3D paths the launcher picks), and
    against what ``unified_attention`` documents, computed independently: each
    sequence's K/V gathered through its block table, its queries the last ``len``
    positions, causal attention by ``scaled_dot_product_attention`` with the KV heads
    repeated."""
    from overlapcheck.targets.vllm import twins
    g = _gen(3)
    k, v = _paged(g)
    heads, n = 4, sum(qlens)
    q = torch.randn(n, heads, 16, generator=g)
    cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seqlens, dtype=torch.int32)
    table = torch.tensor([[5, 0, 3], [1, 4, 2], [2, 5, 0]], dtype=torch.int32)
    scale = 16 ** -0.5
    desc = torch.ones(len(qlens), 2)
    out = torch.zeros(n, heads, 16)
    twins.unified_attention(q, k, v, out, cu, max(qlens), seq, max(seqlens), scale, True,
                            (-1, -1), table, 0, None, desc, desc)
    segs = 16
    kernel = torch.zeros(n, heads, 16)
    vl["attn"].unified_attention(
        q=q, k=k, v=v, out=kernel, cu_seqlens_q=cu, max_seqlen_q=max(qlens), seqused_k=seq,
        max_seqlen_k=max(seqlens), softmax_scale=scale, causal=True, window_size=(-1, -1),
        block_table=table, softcap=0, q_descale=None, k_descale=desc, v_descale=desc,
        seq_threshold_3D=0, num_par_softmax_segments=segs,
        softmax_segm_output=torch.empty(n, heads, segs, 16),
        softmax_segm_max=torch.empty(n, heads, segs),
        softmax_segm_expsum=torch.empty(n, heads, segs))
    torch.testing.assert_close(out, kernel, rtol=1e-5, atol=1e-5)
    for i, (m, s) in enumerate(zip(qlens, seqlens)):
        a = int(cu[i])
        kk = k[table[i].long()].reshape(-1, 2, 16)[:s].repeat_interleave(2, dim=1)
        vv = v[table[i].long()].reshape(-1, 2, 16)[:s].repeat_interleave(2, dim=1)
        mask = torch.arange(s)[None, :] <= torch.arange(s - m, s)[:, None]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[a:a + m].transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
            attn_mask=mask, scale=scale).transpose(0, 1)
        torch.testing.assert_close(out[a:a + m], ref, rtol=1e-5, atol=1e-5)


def test_ngram_finalize_kernel(vl, monkeypatch):
    """Against the interpreted kernel, its integer load mask cast to bool (the only
    thing the interpreter refuses in it)."""
    import triton.runtime.interpreter as interp

    from overlapcheck.targets import triton_launch
    from overlapcheck.targets.vllm import twins
    real_load = interp._interpreter.load
    monkeypatch.setattr(interp._interpreter, "load",
                        lambda p, m, o, d: real_load(p, m.astype(bool), o, d), raising=False)
    k = vl["ngram"]._ngram_finalize_kernel
    g = _gen(4)

    def make():
        tokens = torch.randint(0, 9, (4, 24), generator=_gen(4), dtype=torch.int32)
        rows = torch.tensor([2, 0, 3], dtype=torch.int64)
        total = torch.tensor([20, 5, 24, 11], dtype=torch.int32)
        sampled = torch.tensor([1, 0, 2], dtype=torch.int32)
        last = torch.tensor([7, 8, 9, 6], dtype=torch.int64)
        scratch = torch.tensor([[0, 13, 4], [0, 0, 0], [30, 2, 51]], dtype=torch.int64)
        drafts = torch.full((3, 3), -5, dtype=torch.int64)
        return tokens, rows, total, sampled, last, scratch, drafts

    def run(tokens, rows, total, sampled, last, scratch, drafts):
        k[(3,)](tokens, tokens.stride(0), rows, total, sampled, last, scratch,
                scratch.stride(0), drafts, 24, 3, K=3, K_PO2=4, N_BLOCKS_PO2=4)

    a, b = make(), make()
    run(*a)
    with triton_launch.routed(twins.KERNELS, {}) as n:
        run(*b)
    assert n.twin["_ngram_finalize_kernel"] == 1 and not n.interpreted
    assert torch.equal(a[-1], b[-1]), (a[-1], b[-1])
    del g


def test_declared_writes_are_the_kernels_store_targets(vl):
    """Each access declaration names parameters the kernel has and stores through."""
    import inspect
    import re

    from overlapcheck.targets.vllm import twins
    for key, decl in twins.ACCESSES.items():
        mod, name = key.split(":")
        fn = getattr(importlib.import_module(mod), name).fn
        src = inspect.getsource(fn)
        params = set(inspect.signature(fn).parameters)
        if callable(decl):
            continue
        stores = " ".join(re.findall(r"tl\.store\(\s*([^,]+)", src))
        for p in decl:
            assert p in params, (key, p)
            assert p in stores or f"{p}\n" in src, (key, p)
        for p in params:     # every pointer the kernel stores through is declared
            if p.endswith("_ptr") and re.search(rf"\b{p}\b", stores):
                assert p in decl or "token_ptr" in stores, (key, p)

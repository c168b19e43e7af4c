"""Helpers for the HF-family model tests: write a tiny HF-format directory, a dense
reference forward of the same architecture (plain torch ops, no paging), and a
paged KV harness that writes requests in chunks and reads their logits."""
from __future__ import annotations

import json
import os

import torch

from fake_models.hf import config as C
from fake_models.hf import weights as Wt


def write_dir(path, size="tiny-qwen3", part=0, seed=3, edit=None, cfg_edit=None):
    """An HF-format directory of ``SIZES[size][part]`` with seeded random weights;
    ``edit(tensors)`` and ``cfg_edit(doc)`` may break it on purpose."""
    cfg = C.SIZES[size][part]
    t = Wt.random_init(cfg, seed, f"test.{size}.{part}")
    t = {k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(i))
         if k.endswith("norm.weight") else v for i, (k, v) in enumerate(t.items())}
    if edit:
        edit(t)
    Wt.save(str(path), cfg, t)
    if cfg_edit:
        doc = json.load(open(os.path.join(path, "config.json")))
        cfg_edit(doc)
        json.dump(doc, open(os.path.join(path, "config.json"), "w"))
    return cfg, t


def reference_logits(cfg, t, toks):
    """Logits after every position of ``toks`` by a dense causal forward."""
    d, H, KV, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps, T = cfg.rms_norm_eps, len(toks)
    norm = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  # noqa: E731
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()
    rot = lambda x: x * cos[:, None] + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin[:, None]  # noqa: E731
    h = t["model.embed_tokens.weight"][torch.tensor(toks)]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        g = lambda n: t.get(p + n)  # noqa: E731
        x = norm(h, g("input_layernorm.weight"))
        lin = lambda n: x @ g(f"self_attn.{n}_proj.weight").T + (  # noqa: E731
            g(f"self_attn.{n}_proj.bias") if cfg.attention_bias else 0)
        q, k, v = lin("q").view(T, H, hd), lin("k").view(T, KV, hd), lin("v").view(T, KV, hd)
        if cfg.qk_norm:
            q, k = norm(q, g("self_attn.q_norm.weight")), norm(k, g("self_attn.k_norm.weight"))
        q, k = rot(q), rot(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, H * hd)
        h = h + a @ g("self_attn.o_proj.weight").T
        x = norm(h, g("post_attention_layernorm.weight"))
        m = torch.nn.functional.silu(x @ g("mlp.gate_proj.weight").T) * (x @ g("mlp.up_proj.weight").T)
        h = h + m @ g("mlp.down_proj.weight").T
    head = t["model.embed_tokens.weight"] if cfg.tie_word_embeddings else t["lm_head.weight"]
    return norm(h, t["model.norm.weight"]) @ head.T


class Paged:
    """Requests in a paged KV: request ``r`` position ``p`` lives in slot
    ``1 + r * width + (p * 7) % width`` (scattered, through the table)."""

    def __init__(self, model, n_req, width=64):
        self.model, self.width = model, width
        self.kv = torch.full((1 + n_req * width, model.kv_width), float("nan"))
        pos = torch.arange(width)
        self.table = torch.stack([1 + r * width + (pos * 7) % width for r in range(n_req)])

    def write(self, items):
        """``items``: (request, start, tokens) chunks, written in ONE call."""
        rows = torch.tensor([r for r, s, tk in items for _ in tk])
        pos = torch.tensor([s + i for r, s, tk in items for i in range(len(tk))])
        toks = torch.tensor([x for r, s, tk in items for x in tk])
        self.model.write_kv(self.kv, self.table, rows, pos, toks, rows)

    def logits(self, reqs, ctx):
        return self.model.target_logits(self.kv, self.table, torch.tensor(reqs), torch.tensor(ctx))

"""Train the ``trained`` target/draft pair on the synthetic corpus and write it as
HF-format directories (``OUT/target``, ``OUT/draft``: ``config.json`` +
``model.safetensors``); then report the mean accept length through the engine.

    python -m fake_models.train_pair --out fake_models/weights/trained --device cuda
    python -m fake_models.train_pair --out /tmp/pair --device cpu --steps 20   # smoke
    python -m fake_models.train_pair --report fake_models/weights/trained

Both are Qwen3-architecture decoders (``TARGET``, ``DRAFT``) trained with plain dense
torch modules whose parameter names are the HF names, so ``hf.weights.load`` reads
them back. Corpus, initialization and batch order derive from ``--seed``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from overlapcheck import seeds

from . import corpus
from .hf import weights as Wt
from .hf.config import DecoderConfig

VOCAB = 64
TARGET = DecoderConfig("Qwen3ForCausalLM", VOCAB, 192, 512, 4, 6, 2, 32, 10000.0, 1e-6, True,
                       False, True)
DRAFT = DecoderConfig("Qwen3ForCausalLM", VOCAB, 64, 128, 1, 2, 1, 32, 10000.0, 1e-6, True,
                      False, True)


class Dense(torch.nn.Module):
    """Training-time dense forward of a ``DecoderConfig`` (HF parameter names)."""

    def __init__(self, cfg: DecoderConfig, init: dict):
        super().__init__()
        self.cfg = cfg
        self.params = torch.nn.ParameterDict({k.replace(".", "|"): torch.nn.Parameter(v.clone())
                                              for k, v in init.items()})

    def tensors(self) -> dict:
        return {k.replace("|", "."): v.detach() for k, v in self.params.items()}

    def forward(self, toks: torch.Tensor) -> torch.Tensor:
        c, P = self.cfg, lambda n: self.params[n.replace(".", "|")]  # noqa: E731
        B, T = toks.shape
        H, KV, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        norm = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * w  # noqa: E731
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, device=toks.device).float() / hd))
        ang = torch.arange(T, device=toks.device).float()[:, None] * inv
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        rot = lambda x: x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin  # noqa: E731
        h = P("model.embed_tokens.weight")[toks]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            x = norm(h, P(p + "input_layernorm.weight"))
            q = (x @ P(p + "self_attn.q_proj.weight").T).view(B, T, H, hd).transpose(1, 2)
            k = (x @ P(p + "self_attn.k_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            v = (x @ P(p + "self_attn.v_proj.weight").T).view(B, T, KV, hd).transpose(1, 2)
            q = rot(norm(q, P(p + "self_attn.q_norm.weight")))
            k = rot(norm(k, P(p + "self_attn.k_norm.weight")))
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + a.transpose(1, 2).reshape(B, T, H * hd) @ P(p + "self_attn.o_proj.weight").T
            x = norm(h, P(p + "post_attention_layernorm.weight"))
            m = F.silu(x @ P(p + "mlp.gate_proj.weight").T) * (x @ P(p + "mlp.up_proj.weight").T)
            h = h + m @ P(p + "mlp.down_proj.weight").T
        return norm(h, P("model.norm.weight")) @ P("model.embed_tokens.weight").T


def train(cfg: DecoderConfig, name: str, seed: int, steps: int, device: str, batch: int = 128,
          length: int = 96, share: float = 0.7, lr: float = 3e-3, log=print) -> dict:
    """Train one decoder on the corpus; its HF-named CPU tensors."""
    model = Dense(cfg, Wt.random_init(cfg, seed, "train." + name)).to(device)
    succ, probs = corpus.transition_table(VOCAB, seed, share)
    g = torch.Generator().manual_seed(seeds.derive(seed, "batches", name) % (2 ** 63))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0 = time.time()
    for step in range(steps):
        for grp in opt.param_groups:   # warmup, then cosine
            grp["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        toks = corpus.sample_batch(succ, probs, batch, length, g).to(device)
        loss = F.cross_entropy(model(toks[:, :-1]).reshape(-1, VOCAB), toks[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"{name}: step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
    return {k: v.float().cpu() for k, v in model.tensors().items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fake_models.train_pair", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="output directory (target/ and draft/ are written there)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3000, help="target steps (draft: half)")
    ap.add_argument("--draft-steps", type=int, help="draft steps (default: half of --steps)")
    ap.add_argument("--batch", type=int, default=128, help="sequences per step")
    ap.add_argument("--length", type=int, default=96, help="tokens per sequence")
    ap.add_argument("--share", type=float, default=0.7,
                    help="corpus: share of contexts whose likeliest successor depends on one token")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.out:
        ap.error("--out is required")
    kw = dict(device=args.device, batch=args.batch, length=args.length, share=args.share)
    tgt = train(TARGET, "target", args.seed, args.steps, **kw)
    dsteps = args.draft_steps if args.draft_steps is not None else max(1, args.steps // 2)
    drf = train(DRAFT, "draft", args.seed, dsteps, **kw)
    Wt.save(os.path.join(args.out, "target"), TARGET, tgt)
    Wt.save(os.path.join(args.out, "draft"), DRAFT, drf)
    size = sum(os.path.getsize(os.path.join(args.out, p, "model.safetensors"))
               for p in ("target", "draft"))
    print(f"wrote {args.out} ({size / 2 ** 20:.1f} MiB); its accept figures: "
          f"python bench/accept_report.py {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

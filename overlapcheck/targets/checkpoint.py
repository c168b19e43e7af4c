"""The tiny Llama checkpoint of the real-engine targets: an HF-format directory
(``config.json`` and a ``model.safetensors``) written at first use into a private
scratch directory the target names, one per shape (vocabulary, context), rather than
shipped: it is a few hundred kilobytes of seeded numbers. SGLang's target
(``targets/sglang/checkpoint.py``, which adds its spec pairs) and vLLM's real runner
load it through their engines' own loaders; the golden references load the same file
into transformers.

The weights are drawn from a fixed-seed generator at a scale that keeps the logits
of order one (dummy weights, uniform in +-1e-3 with norm weights as small, give
logits so flat that float rounding picks the greedy token), so greedy decoding does
not hinge on the last bit of a sum whose order depends on the batch.
"""
from __future__ import annotations

import json
import os
from typing import Dict

HIDDEN, INTER, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2
SEED = 20261126


def config(vocab: int, context: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "vocab_size": vocab,
        "max_position_embeddings": context, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "torch_dtype": "float32", "bos_token_id": 0,
        "eos_token_id": vocab, "tie_word_embeddings": False,   # eos: never sampled
    }


def weights(vocab: int, out_scale: float = 1.0) -> Dict[str, "object"]:
    """HF-named float32 tensors, each linear weight N(0, 1/fan_in), the embedding
    N(0, 1), norms 1: the same for every call (a generator of its own, fixed seed).
    ``out_scale`` scales what each layer adds to the residual stream (its attention
    output and MLP down projections): the spec pair's target uses 0.5."""
    import torch
    g = torch.Generator().manual_seed(SEED)
    w = {"model.embed_tokens.weight": torch.randn(vocab, HIDDEN, generator=g)}
    for i in range(LAYERS):
        w.update(layer(g, f"model.layers.{i}.", out_scale))
    w["model.norm.weight"] = torch.ones(HIDDEN)
    w["lm_head.weight"] = linear(g, vocab, HIDDEN)
    return {k: v.contiguous() for k, v in w.items()}


def linear(g, out_f: int, in_f: int, scale: float = 1.0):
    import torch
    return torch.randn(out_f, in_f, generator=g) * (scale / in_f ** 0.5)


def layer(g, p: str, out_scale: float, input_norm: bool = True) -> Dict[str, "object"]:
    import torch
    head = HIDDEN // HEADS
    w = {p + "self_attn.q_proj.weight": linear(g, HEADS * head, HIDDEN),
         p + "self_attn.k_proj.weight": linear(g, KV_HEADS * head, HIDDEN),
         p + "self_attn.v_proj.weight": linear(g, KV_HEADS * head, HIDDEN),
         p + "self_attn.o_proj.weight": linear(g, HIDDEN, HEADS * head, out_scale),
         p + "mlp.gate_proj.weight": linear(g, INTER, HIDDEN),
         p + "mlp.up_proj.weight": linear(g, INTER, HIDDEN),
         p + "mlp.down_proj.weight": linear(g, HIDDEN, INTER, out_scale),
         p + "post_attention_layernorm.weight": torch.ones(HIDDEN)}
    if input_norm:
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
    return w


def model_dir(vocab: int, context: int, root: str) -> str:
    """The checkpoint directory for this shape under ``root`` (written once,
    atomically per file)."""
    return write(os.path.join(root, f"tiny-llama-v{vocab}-c{context}-s{SEED}"),
                  lambda: config(vocab, context), lambda: weights(vocab))


def write(path: str, make_config, make_weights) -> str:
    os.makedirs(path, exist_ok=True)
    cfg = os.path.join(path, "config.json")
    if not os.path.exists(cfg):
        tmp = f"{cfg}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(make_config(), f, indent=1, sort_keys=True)
        os.replace(tmp, cfg)
    st = os.path.join(path, "model.safetensors")
    if not os.path.exists(st):
        from safetensors.torch import save_file
        tmp = f"{st}.{os.getpid()}.tmp"
        save_file(make_weights(), tmp, metadata={"format": "pt"})
        os.replace(tmp, st)
    return path

"""The tiny Llama of the SGLang target: an HF-format directory (``config.json`` and a
``model.safetensors``) written at first use into a private scratch directory, one per
shape (vocabulary, context), rather than shipped: it is a few hundred kilobytes of
seeded numbers.

Every mode builds its scheduler for this shape. The fake worker never reads the
weights (SGLang fills them with ``load_format=dummy``); real-forward mode loads the
checkpoint through SGLang's own loader, and the golden reference (``golden.
LlamaGolden``) loads the same file into transformers' ``LlamaForCausalLM`` and decodes
one request at a time, with no engine.

The weights are drawn from a fixed-seed generator at a scale that keeps the logits
of order one (SGLang's dummy weights, uniform in +-1e-3 with norm weights as small,
give logits so flat that float rounding picks the greedy token), so greedy decoding
does not hinge on the last bit of a sum whose order depends on the batch.
"""
from __future__ import annotations

import json
import os
import tempfile
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


def weights(vocab: int) -> Dict[str, "object"]:
    """HF-named float32 tensors, each linear weight N(0, 1/fan_in), the embedding
    N(0, 1), norms 1: the same for every call (a generator of its own, fixed seed)."""
    import torch
    g = torch.Generator().manual_seed(SEED)
    head = HIDDEN // HEADS

    def linear(out_f: int, in_f: int):
        return torch.randn(out_f, in_f, generator=g) / in_f ** 0.5

    w = {"model.embed_tokens.weight": torch.randn(vocab, HIDDEN, generator=g)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = linear(HEADS * head, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = linear(KV_HEADS * head, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = linear(KV_HEADS * head, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = linear(HIDDEN, HEADS * head)
        w[p + "mlp.gate_proj.weight"] = linear(INTER, HIDDEN)
        w[p + "mlp.up_proj.weight"] = linear(INTER, HIDDEN)
        w[p + "mlp.down_proj.weight"] = linear(HIDDEN, INTER)
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    w["model.norm.weight"] = torch.ones(HIDDEN)
    w["lm_head.weight"] = linear(vocab, HIDDEN)
    return {k: v.contiguous() for k, v in w.items()}


def model_dir(vocab: int, context: int, root: str = "") -> str:
    """The checkpoint directory for this shape (written once, atomically per file)."""
    path = os.path.join(root or scratch_root(), f"tiny-llama-v{vocab}-c{context}-s{SEED}")
    os.makedirs(path, exist_ok=True)
    cfg = os.path.join(path, "config.json")
    if not os.path.exists(cfg):
        tmp = f"{cfg}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(config(vocab, context), f, indent=1, sort_keys=True)
        os.replace(tmp, cfg)
    st = os.path.join(path, "model.safetensors")
    if not os.path.exists(st):
        from safetensors.torch import save_file
        tmp = f"{st}.{os.getpid()}.tmp"
        save_file(weights(vocab), tmp, metadata={"format": "pt"})
        os.replace(tmp, st)
    return path


def scratch_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"overlapcheck-sglang-{os.getuid()}")

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

The real spec-v2 workers run a *pair* (``pair_dirs``): a target whose layers add a
scaled-down context term to each token's own embedding (so its greedy choice is
mostly a function of the last token, and often not), and an EAGLE head that predicts
that last-token choice from the embedding, with a small share of the target's hidden
state and of its own attention mixed in. The draft then agrees with the target often
enough for multi-token accept runs, and disagrees often enough for short ones.
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


def weights(vocab: int, out_scale: float = 1.0) -> Dict[str, "object"]:
    """HF-named float32 tensors, each linear weight N(0, 1/fan_in), the embedding
    N(0, 1), norms 1: the same for every call (a generator of its own, fixed seed).
    ``out_scale`` scales what each layer adds to the residual stream (its attention
    output and MLP down projections): the spec pair's target uses 0.5."""
    import torch
    g = torch.Generator().manual_seed(SEED)
    w = {"model.embed_tokens.weight": torch.randn(vocab, HIDDEN, generator=g)}
    for i in range(LAYERS):
        w.update(_layer(g, f"model.layers.{i}.", out_scale))
    w["model.norm.weight"] = torch.ones(HIDDEN)
    w["lm_head.weight"] = _linear(g, vocab, HIDDEN)
    return {k: v.contiguous() for k, v in w.items()}


def _linear(g, out_f: int, in_f: int, scale: float = 1.0):
    import torch
    return torch.randn(out_f, in_f, generator=g) * (scale / in_f ** 0.5)


def _layer(g, p: str, out_scale: float, input_norm: bool = True) -> Dict[str, "object"]:
    import torch
    head = HIDDEN // HEADS
    w = {p + "self_attn.q_proj.weight": _linear(g, HEADS * head, HIDDEN),
         p + "self_attn.k_proj.weight": _linear(g, KV_HEADS * head, HIDDEN),
         p + "self_attn.v_proj.weight": _linear(g, KV_HEADS * head, HIDDEN),
         p + "self_attn.o_proj.weight": _linear(g, HIDDEN, HEADS * head, out_scale),
         p + "mlp.gate_proj.weight": _linear(g, INTER, HIDDEN),
         p + "mlp.up_proj.weight": _linear(g, INTER, HIDDEN),
         p + "mlp.down_proj.weight": _linear(g, HIDDEN, INTER, out_scale),
         p + "post_attention_layernorm.weight": torch.ones(HIDDEN)}
    if input_norm:
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
    return w


#: the spec pair: what the target's layers add, and the EAGLE head's share of the
#: target's hidden state and of its own layer
PAIR_TARGET_SCALE, PAIR_HIDDEN_SHARE, PAIR_DRAFT_LAYER = 0.5, 0.1, 0.1


def eagle_config(vocab: int, context: int) -> dict:
    cfg = config(vocab, context)
    cfg.update(architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1)
    return cfg


def eagle_weights(vocab: int) -> Dict[str, "object"]:
    """The EAGLE head for the pair's target, in the names SGLang's
    ``LlamaForCausalLMEagle`` loads (``model.`` left out): ``fc`` maps [embedding,
    hidden] to the embedding plus a small share of the hidden state; one layer whose
    attention and MLP add a small share; no final norm (the head has none: the
    target's RMSNorm only scales, which keeps the argmax); the target's embedding and
    head (SGLang shares the target's anyway)."""
    import torch
    target = weights(vocab, PAIR_TARGET_SCALE)
    g = torch.Generator().manual_seed(SEED + 1)
    fc = torch.cat([torch.eye(HIDDEN), _linear(g, HIDDEN, HIDDEN, PAIR_HIDDEN_SHARE)], dim=1)
    w = {"fc.weight": fc, "fc.bias": torch.zeros(HIDDEN),
         "embed_tokens.weight": target["model.embed_tokens.weight"],
         "lm_head.weight": target["lm_head.weight"]}
    w.update(_layer(g, "layers.0.", PAIR_DRAFT_LAYER, input_norm=False))
    return {k: v.contiguous() for k, v in w.items()}


def model_dir(vocab: int, context: int, root: str = "") -> str:
    """The checkpoint directory for this shape (written once, atomically per file)."""
    return _write(os.path.join(root or scratch_root(), f"tiny-llama-v{vocab}-c{context}-s{SEED}"),
                  lambda: config(vocab, context), lambda: weights(vocab))


def pair_dirs(vocab: int, context: int, root: str = "") -> "tuple[str, str]":
    """(target, EAGLE draft) directories of the spec pair for this shape."""
    base = os.path.join(root or scratch_root(), f"pair-v{vocab}-c{context}-s{SEED}")
    target = _write(base + "-target", lambda: config(vocab, context),
                    lambda: weights(vocab, PAIR_TARGET_SCALE))
    draft = _write(base + "-eagle", lambda: eagle_config(vocab, context),
                   lambda: eagle_weights(vocab))
    return target, draft


def _write(path: str, make_config, make_weights) -> str:
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


def scratch_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"overlapcheck-sglang-{os.getuid()}")

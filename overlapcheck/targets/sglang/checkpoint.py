"""The checkpoints of the SGLang target: the tiny Llama (``overlapcheck/targets/
checkpoint.py``, shared with vLLM's real runner) under this target's scratch
directory, and the spec pairs of the real workers, each an HF-format directory
(``config.json`` and a ``model.safetensors``) written at first use, one per shape
(vocabulary, context), rather than shipped: a few hundred kilobytes of seeded numbers.

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

The frozen-KV MTP worker runs a Gemma4 pair (``mtp_pair_dirs``): a Gemma4 text target
whose first layer attends through a sliding window (its KV in SGLang's sliding-window
pool) and a Gemma4 assistant (the MTP draft) whose layers own no KV and read the
target's. Their weights follow the same recipe: the target's layers add a
post-normed context term to the scaled embedding of each token; the assistant
projects (embedding, target hidden state) back to mostly the embedding and ends in
the target's output head, so it predicts the target's last-token choice.
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict

from .. import checkpoint as shared

# the tiny Llama's shapes and recipe, shared with vLLM's real runner
from ..checkpoint import (HEADS, HIDDEN, INTER, KV_HEADS, LAYERS, SEED, config,  # noqa: F401
                          layer, linear, weights, write)

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
    fc = torch.cat([torch.eye(HIDDEN), linear(g, HIDDEN, HIDDEN, PAIR_HIDDEN_SHARE)], dim=1)
    w = {"fc.weight": fc, "fc.bias": torch.zeros(HIDDEN),
         "embed_tokens.weight": target["model.embed_tokens.weight"],
         "lm_head.weight": target["lm_head.weight"]}
    w.update(layer(g, "layers.0.", PAIR_DRAFT_LAYER, input_norm=False))
    return {k: v.contiguous() for k, v in w.items()}


# -- the Gemma4 pair of the frozen-KV MTP worker ---------------------------------------------
#: Gemma4 shapes: every head 16 wide (sliding, full, and the assistant's), a window of
#: 8 tokens (SGLang's window is one less: exclusive), two target layers
GEMMA_HEAD, GEMMA_WINDOW = 16, 8
GEMMA_LAYERS = ["sliding_attention", "full_attention"]
#: the post-norm weights of the target's layers (their share against the embedding,
#: whose RMS is sqrt(HIDDEN)) and of the assistant's, and the assistant's share of the
#: target's hidden state
MTP_TARGET_POST, MTP_DRAFT_POST, MTP_HIDDEN_SHARE = 2.0, 0.1, 0.1


def gemma_config(vocab: int, context: int) -> dict:
    """The Gemma4 text target (``Gemma4ForCausalLM``): no per-layer inputs, no MoE,
    rotary defaults of Gemma4, an output head of its own."""
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": GEMMA_HEAD,
        "global_head_dim": GEMMA_HEAD, "swa_head_dim": GEMMA_HEAD,
        "swa_num_key_value_heads": KV_HEADS, "num_hidden_layers": len(GEMMA_LAYERS),
        "layer_types": list(GEMMA_LAYERS), "sliding_window": GEMMA_WINDOW,
        "vocab_size": vocab, "max_position_embeddings": context,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
        "rms_norm_eps": 1e-6, "torch_dtype": "float32", "bos_token_id": 0,
        "eos_token_id": vocab, "pad_token_id": 0,      # eos: never sampled
        "tie_word_embeddings": False,
    }


def assistant_config(vocab: int, context: int) -> dict:
    """The Gemma4 assistant (``Gemma4AssistantForCausalLM``): one layer per target
    layer type, each reading the KV of the target's last layer of its type."""
    text = gemma_config(vocab, context)
    del text["architectures"]
    text.update(num_kv_shared_layers=len(GEMMA_LAYERS), tie_word_embeddings=True)
    return {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
            "backbone_hidden_size": HIDDEN, "text_config": text, "torch_dtype": "float32",
            "tie_word_embeddings": True}


def _gemma_layer(g, p: str, post: float, kv: bool = True) -> Dict[str, "object"]:
    import torch
    w = {p + "self_attn.q_proj.weight": linear(g, HEADS * GEMMA_HEAD, HIDDEN),
         p + "self_attn.o_proj.weight": linear(g, HIDDEN, HEADS * GEMMA_HEAD),
         p + "self_attn.q_norm.weight": torch.ones(GEMMA_HEAD),
         p + "mlp.gate_proj.weight": linear(g, INTER, HIDDEN),
         p + "mlp.up_proj.weight": linear(g, INTER, HIDDEN),
         p + "mlp.down_proj.weight": linear(g, HIDDEN, INTER),
         p + "input_layernorm.weight": torch.ones(HIDDEN),
         p + "pre_feedforward_layernorm.weight": torch.ones(HIDDEN),
         p + "post_attention_layernorm.weight": torch.full((HIDDEN,), post),
         p + "post_feedforward_layernorm.weight": torch.full((HIDDEN,), post),
         p + "layer_scalar": torch.ones(1)}
    if kv:
        w.update({p + "self_attn.k_proj.weight": linear(g, KV_HEADS * GEMMA_HEAD, HIDDEN),
                  p + "self_attn.v_proj.weight": linear(g, KV_HEADS * GEMMA_HEAD, HIDDEN),
                  p + "self_attn.k_norm.weight": torch.ones(GEMMA_HEAD)})
    return w


def gemma_weights(vocab: int) -> Dict[str, "object"]:
    """The target's HF-named tensors: embedding N(0, 1) (Gemma scales it by
    sqrt(hidden)), each layer's post-norms at ``MTP_TARGET_POST``, head N(0, 1/hidden)."""
    import torch
    g = torch.Generator().manual_seed(SEED + 2)
    w = {"model.embed_tokens.weight": torch.randn(vocab, HIDDEN, generator=g)}
    for i in range(len(GEMMA_LAYERS)):
        w.update(_gemma_layer(g, f"model.layers.{i}.", MTP_TARGET_POST))
    w["model.norm.weight"] = torch.ones(HIDDEN)
    w["lm_head.weight"] = linear(g, vocab, HIDDEN)
    return {k: v.contiguous() for k, v in w.items()}


def assistant_weights(vocab: int) -> Dict[str, "object"]:
    """The assistant's HF-named tensors: ``pre_projection`` keeps the token's
    embedding and a ``MTP_HIDDEN_SHARE`` of the target's hidden state; its layers
    (no K/V: they read the target's) add a small share; ``post_projection`` hands
    its normed state on as the next step's hidden state; its tied head is the
    target's output head."""
    import torch
    target = gemma_weights(vocab)
    g = torch.Generator().manual_seed(SEED + 3)
    w = {"pre_projection.weight": torch.cat(
            [torch.eye(HIDDEN), linear(g, HIDDEN, HIDDEN, MTP_HIDDEN_SHARE)], dim=1),
         "post_projection.weight": torch.eye(HIDDEN),
         "model.embed_tokens.weight": target["lm_head.weight"],
         "model.norm.weight": torch.ones(HIDDEN)}
    for i in range(len(GEMMA_LAYERS)):
        w.update(_gemma_layer(g, f"model.layers.{i}.", MTP_DRAFT_POST, kv=False))
    return {k: v.contiguous() for k, v in w.items()}


def mtp_pair_dirs(vocab: int, context: int, root: str = "") -> "tuple[str, str]":
    """(Gemma4 target, Gemma4 assistant) directories of the frozen-KV MTP pair."""
    base = os.path.join(root or scratch_root(), f"gemma4-mtp-v{vocab}-c{context}-s{SEED}")
    target = write(base + "-target", lambda: gemma_config(vocab, context),
                   lambda: gemma_weights(vocab))
    draft = write(base + "-assistant", lambda: assistant_config(vocab, context),
                  lambda: assistant_weights(vocab))
    return target, draft


def model_dir(vocab: int, context: int, root: str = "") -> str:
    """The tiny Llama's directory for this shape (written once, atomically per file)."""
    return shared.model_dir(vocab, context, root or scratch_root())


def pair_dirs(vocab: int, context: int, root: str = "") -> "tuple[str, str]":
    """(target, EAGLE draft) directories of the spec pair for this shape."""
    base = os.path.join(root or scratch_root(), f"pair-v{vocab}-c{context}-s{SEED}")
    target = write(base + "-target", lambda: config(vocab, context),
                   lambda: weights(vocab, PAIR_TARGET_SCALE))
    draft = write(base + "-eagle", lambda: eagle_config(vocab, context),
                  lambda: eagle_weights(vocab))
    return target, draft


def scratch_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"overlapcheck-sglang-{os.getuid()}")

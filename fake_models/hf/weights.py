"""HF tensor names and shapes of a decoder, and reading / writing / random-initializing
them. Tensors are kept by their HF names in float32 (HF layout: ``[out, in]``);
``decoder.Decoder`` transposes what it multiplies.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Dict, Tuple

import torch

from overlapcheck import seeds

from .config import DecoderConfig
from .errors import ModelError

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected(cfg: DecoderConfig) -> Dict[str, Tuple[int, ...]]:
    """Every tensor a checkpoint of ``cfg`` must hold, by HF name, with its shape."""
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out = {"model.embed_tokens.weight": (cfg.vocab_size, d), "model.norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                    p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
                    p + "post_attention_layernorm.weight": (d,)})
        if cfg.attention_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
        if cfg.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    return out


def load(path: str, cfg: DecoderConfig) -> Dict[str, torch.Tensor]:
    """All tensors of ``path/*.safetensors`` as float32 CPU tensors, checked against
    ``expected(cfg)``: a missing, unexpected or misshapen tensor is a ``ModelError``."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise ModelError("loading a model directory needs the safetensors package") from None
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelError(f"{path}: no *.safetensors file")
    want, got = expected(cfg), {}
    for fn in files:
        try:
            with safe_open(fn, framework="pt") as fh:
                for name in fh.keys():
                    if name.endswith(IGNORED_SUFFIXES) or (
                            name == "lm_head.weight" and cfg.tie_word_embeddings):
                        continue
                    if name not in want:
                        raise ModelError(f"{fn}: unexpected tensor {name!r} for {cfg.arch}")
                    t = fh.get_tensor(name)
                    if tuple(t.shape) != want[name]:
                        raise ModelError(f"{fn}: tensor {name!r} has shape {tuple(t.shape)}, "
                                         f"expected {want[name]}")
                    got[name] = t.float().contiguous()
        except ModelError:
            raise
        except Exception as e:   # safetensors raises its own error types on bad files
            raise ModelError(f"{fn}: cannot read safetensors ({str(e).splitlines()[0]})") from None
    missing = [n for n in want if n not in got]
    if missing:
        raise ModelError(f"{path}: missing tensor {missing[0]!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return got


def random_init(cfg: DecoderConfig, seed: int, name: str) -> Dict[str, torch.Tensor]:
    """Seeded weights of ``cfg`` (normal, std ``1/sqrt(fan_in)``; norms at one), each
    tensor from its own generator ``seeds.derive(seed, name, tensor)``."""
    out = {}
    for tname, shape in expected(cfg).items():
        if tname.endswith("norm.weight"):
            out[tname] = torch.ones(shape)
            continue
        g = torch.Generator().manual_seed(seeds.derive(seed, name, tname) % (2 ** 63))
        std = 0.02 if tname.endswith("bias") or "embed" in tname else shape[-1] ** -0.5
        out[tname] = torch.randn(shape, generator=g) * std
    return out


def save(path: str, cfg: DecoderConfig, tensors: Dict[str, torch.Tensor]) -> None:
    """Write an HF-format directory: ``config.json`` and ``model.safetensors``."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg.to_json(), fh, indent=1, sort_keys=True)
        fh.write("\n")
    save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"))

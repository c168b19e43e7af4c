"""HF ``config.json`` of the Llama / Qwen2 / Qwen3 decoder family, parsed and checked.

``DecoderConfig`` holds exactly what the paged decoder needs. ``parse`` accepts a dict
read from ``config.json`` (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``); anything the decoder would silently get wrong (sliding windows,
unknown RoPE scaling, MLP biases, a non-SiLU activation) is a ``ModelError``.
``SIZES`` names real model shapes for random initialization.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Optional

from .errors import ModelError

ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


@dataclass(frozen=True)
class DecoderConfig:
    """Shapes and switches of one decoder (one HF checkpoint)."""

    arch: str                      # key of ARCHS
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False   # q/k/v biases (always on for Qwen2)
    qk_norm: bool = False          # per-head RMSNorm of q and k (Qwen3)
    rope_llama3: Optional[tuple] = None   # (factor, low_freq_factor, high_freq_factor, original_max)

    @property
    def family(self) -> str:
        return ARCHS[self.arch]

    def params(self) -> int:
        """Parameter count (the lm head counted once when tied)."""
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * h, self.num_key_value_heads * h
        layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
        layer += (q + 2 * kv) * self.attention_bias + 2 * h * self.qk_norm
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + head + d + self.num_hidden_layers * layer

    def to_json(self) -> dict:
        """An HF ``config.json`` document for this decoder."""
        doc = {"architectures": [self.arch], "model_type": self.family,
               "hidden_act": "silu", "torch_dtype": "float32"}
        for k, v in asdict(self).items():
            if k not in ("arch", "qk_norm", "rope_llama3"):
                doc[k] = v
        if self.rope_llama3:
            f, lo, hi, orig = self.rope_llama3
            doc["rope_scaling"] = {"rope_type": "llama3", "factor": f, "low_freq_factor": lo,
                                   "high_freq_factor": hi, "original_max_position_embeddings": orig}
        return doc


def _int(doc, key, where, default=None) -> int:
    v = doc.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ModelError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def parse(doc, where: str = "config.json") -> DecoderConfig:
    """A ``DecoderConfig`` from a ``config.json`` document; ``ModelError`` otherwise."""
    if not isinstance(doc, dict):
        raise ModelError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    archs = doc.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHS:
        raise ModelError(f"{where}: unsupported architecture {archs!r} "
                         f"(supported: {', '.join(ARCHS)})")
    arch = archs[0]
    act = doc.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"{where}: unsupported hidden_act {act!r} (silu only)")
    if doc.get("mlp_bias"):
        raise ModelError(f"{where}: mlp_bias is not supported")
    if doc.get("use_sliding_window"):
        raise ModelError(f"{where}: sliding-window attention is not supported")
    d, heads = _int(doc, "hidden_size", where), _int(doc, "num_attention_heads", where)
    kv = _int(doc, "num_key_value_heads", where, heads)
    hd = doc.get("head_dim")
    hd = _int(doc, "head_dim", where) if hd is not None else d // heads
    if heads % kv or hd % 2 or hd < 2:
        raise ModelError(f"{where}: num_attention_heads ({heads}) must be a multiple of "
                         f"num_key_value_heads ({kv}) and head_dim ({hd}) even")
    cfg = DecoderConfig(
        arch=arch, vocab_size=_int(doc, "vocab_size", where), hidden_size=d,
        intermediate_size=_int(doc, "intermediate_size", where),
        num_hidden_layers=_int(doc, "num_hidden_layers", where), num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=hd,
        rope_theta=float(doc.get("rope_theta", 10000.0)),
        rms_norm_eps=float(doc.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
        attention_bias=bool(doc.get("attention_bias", False)) or arch == "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        rope_llama3=_rope_scaling(doc.get("rope_scaling"), where))
    return cfg


def _rope_scaling(rs, where):
    if rs is None:
        return None
    kind = rs.get("rope_type", rs.get("type")) if isinstance(rs, dict) else None
    if kind == "default":
        return None
    if kind != "llama3":
        raise ModelError(f"{where}: unsupported rope_scaling {rs!r} (llama3 or none)")
    try:
        return (float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"]),
                int(rs["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{where}: incomplete llama3 rope_scaling {rs!r}") from None


def read(path: str) -> DecoderConfig:
    """Parse ``path/config.json``."""
    f = os.path.join(path, "config.json")
    try:
        with open(f) as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ModelError(f"{f}: no such file (a model directory needs config.json)") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{f}: cannot read JSON ({str(e).splitlines()[0]})") from None
    return parse(doc, f)


_QWEN3_06B = DecoderConfig("Qwen3ForCausalLM", 151936, 1024, 3072, 28, 16, 8, 128, 1e6, 1e-6,
                           True, False, True)
_LLAMA_1B = DecoderConfig("LlamaForCausalLM", 128256, 2048, 8192, 16, 32, 8, 64, 500000.0, 1e-5,
                          True, False, False, (32.0, 1.0, 4.0, 8192))
_QWEN2_05B = DecoderConfig("Qwen2ForCausalLM", 151936, 896, 4864, 24, 14, 2, 64, 1e6, 1e-6,
                           True, True, False)

# name -> (target, standalone draft). Drafts of real sizes are the family's smaller sibling
# shape cut to few layers, so a random pair shares the vocabulary.
SIZES = {
    "qwen3-0.6b": (_QWEN3_06B, replace(_QWEN3_06B, num_hidden_layers=2)),
    "llama-1b": (_LLAMA_1B, replace(_LLAMA_1B, num_hidden_layers=2)),
    "qwen2-0.5b": (_QWEN2_05B, replace(_QWEN2_05B, num_hidden_layers=2)),
    "tiny-qwen3": (DecoderConfig("Qwen3ForCausalLM", 64, 32, 64, 2, 4, 2, 8, 10000.0, 1e-6, True,
                                 False, True),
                   DecoderConfig("Qwen3ForCausalLM", 64, 16, 32, 1, 2, 1, 8, 10000.0, 1e-6, True,
                                 False, True)),
    "tiny-llama": (DecoderConfig("LlamaForCausalLM", 64, 32, 64, 2, 4, 2, 8, 10000.0, 1e-5, False),
                   DecoderConfig("LlamaForCausalLM", 64, 16, 32, 1, 2, 1, 8, 10000.0, 1e-5, False)),
}

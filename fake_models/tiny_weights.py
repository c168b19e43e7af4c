"""The tiny pair's seeded weights and its KV row layout, shared by the model
(``tiny.py``) and its draft heads (``tiny_heads.py``)."""
from __future__ import annotations

from typing import Dict

import torch

from overlapcheck import seeds

TOK, POS, RID = 0, 1, 2     # a KV row's tag columns: token, position, request
META = 3                    # the tag columns come first, then the layers' keys and values


def normal(seed: int, name: str, shape, scale: float) -> torch.Tensor:
    """Seeded N(0, scale^2) weights named ``name`` (a sub-stream of ``seed``)."""
    g = torch.Generator().manual_seed(seeds.derive(seed, "tiny", name) % (2 ** 63))
    return torch.randn(shape, generator=g, dtype=torch.float32) * scale


def layer_weights(seed: int, name: str, d: int, f: int) -> Dict[str, torch.Tensor]:
    """One decoder layer's weights: attention ``d`` x ``d``, feed-forward ``d`` x ``f``."""
    s = d ** -0.5
    return {"wq": normal(seed, name + ".wq", (d, d), s), "wk": normal(seed, name + ".wk", (d, d), s),
            "wv": normal(seed, name + ".wv", (d, d), s), "wo": normal(seed, name + ".wo", (d, d), s),
            "w1": normal(seed, name + ".w1", (d, f), s), "w2": normal(seed, name + ".w2", (f, d), f ** -0.5)}

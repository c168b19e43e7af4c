"""The model's own continuation, with no engine: the golden reference (the fake
model's, ``Golden``; the tiny Llama's, ``LlamaGolden``; the frozen-KV MTP pair's
Gemma4 target's, ``Gemma4Golden``).

``Golden(cfg).next(spec, tokens)`` is the token the fake model gives after ``tokens``
(prompt plus output so far) for a request with ``spec``'s seed and sampling, computed
from the token list alone; ``accept_len(spec, tokens, k)`` is the accept length of a
verify at that point (draft chain against target, the fake worker's rule). The fake
worker computes the same from what it reads through SGLang's request->token table, so
any difference means SGLang fed the model another context than the request's own.
"""
from __future__ import annotations

import functools
from typing import Sequence

from overlapcheck.protocol.types import SEEDED

from .worker import Oracle


class Golden:
    def __init__(self, cfg):
        self.oracle = Oracle(cfg.vocab, cfg.agreement, 1)
        self.k = cfg.spec_steps

    def _raw(self, tokens: Sequence[int]) -> int:
        raw = 0
        for p, t in enumerate(tokens):
            raw = Oracle.extend(raw, int(t), p)
        return raw

    def next(self, spec, tokens: Sequence[int]) -> int:
        return self.oracle.target(self._raw(tokens), len(tokens), spec.seed,
                                  spec.sampling == SEEDED)

    def accept_len(self, spec, tokens: Sequence[int]) -> int:
        """A verify whose root is ``tokens[-1]`` (context ``tokens[:-1]`` in KV)."""
        o, seeded = self.oracle, spec.sampling == SEEDED
        n = len(tokens) - 1
        raw = self._raw(tokens[:-1])
        chain, a = [int(tokens[-1])], 1
        for j in range(self.k + 1):
            raw = o.extend(raw, chain[j], n + j)
            target = o.target(raw, n + j + 1, spec.seed, seeded)
            if j == self.k:
                break
            d = o.draft(raw, n + j + 1, spec.seed, seeded)
            if d != target:
                break
            chain.append(d)
            a += 1
        return a


class LlamaGolden:
    """The tiny Llama's own greedy continuation (real-forward mode): transformers'
    ``LlamaForCausalLM`` on the same checkpoint SGLang loads (``checkpoint``), the
    whole prefix recomputed for each token, one request at a time, no engine. A seeded
    request's token is SGLang's sampler's draw, which this does not model: ``covers``
    says which requests it judges (greedy ones)."""

    k = 0

    def __init__(self, cfg):
        self.model = _hf_llama(cfg.vocab, cfg.context, cfg.real_worker)

    @staticmethod
    def covers(spec) -> bool:
        return spec.sampling != SEEDED

    def next(self, spec, tokens: Sequence[int]) -> int:
        import torch
        with torch.no_grad():
            logits = self.model(torch.tensor([list(tokens)], dtype=torch.long)).logits
        return int(torch.argmax(logits[0, -1]))


class Gemma4Golden(LlamaGolden):
    """The Gemma4 target's own greedy continuation (worker ``frozen-kv-mtp-v2``):
    transformers' ``Gemma4ForCausalLM`` on the checkpoint SGLang loads, its sliding
    window included, one request at a time."""

    def __init__(self, cfg):
        self.model = _hf_gemma4(cfg.vocab, cfg.context)


def golden_for(cfg):
    """The golden reference of ``cfg``'s model."""
    if cfg.model == "fake":
        return Golden(cfg)
    return Gemma4Golden(cfg) if cfg.worker == "frozen-kv-mtp-v2" else LlamaGolden(cfg)


@functools.lru_cache(maxsize=2)
def _hf_gemma4(vocab: int, context: int):
    from safetensors.torch import load_file
    from transformers import Gemma4ForCausalLM
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    from . import checkpoint
    path = checkpoint.mtp_pair_dirs(vocab, context)[0]
    # eos: one past the vocabulary (never sampled); greedy decoding to a length needs none
    cfg = {k: v for k, v in checkpoint.gemma_config(vocab, context).items()
           if k not in ("architectures", "model_type")}
    cfg["eos_token_id"] = None
    model = Gemma4ForCausalLM(Gemma4TextConfig(**cfg, attn_implementation="eager"))
    model.load_state_dict(load_file(f"{path}/model.safetensors"))
    return model.float().eval()


@functools.lru_cache(maxsize=4)
def _hf_llama(vocab: int, context: int, pair: bool = False):
    """transformers' Llama on the target's checkpoint (the spec pair's target with
    ``pair``; kept: loading costs seconds)."""
    from safetensors.torch import load_file

    from . import checkpoint, env
    # transformers imports torch._dynamo, which imports Triton: with SGLang's
    # environment first (TRITON_INTERPRET), or Triton's own helpers (``tl.cdiv``) would
    # be compiled functions that SGLang's interpreted kernels cannot call
    env.set_environment()
    from transformers import LlamaConfig, LlamaForCausalLM
    path = checkpoint.pair_dirs(vocab, context)[0] if pair else checkpoint.model_dir(vocab, context)
    # eos: SGLang's config names one past the vocabulary (never sampled); the golden
    # model decodes greedily to a length and needs none (transformers warns about it)
    cfg = dict(checkpoint.config(vocab, context), eos_token_id=None)
    model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="eager"))
    model.load_state_dict(load_file(f"{path}/model.safetensors"))
    return model.float().eval()

"""``HFModel``: a target/draft pair of HF-family decoders with the interface of
``fake_models`` (see its docstring): ``write_kv``, ``target``, ``draft``,
``target_hidden``, ``head("eagle" | "mtp")``. Sampling is the tiny model's: greedy
argmax, or a pure function of (seed, position, greedy token) where ``seeded``.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

from ..oracle_rule import SEEDED_PERCENT, M
from . import kernels
from .decoder import Decoder
from .errors import ModelError
from .heads import HEADS, derived_head_tensors

Source = Callable[[], Dict[str, torch.Tensor]]


class Lazy:
    """A tensor source evaluated once, on first call."""

    def __init__(self, fn: Source):
        self._fn, self._val = fn, None

    def __call__(self) -> Dict[str, torch.Tensor]:
        if self._val is None:
            self._val = self._fn()
        return self._val


class HFModel:
    """Target and standalone draft decoders; EAGLE / MTP heads through ``head``."""

    kv_dtype = torch.float32
    hidden_dtype = torch.float32

    def __init__(self, name: str, target_cfg, target_src: Source, draft_cfg, draft_src: Source,
                 heads: Dict[str, Source] = None):
        if draft_cfg.vocab_size != target_cfg.vocab_size:
            raise ModelError(f"{name}: draft vocab_size {draft_cfg.vocab_size} differs from the "
                             f"target's {target_cfg.vocab_size}")
        self.name = name
        self.target_src = target_src if isinstance(target_src, Lazy) else Lazy(target_src)
        self.tdec = Decoder(target_cfg, self.target_src)
        self.ddec = Decoder(draft_cfg, draft_src)
        self.vocab = target_cfg.vocab_size
        self.kv_width, self.draft_kv_width = self.tdec.kv_width, self.ddec.kv_width
        self.hidden_width = target_cfg.hidden_size
        self._head_src = dict(heads or {})
        self._heads: Dict[str, object] = {}

    def exact_on(self, device) -> bool:
        """Whether this model gives the CPU's bits on ``device`` (``hf.kernels``)."""
        return kernels.exact_on(device)

    def sample(self, logits, seeds_, positions, seeded) -> torch.Tensor:
        """Greedy argmax; where ``seeded``, another token ``SEEDED_PERCENT``% of the time
        (a pure function of seed, position and the greedy token)."""
        return kernels.for_device(logits.device).sample(logits, seeds_, positions, seeded,
                                                        self.vocab, SEEDED_PERCENT, M)

    def write_kv(self, kv, table, rows, pos, toks, rids, keep=None) -> None:
        self.tdec.write(kv, table, rows, pos, toks, rids, keep)

    def write_draft_kv(self, draft_kv, table, rows, pos, toks, rids, keep=None) -> None:
        self.ddec.write(draft_kv, table, rows, pos, toks, rids, keep)

    def target_hidden(self, kv, table, rows, ctx) -> torch.Tensor:
        """The target's final (normed) hidden state at position ``ctx - 1``."""
        return self.tdec.hidden(kv, table, rows, ctx)

    def target_logits(self, kv, table, rows, ctx) -> torch.Tensor:
        return self.tdec.logits(self.tdec.weights(kv.device), self.target_hidden(kv, table, rows, ctx))

    def target(self, kv, table, rows, ctx_lens, seeds_, seeded) -> torch.Tensor:
        return self.sample(self.target_logits(kv, table, rows, ctx_lens), seeds_, ctx_lens, seeded)

    def draft(self, draft_kv, table, rows, ctx_lens, seeds_, seeded) -> torch.Tensor:
        d = self.ddec
        h = d.hidden(draft_kv, table, rows, ctx_lens)
        return self.sample(d.logits(d.weights(draft_kv.device), h), seeds_, ctx_lens, seeded)

    def head(self, kind: str):
        """The ``eagle`` or ``mtp`` head: from the checkpoint when it has one, else
        derived from the target (``heads.derived_head_tensors``); built once."""
        if kind not in HEADS:
            raise ValueError(f"unknown head {kind!r} (eagle or mtp)")
        if kind not in self._heads:
            src = self._head_src.get(kind) or Lazy(
                lambda: derived_head_tensors(self.tdec, kind, self.target_src))
            self._heads[kind] = HEADS[kind](self, src)
        return self._heads[kind]

"""The oracle target/draft pair.

A KV slot row holds ``(token, position, request id)`` as written by prefill, verify or
draft. The target's next token at context length ``n`` is a hash of the tokens it
*reads from the request's KV slots* ``0..n-1`` through the request->token table, mixed
with the request seed: a corrupted, stale or recycled slot changes the output. Each
query is computed on its own (exact integer arithmetic, no reductions across
requests), so results do not depend on batch-mates, chunking or retraction.

The draft computes the same hash over the *draft* KV and agrees with the target's
token with a tunable, deterministic probability (``agreement`` percent).

Host lengths (``oracle-hostlens``, ``host_lens=True``): the draft reads the host's
sequence lengths (``seq_lens_cpu``) of the round it drafts, as an attention backend
sizes its metadata from them. The host's value is an upper bound of the round's start
length; one below the device's length cuts the draft's context and changes its tokens
(``host_lens_cut``), so stale host lengths change drafts and accept lengths, never the
committed tokens. A right bound changes nothing: drafts stay the same whatever the
schedule.

Sampling: the oracle's "logits" are the context hash ``h``. Greedy takes the token
``h`` ranks first; seeded sampling picks, from ``(h, request seed, position)`` alone,
the greedy token or (30% of the time) another one.
"""
from __future__ import annotations

import torch

from .kv_store import kept_sources, store
from .oracle_rule import (KV_WIDTH, POS, RANK_SALT, RID, STANDALONE_SALT, TOK, M, agreed, mix,
                          ranked, sample, term)


class OracleModel:
    """Stateless: all state is in the KV buffers and the table it is given."""

    name = "oracle"
    kv_width = draft_kv_width = KV_WIDTH
    kv_dtype = torch.int64
    hidden_width = 1                 # the raw context hash
    hidden_dtype = torch.int64
    kv_tag_columns = (TOK, POS, RID)   # what the engine's KV canary checks

    def __init__(self, vocab: int = 64, agreement: int = 70, salt: int = 0,
                 host_lens: bool = False):
        if vocab < 2 or not 0 <= agreement <= 100:
            raise ValueError(f"oracle needs vocab >= 2 and agreement in 0..100, got {vocab}, {agreement}")
        self.vocab, self.agreement, self.salt = vocab, agreement, salt
        self.reads_host_lens = host_lens     # the engine stages seq_lens_cpu for its drafts
        if host_lens:
            self.name = "oracle-hostlens"
        self._heads = {}

    # -- KV -----------------------------------------------------------------------------
    @staticmethod
    def kv_rows(tokens: torch.Tensor, positions: torch.Tensor, rids: torch.Tensor) -> torch.Tensor:
        """The KV rows to store for ``tokens`` at ``positions`` of requests ``rids``."""
        return torch.stack([tokens, positions, rids], dim=-1)

    @staticmethod
    def raw_hash(kv: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                 ctx_lens: torch.Tensor) -> torch.Tensor:
        """Per query q: the additive hash of the tokens in KV slots
        ``table[rows[q], 0:ctx_lens[q]]`` (the oracle's hidden state; extending it by one
        token is ``(h + term(token, position)) % M``)."""
        width = table.shape[1]
        pos = torch.arange(width, device=table.device)
        mask = pos.unsqueeze(0) < ctx_lens.unsqueeze(1)
        slots = torch.where(mask, table[rows], 0)     # masked cells read the padding slot
        terms = term(kv[:, TOK][slots], pos)
        return torch.where(mask, terms, 0).sum(1) % M

    @staticmethod
    def context_hash(kv: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                     ctx_lens: torch.Tensor) -> torch.Tensor:
        """Per query q: hash of the tokens in KV slots ``table[rows[q], 0:ctx_lens[q]]``."""
        return mix(OracleModel.raw_hash(kv, table, rows, ctx_lens), ctx_lens)

    def write_kv(self, kv, table, rows, pos, toks, rids, keep=None) -> None:
        """Store the KV rows of new tokens at their slots (``keep``: only where True)."""
        slots = table[rows, pos]
        new = self.kv_rows(toks, pos, rids)
        store(kv, slots, new, None if keep is None else kept_sources(kv.shape[0], slots, keep))

    write_draft_kv = write_kv

    def target_hidden(self, kv, table, rows, ctx_lens) -> torch.Tensor:
        """The hidden state behind the target token at ``ctx_lens``: the raw hash ([q, 1])."""
        return self.raw_hash(kv, table, rows, ctx_lens).unsqueeze(1)

    def head(self, kind: str):
        """The oracle ``eagle`` or ``mtp`` draft head (built once)."""
        if kind not in self._heads:
            from .oracle_heads import make_oracle_head
            self._heads[kind] = make_oracle_head(kind, self)
        return self._heads[kind]

    # -- heads --------------------------------------------------------------------------
    def sample(self, h: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
               seeded: torch.Tensor) -> torch.Tensor:
        """The token for logits ``h``: greedy, or seeded by (seed, position) where ``seeded``."""
        return sample(h, seeds, positions, seeded, self.vocab, torch.where)

    def target(self, kv, table, rows, ctx_lens, seeds, seeded) -> torch.Tensor:
        """Target tokens at context lengths ``ctx_lens`` (the token at position ctx_len)."""
        return self.sample(self.context_hash(kv, table, rows, ctx_lens), seeds, ctx_lens, seeded)

    def draft(self, draft_kv, table, rows, ctx_lens, seeds, seeded, topk: int = 1) -> torch.Tensor:
        """Draft tokens: the target's rule over the draft KV, kept with probability
        ``agreement``% (a hash of the context decides), else a different token. With
        ``topk`` > 1 the ``topk`` best candidates ([q, topk], ``ranked``; rank r keeps
        the target's token by a hash salted with r)."""
        h = self.context_hash(draft_kv, table, rows, ctx_lens)
        like = self.sample(h, seeds, ctx_lens, seeded)
        salt = self.salt + STANDALONE_SALT
        if topk > 1:
            agrees = [mix(h, seeds, ctx_lens, salt + RANK_SALT * r) % 100 < self.agreement
                      for r in range(topk)]
            return torch.stack(ranked(like, 1 + mix(h, 3) % (self.vocab - 1), agrees,
                                      self.vocab, torch.where), 1)
        return agreed(like, mix(h, seeds, ctx_lens, salt), h, self.vocab, self.agreement,
                      torch.where)

    def host_lens_cut(self, drafts, lens, host_lens) -> torch.Tensor:
        """Draft tokens of a round that starts at the device's ``lens``, drafted with the
        host's ``host_lens``: unchanged where the host's bound holds (``host_lens >=
        lens``), else another token (the context was cut by ``lens - host_lens``)."""
        cut = (lens - host_lens).clamp(min=0)
        other = (drafts + 1 + mix(drafts % M, cut, 5) % (self.vocab - 1)) % self.vocab
        return torch.where(cut > 0, other, drafts)

    @property
    def host(self):
        """This model on numpy arrays (``oracle_host.OracleHost``): what the engine's
        kernels call when the sim runs them on numpy views (``overlapcheck/device/xp.py``)."""
        h = self.__dict__.get("_host")
        if h is None:
            from .oracle_host import OracleHost
            h = self._host = OracleHost(self)
        return h

"""The fake model's rule, as plain integer functions (no torch, no vLLM).

A request's next token is a pure function of (request seed, sampling mode, position,
the tokens before it); a draft token likewise, plus an agreement percentage. The
rule is the oracle family's (``fake_models/oracle_rule.py``) over a Python int instead
of KV tensors: the context hash is additive over (token, position) terms, so extending
a context by one token costs one multiply.

Acceptance is exact: a verify that starts at position ``q`` with ``s`` drafts accepts
the longest run of drafts equal to the golden tokens, plus the bonus token; so the
accept length of a verify depends only on (request, ``q``, ``s``). Async and sync
runs therefore give the same tokens, and a checker can recompute every token and
every accept length from the request alone (``checkers/golden.py``).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from fake_models.oracle_rule import draft_at, extend, token_at


class Golden:
    """One request's golden continuation, extended on demand and cached."""

    __slots__ = ("seed", "seeded", "vocab", "agreement", "tokens", "hashes")

    def __init__(self, prompt: Sequence[int], seed: int, seeded: bool, vocab: int,
                 agreement: int):
        self.seed, self.seeded, self.vocab, self.agreement = seed, seeded, vocab, agreement
        self.tokens: List[int] = list(prompt)
        self.hashes: List[int] = [0]            # hashes[n]: hash of tokens[:n]
        for p, t in enumerate(self.tokens):
            self.hashes.append(extend(self.hashes[-1], t, p))

    def token(self, n: int) -> int:
        """The golden token at position ``n`` (>= the prompt length)."""
        while len(self.tokens) <= n:
            p = len(self.tokens)
            t = token_at(self.hashes[p], p, self.seed, self.seeded, self.vocab)
            self.tokens.append(t)
            self.hashes.append(extend(self.hashes[p], t, p))
        return self.tokens[n]

    def draft(self, n: int) -> int:
        """The draft proposed for position ``n`` (drafted after the golden context)."""
        self.token(n)
        return draft_at(self.hashes[n], n, self.seed, self.seeded, self.vocab, self.agreement)

    def drafts(self, start: int, k: int) -> Tuple[int, ...]:
        return tuple(self.draft(start + i) for i in range(k))

    def verify(self, start: int, drafts: Sequence[int]) -> Tuple[int, ...]:
        """The tokens a verify at ``start`` emits for ``drafts``: the golden token at
        ``start``, then one more per leading draft equal to its golden token."""
        out = [self.token(start)]
        for i, d in enumerate(drafts):
            if d != self.token(start + i):
                break
            out.append(self.token(start + i + 1))
        return tuple(out)

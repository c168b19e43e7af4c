"""The fake model's rule, as plain integer functions (no torch, no vLLM).

A request's next token is a pure function of (request seed, sampling mode, position,
the tokens before it); a draft token likewise, plus an agreement percentage. The
rule is the oracle model's (``fake_models/oracle.py``) over a Python int instead of
KV tensors: the context hash is additive over (token, position) terms, so extending
a context by one token costs one multiply.

Acceptance is exact: a verify that starts at position ``q`` with ``s`` drafts accepts
the longest run of drafts equal to the golden tokens, plus the bonus token; so the
accept length of a verify depends only on (request, ``q``, ``s``). Async and sync
runs therefore give the same tokens, and a checker can recompute every token and
every accept length from the request alone (``invariants/vllm_golden.py``).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

M = 2147483647                  # 2**31 - 1, as the oracle
SEEDED_PERCENT = 30             # seeded sampling departs from greedy this often


def mix(x: int, *ys: int) -> int:
    """The oracle's integer mixer (values stay in [0, M))."""
    for y in ys:
        x = (x * 48271 + (y % M) * 69621 + 12345) % M
        x ^= x >> 11
    return x


def term(token: int, position: int) -> int:
    return ((token % M) * ((position * 40503 + 17) % M + 1)) % M


def context_hash(tokens: Sequence[int]) -> int:
    """The additive hash of ``tokens`` at positions 0..n-1."""
    h = 0
    for p, t in enumerate(tokens):
        h = (h + term(t, p)) % M
    return h


def extend(h: int, token: int, position: int) -> int:
    return (h + term(token, position)) % M


def token_at(h: int, n: int, seed: int, seeded: bool, vocab: int) -> int:
    """The token at position ``n`` after a context of ``n`` tokens with hash ``h``."""
    x = mix(h, n)
    greedy = mix(x, 1) % vocab
    if not seeded:
        return greedy
    u = mix(x, seed, n)
    return (u >> 7) % vocab if u % 100 < SEEDED_PERCENT else greedy


def draft_at(h: int, n: int, seed: int, seeded: bool, vocab: int, agreement: int) -> int:
    """The draft for position ``n`` after the golden context (hash ``h``): the golden
    token with probability ``agreement`` percent (decided by a hash), else another."""
    like = token_at(h, n, seed, seeded, vocab)
    x = mix(h, n)
    if mix(x, seed, n, 7) % 100 < agreement:
        return like
    return (like + 1 + mix(x, 3) % (vocab - 1)) % vocab


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

"""The oracle pair's golden continuation and drafts in plain Python integers.

The oracle (``oracle.py``, ``oracle_heads.py``) is exact integer arithmetic on int64
tensors whose values stay in ``[0, 2**31 - 1)``; Python integers give the same values,
so one request's continuation costs a few integer operations per token instead of a
dozen tensor ops (tests hold this path against the model run through its own API,
``golden_torch``). Every quantity is a function of the golden token sequence ``G``
(prompt, then continuation) through its raw prefix hashes ``R[n]`` (the hash of
``G[:n]``, the target's hidden state at position ``n - 1``):

* target at context ``n``: ``sample(mix(R[n], n))``, the token ``G[n]``;
* standalone draft at ``n``: the same hash over the draft KV (which holds ``G`` while
  the drafts match), kept with the agreement probability, else another token;
* EAGLE draft for position ``n``: the head at ``n - 2`` over pairs ``(G[p+1], R[p+1])``
  (its chained hidden state equals the target's while the drafts match: the oracle's
  hidden state extends exactly), so it depends on ``n`` alone;
* frozen-KV MTP draft ``j`` of a round at committed length ``L``: chained from
  ``R[L]`` and reading the target KV of positions ``0..L-1``, so it depends on ``L``.
"""
from __future__ import annotations

from typing import List

from .oracle_rule import HEAD_SALT, RANK_SALT, STANDALONE_SALT, M, agreed, mix, sample, term


class OracleRequest:
    """One request's golden sequence under an oracle pair (``model``: its
    ``OracleModel``, read for vocabulary, agreement and salt)."""

    def __init__(self, model, prompt, seed: int, seeded: bool):
        self.vocab, self.agreement, self.salt = model.vocab, model.agreement, model.salt
        self.seed, self.seeded = seed, seeded
        self.G: List[int] = []
        self.R: List[int] = [0]          # R[n]: raw hash of G[:n]
        self.E: List[int] = [0]          # E[n]: the EAGLE KV hash of pairs 0..n-1 (unreduced)
        for t in prompt:
            self._push(int(t))

    def _push(self, tok: int) -> None:
        n = len(self.G)
        self.G.append(tok)
        self.R.append((self.R[n] + term(tok, n)) % M)
        if n >= 1:   # the pair at n - 1: (G[n], R[n])
            self.E.append(self.E[n - 1] + term(tok, n - 1) + term(self.R[n], n + 2))

    def _sample(self, h: int, pos: int) -> int:
        return sample(h, self.seed, pos, self.seeded, self.vocab)

    def _agree(self, like: int, u: int) -> int:
        return agreed(like, mix(u, self.salt + HEAD_SALT), u, self.vocab, self.agreement)

    # -- the sequence ----------------------------------------------------------------------
    def extend(self, need: int) -> None:
        """Continue ``G`` to ``need`` tokens with the target's own tokens."""
        while len(self.G) < need:
            n = len(self.G)
            self._push(self._sample(mix(self.R[n], n), n))

    # -- drafts, while they match ---------------------------------------------------------
    def draft(self, kind: str, L: int, j: int) -> int:
        """Draft ``j`` (1..k) of a round at committed length ``L`` (input ``G[L]``), its
        earlier drafts matching ``G``; ``G`` must hold position ``L + j``."""
        n = L + j
        like = self.G[n]                       # the target's token there: the draft's "like"
        if kind == "standalone":
            h = mix(self.R[n], n)
            return agreed(like, mix(h, self.seed, n, self.salt + STANDALONE_SALT), h, self.vocab,
                          self.agreement)
        if kind == "eagle":
            return self._agree(like, mix(self.E[n - 1] % M, self.R[n], self.seed, n))
        if kind == "mtp":
            return self._agree(like, mix(self.R[L], self.R[n], self.seed, n))
        raise ValueError(f"no golden draft for draft kind {kind!r}")

    def accept_len(self, kind: str, k: int, L: int, topk: int = 1) -> int:
        """The accept length of a verify at committed length ``L`` with ``k`` drafts
        (``topk`` > 1: the tree of docs/design.md §4.12, whose rank-0 candidate at each
        depth continues and whose other candidates are leaves)."""
        if topk > 1:
            return self._tree_accept_len(kind, k, L, topk)
        a = 1
        while a <= k and self.draft(kind, L, a) == self.G[L + a]:
            a += 1
        return a

    def candidates(self, kind: str, L: int, j: int, topk: int) -> List[int]:
        """The ``topk`` candidates at depth ``j`` of a tree at committed length ``L``
        whose rank-0 path so far matches ``G`` (``oracle_rule.ranked`` on ints)."""
        n = L + j
        like = self.G[n]
        if kind == "standalone":
            x = mix(self.R[n], n)
            agrees = [mix(x, self.seed, n, self.salt + STANDALONE_SALT + RANK_SALT * r) % 100 < self.agreement
                      for r in range(topk)]
        elif kind == "eagle":
            x = mix(self.E[n - 1] % M, self.R[n], self.seed, n)
            agrees = [mix(x, self.salt + HEAD_SALT + RANK_SALT * r) % 100 < self.agreement
                      for r in range(topk)]
        else:
            raise ValueError(f"no golden tree draft for draft kind {kind!r}")
        o, taken, used, out = 1 + mix(x, 3) % (self.vocab - 1), False, 0, []
        for a in agrees:
            if a and not taken:
                out.append(like)
                taken = True
            else:
                out.append((like + 1 + (o - 1 + used) % (self.vocab - 1)) % self.vocab)
                used += 1
        return out

    def _tree_accept_len(self, kind: str, k: int, L: int, topk: int) -> int:
        a = 1
        while a <= k:
            c = self.candidates(kind, L, a, topk)
            t = self.G[L + a]
            if t not in c:
                break
            a += 1
            if c[0] != t:       # a leaf: no deeper node
                break
        return a

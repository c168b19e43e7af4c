"""The positional token digest: one rule, shared by the KV canary and the oracle models.

A token ``t`` at position ``p`` contributes ``term(t, p) = (t mod M) * weight(p) mod M``
with ``weight(p) = (p * 40503 + 17) mod M + 1``; a sequence's digest is the sum of its
terms mod ``M`` (``token_digest``). The KV canary's record carries this digest of the
tokens a forward read (``canary``), and the oracle models' context hash is this digest
of the tokens in a request's KV (``fake_models/oracle_rule.py``), so a target, its fake
model and a checker compute the same number from the same tokens.

``weight`` and ``term`` take Python ints, numpy arrays or torch tensors alike: the
arithmetic is the same operators on int64 values below ``2**62``.
"""
from __future__ import annotations

M = 2147483647           # 2**31 - 1: every intermediate stays far below 2**63
DIGEST_M = M


def weight(pos):
    """The weight of position ``pos`` (in ``1..M``)."""
    return (pos * 40503 + 17) % M + 1


def term(tok, pos):
    """Token ``tok``'s contribution at position ``pos`` (in ``0..M-1``)."""
    return (tok % M) * weight(pos) % M


def token_digest(tokens) -> int:
    """The digest of the tokens at positions ``0..n-1``: the sum of their terms mod M."""
    h = 0
    for p, t in enumerate(tokens):
        h += term(t, p)
    return h % M

"""The oracle family's rule, once: how a token and a draft follow from a context.

Every fake model of the project computes its tokens with this rule: the reference
engine's oracle pair on int64 tensors (``oracle.py``, ``oracle_heads.py``) and its
golden reference on Python ints (``golden_oracle.py``), the vLLM target's fake runner
and the SGLang target's fake workers, and the golden references those targets' checkers
hold them to. (The numpy host twin ``oracle_host.py`` and the Triton sampler of
``hf/triton_ops.py`` unroll the same arithmetic for speed; tests hold them to it.)

* a context's raw hash is the protocol's positional token digest
  (``overlapcheck.protocol.digest``): the sum of ``term(token, position)`` mod ``M``;
  extending a context by one token adds one term (``extend``);
* the token at position ``n`` after a context of raw hash ``raw`` is ``sample`` of the
  mixed hash ``mix(raw, n)``: greedy, or for a seeded request (``SEEDED_PERCENT`` of the
  time, decided by the seed and position) another token;
* a draft is the token its own context predicts, kept where an agreement hash falls
  below ``agreement`` percent, else another token (``agreed``); a chain draft's
  agreement hash is ``mix(h, seed, n, salt + STANDALONE_SALT)``.

The functions take Python ints; ``mix``, ``term`` and ``extend`` take int64 arrays and
tensors as well, and ``sample``, ``agreed`` and ``ranked`` do given a ``where``
(``torch.where``, ``numpy.where``). Every intermediate stays below ``2**62``.
"""
from __future__ import annotations

from overlapcheck.protocol.digest import M, term, weight

__all__ = ["M", "term", "weight", "mix", "extend", "raw_hash", "sample", "other", "agreed",
           "token_at", "draft_at", "ranked", "SEEDED_PERCENT", "RANK_SALT", "STANDALONE_SALT",
           "HEAD_SALT", "KV_WIDTH", "TOK", "POS", "RID"]

SEEDED_PERCENT = 30     # a seeded request departs from greedy this often
RANK_SALT = 31          # tree drafts: rank r's agreement hash is salted with 31 * r
STANDALONE_SALT = 7     # a chain draft's agreement salt (plus the model's own salt)
HEAD_SALT = 11          # an EAGLE/MTP head's agreement salt (plus the model's own salt)

KV_WIDTH = 3            # an oracle KV row: token, position, request id
TOK, POS, RID = 0, 1, 2


def mix(x, *ys):
    """A deterministic integer mixer of values in [0, M)."""
    for y in ys:
        x = (x * 48271 + (y % M) * 69621 + 12345) % M
        x = x ^ (x >> 11)
    return x


def extend(raw, tok, pos):
    """The raw hash of a context extended by ``tok`` at position ``pos``."""
    return (raw + term(tok, pos)) % M


def raw_hash(tokens) -> int:
    """The raw hash of ``tokens`` at positions 0..n-1 (``digest.token_digest``)."""
    h = 0
    for p, t in enumerate(tokens):
        h = (h + term(t, p)) % M
    return h


def _pick(cond, a, b):
    return a if cond else b


def sample(h, seed, pos, seeded, vocab: int, where=None):
    """The token for mixed context hash ``h`` at position ``pos``: greedy, or for a
    seeded request another one ``SEEDED_PERCENT`` of the time. On ints (``where``
    None), or on arrays through ``where``."""
    greedy = mix(h, 1) % vocab
    if where is None:
        if not seeded:
            return greedy
        u = mix(h, seed, pos)
        return (u >> 7) % vocab if u % 100 < SEEDED_PERCENT else greedy
    u = mix(h, seed, pos)
    return where(seeded & (u % 100 < SEEDED_PERCENT), (u >> 7) % vocab, greedy)


def other(like, o, vocab: int):
    """The token a rejected draft proposes instead of ``like`` (``o``: the hash that
    picks it): never ``like`` itself."""
    return (like + 1 + mix(o, 3) % (vocab - 1)) % vocab


def agreed(like, a, o, vocab: int, agreement: int, where=None):
    """A draft: ``like`` where the agreement hash ``a`` falls below ``agreement``
    percent, else ``other(like, o)``."""
    if where is None:
        return like if a % 100 < agreement else other(like, o, vocab)
    return where(a % 100 < agreement, like, other(like, o, vocab))


def token_at(raw: int, n: int, seed: int, seeded: bool, vocab: int) -> int:
    """The token at position ``n`` after a context of ``n`` tokens with raw hash ``raw``."""
    return sample(mix(raw, n), seed, n, seeded, vocab)


def draft_at(raw: int, n: int, seed: int, seeded: bool, vocab: int, agreement: int,
             salt: int = 0) -> int:
    """A chain draft for position ``n`` after a context with raw hash ``raw`` (its own
    KV holding that context): the target's token there with probability ``agreement``
    percent, else another."""
    x = mix(raw, n)
    like = sample(x, seed, n, seeded, vocab)
    return agreed(like, mix(x, seed, n, salt + STANDALONE_SALT), x, vocab, agreement)


def ranked(like, o, agrees, vocab: int, where) -> list:
    """Tree drafts' candidates, best first (``topk = len(agrees)``): rank r is ``like``
    (the target's token) where ``agrees[r]`` holds and no better rank took it; every
    other rank is a distinct other token, ``like`` shifted by the offsets ``o, o+1, ...``
    (in 1..vocab-1). Rank 0 is the chain draft's token. On tensors or arrays through
    ``where``; ``golden_oracle.OracleRequest.candidates`` computes the same on ints."""
    taken = agrees[0]
    out = [where(taken, like, (like + o) % vocab)]
    used = 1 - taken * 1
    for a in agrees[1:]:
        pick = a & ~taken
        off = 1 + (o - 1 + used) % (vocab - 1)
        out.append(where(pick, like, (like + off) % vocab))
        used = used + 1 - pick * 1
        taken = taken | pick
    return out

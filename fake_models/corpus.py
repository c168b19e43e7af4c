"""A deterministic synthetic corpus for the trained pair (``train_pair``).

An order-2 Markov source over ``vocab`` tokens: each context ``(a, b)`` has three
successors with probabilities 0.55 / 0.25 / 0.20. The most likely one is a function of
``b`` alone for ``share`` of the contexts and of the pair ``(a, b)`` for the rest, so a
small draft that only learns order-1 statistics agrees with a target's greedy choice
often but not always. Every table comes from ``seeds.derive(seed, "corpus", ...)``.
"""
from __future__ import annotations

import torch

from overlapcheck import seeds

PROBS = (0.55, 0.25, 0.20)


def _gen(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(seeds.derive(seed, "corpus", name) % (2 ** 63))


def transition_table(vocab: int, seed: int, share: float = 0.7):
    """``succ [V, V, 3]`` successor tokens and ``probs [3]``."""
    g = _gen(seed, "table")
    by_b = torch.randint(0, vocab, (vocab,), generator=g)
    by_ab = torch.randint(0, vocab, (vocab, vocab), generator=g)
    use_b = torch.rand((vocab, vocab), generator=g) < share
    top = torch.where(use_b, by_b.unsqueeze(0).expand(vocab, vocab), by_ab)
    rest = torch.randint(0, vocab, (vocab, vocab, 2), generator=g)
    succ = torch.cat([top.unsqueeze(-1), rest], -1)
    return succ, torch.tensor(PROBS)


def sample_batch(succ, probs, n: int, length: int, g: torch.Generator) -> torch.Tensor:
    """``n`` sequences of ``length`` tokens (first two uniform), from generator ``g``."""
    vocab = succ.shape[0]
    out = torch.empty((n, length), dtype=torch.long)
    out[:, :2] = torch.randint(0, vocab, (n, 2), generator=g)
    choice = torch.multinomial(probs.expand(n * length, 3), 1, replacement=True,
                               generator=g).view(n, length)
    for i in range(2, length):
        out[:, i] = succ[out[:, i - 2], out[:, i - 1], choice[:, i]]
    return out

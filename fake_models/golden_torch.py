"""Any model's golden continuation and drafts, through the model's own API
(``write_kv``, ``target``, ``draft``, ``target_hidden``, ``head``), on the CPU, or on
the device a run computes on when the model's results there are not the CPU's
(``exact_on``: its GPU kernels are batch invariant, not exact).

One request at a time, in a private KV with one contiguous table row (slot ``1 + p``
holds position ``p``; slot 0 is the padding slot): no paging, no batch-mates, no
overlap, no speculation. Batch invariance (docs/design.md §4.10) makes the cheap ways
of computing it exact, and they are the ones used:

* **teacher forcing**: with the engine's tokens as a hint, the target's token at every
  context length is computed in one call over the hinted sequence; the hint counts
  only up to its first token that differs from the target's, where the target's token
  is taken instead (tokens are checked against the model, never trusted);
* beyond the hint, one target call per token;
* drafts of many verifies in one call per draft step (standalone: over the draft KV
  of ``G``; EAGLE: each verify's chained head state in private slots of its own table
  row; frozen-KV MTP: chained hidden states reading the target KV of ``0..L-1``).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch


def _ints(xs, device="cpu") -> torch.Tensor:
    return torch.tensor(list(xs), dtype=torch.int64, device=device)


class ModelRequest:
    """One request's golden sequence under ``model`` within contexts of ``width``."""

    def __init__(self, model, width: int, prompt, seed: int, seeded: bool, rid: int = 0,
                 device: str = "cpu"):
        self.m, self.W, self.dev = model, width, torch.device(device)
        self.seed, self.seeded, self.rid = seed, seeded, rid
        self.vocab = model.vocab
        self.G: List[int] = [int(t) for t in prompt]
        self.table = torch.arange(1, width + 1, dtype=torch.int64, device=self.dev).unsqueeze(0)
        self.kv = self._buf(model.kv_width, getattr(model, "kv_dtype", torch.int64))
        self.kv_len = 0          # positions whose target KV holds G
        self.dkv = None          # standalone draft KV, and the positions it holds
        self.dkv_len = 0
        self.D: Dict[int, int] = {}      # standalone draft at context n
        self.ekv = None          # EAGLE KV of the pairs (G[p+1], f_p), and how many
        self.ekv_len = 0

    def _buf(self, width: int, dtype, extra: int = 0) -> torch.Tensor:
        return torch.zeros((self.W + 1 + extra, width), dtype=dtype, device=self.dev)

    def _q(self, n: int):
        return (torch.full((n,), self.seed, dtype=torch.int64, device=self.dev),
                torch.full((n,), self.seeded, device=self.dev))

    def _ints(self, xs) -> torch.Tensor:
        return _ints(xs, self.dev)

    def _tok(self, t: int) -> int:
        return t if 0 <= t < self.vocab else 0    # an engine's garbage never reaches a lookup

    def _write(self, kv, write, upto: int, start: int, seq: Sequence[int]) -> None:
        if upto > start:
            pos = torch.arange(start, upto, device=self.dev)
            write(kv, self.table, torch.zeros_like(pos), pos,
                  self._ints(self._tok(t) for t in seq[start:upto]), torch.full_like(pos, self.rid))

    def _targets(self, ctx: Sequence[int]) -> List[int]:
        seeds, seeded = self._q(len(ctx))
        c = self._ints(ctx)
        return self.m.target(self.kv, self.table, torch.zeros_like(c), c, seeds, seeded).tolist()

    # -- the sequence ----------------------------------------------------------------------
    def extend(self, need: int, hint: Sequence[int] = ()) -> None:
        """Continue ``G`` to ``need`` tokens: by teacher forcing along ``hint`` (a full
        sequence, prompt included) while it agrees, then token by token."""
        need = min(need, self.W)
        n0 = len(self.G)
        if len(hint) > n0 and n0 < need and list(hint[:n0]) == self.G:
            cand = [int(t) for t in hint[n0:need]]
            seq = self.G + cand
            self._write(self.kv, self.m.write_kv, n0 + len(cand) - 1, self.kv_len, seq)
            for i, t in enumerate(self._targets(range(n0, n0 + len(cand)))):
                self.G.append(t)
                if t != cand[i]:
                    break
            self.kv_len = len(self.G) - 1
        while len(self.G) < need:
            n = len(self.G)
            self._write(self.kv, self.m.write_kv, n, self.kv_len, self.G)
            self.kv_len = n
            self.G.append(self._targets([n])[0])

    def _target_kv(self, upto: int) -> None:
        if upto > self.kv_len:
            self._write(self.kv, self.m.write_kv, upto, self.kv_len, self.G)
            self.kv_len = upto

    # -- drafts -----------------------------------------------------------------------------
    def accept_lens(self, kind: str, k: int, starts: Sequence[int], topk: int = 1) -> List[int]:
        """Accept lengths of verifies at committed lengths ``starts`` (``G`` must hold
        ``L + k + 1`` tokens for each); ``topk`` > 1: tree drafts (docs/design.md §4.12:
        the rank-0 candidate continues, the others are leaves)."""
        if not starts:
            return []
        drafts = getattr(self, "_drafts_" + kind, None)
        if drafts is None or (topk > 1 and kind == "mtp"):
            raise ValueError(f"no golden draft for draft kind {kind!r}")
        if topk > 1:
            d = drafts(k, list(starts), topk)     # [verifies][k][topk]
            out = []
            for L, row in zip(starts, d):
                a = 1
                while a <= k and self.G[L + a] in row[a - 1]:
                    a += 1
                    if row[a - 2][0] != self.G[L + a - 1]:
                        break
                out.append(a)
            return out
        d = drafts(k, list(starts))          # [verifies][k]
        out = []
        for L, row in zip(starts, d):
            a = 1
            while a <= k and row[a - 1] == self.G[L + a]:
                a += 1
            out.append(a)
        return out

    def _drafts_standalone(self, k: int, starts: List[int], topk: int = 1) -> List[List[int]]:
        if topk > 1:
            return self._tree_standalone(k, starts, topk)
        m = self.m
        want = sorted({L + j for L in starts for j in range(1, k + 1)} - set(self.D))
        if want:
            self._draft_kv(max(want))
            seeds, seeded = self._q(len(want))
            c = self._ints(want)
            got = m.draft(self.dkv, self.table, torch.zeros_like(c), c, seeds, seeded).tolist()
            self.D.update(zip(want, got))
        return [[self.D[L + j] for j in range(1, k + 1)] for L in starts]

    def _draft_kv(self, top: int) -> None:
        """The standalone draft's private KV, written up to position ``top``."""
        m = self.m
        if self.dkv is None:
            self.dkv = self._buf(getattr(m, "draft_kv_width", m.kv_width),
                                 getattr(m, "kv_dtype", torch.int64))
        self._write(self.dkv, m.write_draft_kv, top, self.dkv_len, self.G)
        self.dkv_len = max(self.dkv_len, top)

    def _tree_standalone(self, k: int, starts: List[int], topk: int) -> list:
        m = self.m
        want = sorted({L + j for L in starts for j in range(1, k + 1)})
        self._draft_kv(max(want))
        seeds, seeded = self._q(len(want))
        c = self._ints(want)
        got = m.draft(self.dkv, self.table, torch.zeros_like(c), c, seeds, seeded,
                      topk=topk).tolist()
        D = dict(zip(want, got))
        return [[D[L + j] for j in range(1, k + 1)] for L in starts]

    def _drafts_eagle(self, k: int, starts: List[int], topk: int = 1) -> List[List[int]]:
        m, head = self.m, self.m.head("eagle")
        top = max(starts)
        self._target_kv(top)
        if self.ekv is None:
            self.ekv = self._buf(head.kv_width, head.kv_dtype)
        if top > self.ekv_len:       # pairs (G[p+1], f_p) at p = ekv_len .. top-1
            pos = torch.arange(self.ekv_len, top, device=self.dev)
            rows = torch.zeros_like(pos)
            feats = m.target_hidden(self.kv, self.table, rows, pos + 1)
            head.write(self.ekv, self.table, rows, pos, self._ints(self.G[p + 1] for p in pos.tolist()),
                       feats, torch.full_like(pos, self.rid))
            self.ekv_len = top
        # each verify chains in private slots of its own table row past its own L
        v = len(starts)
        ekv = torch.cat([self.ekv, self.ekv.new_zeros((v * k, self.ekv.shape[1]))])
        table = self.table.repeat(v, 1)
        for i, L in enumerate(starts):
            base = self.W + 1 + i * k
            table[i, L:L + k] = torch.arange(base, base + min(k, self.W - L), device=self.dev)
        rows, L_ = torch.arange(v, device=self.dev), self._ints(starts)
        seeds, seeded = self._q(v)
        kw = {"topk": topk} if topk > 1 else {}
        g, d = head.out(ekv, table, rows, L_ - 1, seeds, seeded, **kw)
        out = [d.tolist()]
        for j in range(2, k + 1):
            pos = L_ + (j - 2)
            head.write(ekv, table, rows, pos, self._ints(self.G[L + j - 1] for L in starts), g,
                       torch.full_like(rows, self.rid))
            g, d = head.out(ekv, table, rows, pos, seeds, seeded, **kw)
            out.append(d.tolist())
        return [list(r) for r in zip(*out)]

    def _drafts_mtp(self, k: int, starts: List[int]) -> List[List[int]]:
        m, head = self.m, self.m.head("mtp")
        self._target_kv(max(starts))
        L_ = self._ints(starts)
        rows = torch.zeros_like(L_)
        seeds, seeded = self._q(len(starts))
        g = m.target_hidden(self.kv, self.table, rows, L_)
        out = []
        for j in range(1, k + 1):
            toks = self._ints(self.G[L + j - 1] for L in starts)
            g, d = head.step(self.kv, self.table, rows, L_, L_ + (j - 1), toks, g, seeds, seeded)
            out.append(d.tolist())
        return [list(r) for r in zip(*out)]

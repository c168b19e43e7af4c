"""The tiny transformer target/draft pair (``--model tiny``).

A real decoder-only transformer, small enough for CI: pre-norm layers with RoPE
attention over the *paged* KV cache, reached through the request->token table, and a
ReLU MLP. The target has 2 layers, the standalone draft 1; both share the token
embedding and the output head (so the draft agrees with the target often, but not
always). Weights are seeded from ``overlapcheck.seeds.derive(seed, "tiny", ...)``.

KV row of a slot: ``[token, position, request id]`` (a canary the checkers can read,
exact in float32) followed by each layer's rotated K and its V. ``write_kv`` writes the
rows of new tokens layer by layer (every new token's layer-l K/V before layer-l
attention), so the tokens of one call may depend on each other causally (prefill
chunks, verify). ``target`` recomputes the last context token's column through the
layers from the cache, reading every context slot: a stale or recycled slot changes
its logits. Every op comes from ``tiny_ops``: logits are bitwise batch invariant.
Weights live on the CPU and are copied, once per device, to the device of the buffers.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from . import tiny_ops as T
from .kv_store import kept_sources
from .kv_store import store as store_rows
from .oracle_rule import SEEDED_PERCENT, M, mix
from .tiny_weights import META, POS, RID, TOK, layer_weights, normal


class Stack:
    """Decoder layers over one KV buffer (columns ``META + 2*d*l ...``)."""

    def __init__(self, layers: List[Dict[str, torch.Tensor]], d: int, alpha: float):
        self.layers, self.d, self.alpha = layers, d, alpha

    @property
    def kv_width(self) -> int:
        return META + 2 * self.d * len(self.layers)

    def cols(self, l: int):
        k = META + 2 * self.d * l
        return k, k + self.d, k + 2 * self.d

    def attn_mlp(self, W, l: int, h, x, kv, table, rows, pos):
        """Layer ``l`` for queries whose K/V are in the cache: attention over positions
        ``0..pos`` of each query's row, then the MLP; returns the new residual."""
        p = W["layers"][l]
        a0, a1, a2 = self.cols(l)
        slots, mask = T.context_slots(table, rows, pos)
        q = T.rope(T.linear(x, p["wq"]), pos, W["cos"], W["sin"])
        a = T.attend(q, kv[slots, a0:a1], kv[slots, a1:a2], mask)
        h = h + self.alpha * T.linear(a, p["wo"])
        m = torch.relu(T.linear(T.rms_norm(h), p["w1"]))
        return h + self.alpha * T.linear(m, p["w2"])

    def write(self, W, kv, table, rows, pos, toks, rids, keep=None) -> None:
        """Write the KV rows of new tokens (all layers), causally within the call."""
        slots = table[rows, pos]
        src = None if keep is None else kept_sources(kv.shape[0], slots, keep)

        def store(a: int, b: int, val) -> None:
            store_rows(kv[:, a:b], slots, val, src)

        store(0, META, torch.stack([toks, pos, rids], 1).to(kv.dtype))
        h = W["embed"][toks]
        for l, p in enumerate(W["layers"]):
            x = T.rms_norm(h)
            a0, a1, a2 = self.cols(l)
            store(a0, a1, T.rope(T.linear(x, p["wk"]), pos, W["cos"], W["sin"]))
            store(a1, a2, T.linear(x, p["wv"]))
            if l + 1 < len(W["layers"]):
                h = self.attn_mlp(W, l, h, x, kv, table, rows, pos)

    def column(self, W, kv, table, rows, ctx) -> torch.Tensor:
        """Final residual of the token at position ``ctx - 1`` (its K/V are cached)."""
        pos = ctx - 1
        toks = kv[table[rows, pos], TOK].long()
        h = W["embed"][toks]
        for l in range(len(W["layers"])):
            h = self.attn_mlp(W, l, h, T.rms_norm(h), kv, table, rows, pos)
        return h


class TinyModel:
    """Target (2 layers) and standalone draft (1 layer); EAGLE and MTP heads through
    ``head(kind)``. Stateless apart from the per-device weight copies."""

    name = "tiny"
    kv_dtype = torch.float32
    hidden_dtype = torch.float32

    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2, seed: int = 0,
                 alpha: float = 0.35, max_pos: int = 4096):
        if vocab < 2 or d % 2:
            raise ValueError(f"tiny model needs vocab >= 2 and an even width, got {vocab}, {d}")
        self.vocab, self.d, self.seed = vocab, d, seed
        f = 2 * d
        cos, sin = T.rope_tables(max_pos, d)
        self.cpu = {
            "embed": normal(seed, "embed", (vocab, d), 1.0),
            "head": normal(seed, "head", (d, vocab), d ** -0.5),
            "cos": cos, "sin": sin,
            "target": [layer_weights(seed, f"target{l}", d, f) for l in range(layers)],
            "draft": [layer_weights(seed, "draft0", d, f)],
        }
        self.target_stack = Stack(self.cpu["target"], d, alpha)
        self.draft_stack = Stack(self.cpu["draft"], d, alpha)
        self.kv_width = self.target_stack.kv_width
        self.draft_kv_width = self.draft_stack.kv_width
        self.hidden_width = d
        self._dev: Dict[str, dict] = {}
        self._heads: Dict[str, object] = {}

    def weights(self, device, part: Optional[str] = None) -> dict:
        """Weights on ``device`` (copied once); ``part`` picks the layer list."""
        key = str(device)
        w = self._dev.get(key)
        if w is None:
            def to(x):
                if isinstance(x, list):
                    return [{k: v.to(device) for k, v in p.items()} for p in x]
                return x.to(device)
            w = self._dev[key] = {k: to(v) for k, v in self.cpu.items()}
        if part is None:
            return w
        return {"embed": w["embed"], "head": w["head"], "cos": w["cos"], "sin": w["sin"],
                "layers": w[part]}

    # -- sampling -------------------------------------------------------------------------
    def logits(self, W, h) -> torch.Tensor:
        return T.linear(T.rms_norm(h), W["head"])

    def sample(self, logits, seeds_, positions, seeded) -> torch.Tensor:
        """Greedy argmax; where ``seeded``, a pure function of (seed, position, greedy
        token) replaces it with another token ``SEEDED_PERCENT``% of the time."""
        greedy = logits.argmax(-1)
        u = mix(seeds_ % M, positions + 1)
        other = (greedy + 1 + (u >> 7) % (self.vocab - 1)) % self.vocab
        return torch.where(seeded & (u % 100 < SEEDED_PERCENT), other, greedy)

    # -- the pair ---------------------------------------------------------------------------
    def write_kv(self, kv, table, rows, pos, toks, rids, keep=None) -> None:
        self.target_stack.write(self.weights(kv.device, "target"), kv, table, rows, pos,
                                toks, rids, keep)

    def write_draft_kv(self, draft_kv, table, rows, pos, toks, rids, keep=None) -> None:
        self.draft_stack.write(self.weights(draft_kv.device, "draft"), draft_kv, table, rows,
                               pos, toks, rids, keep)

    def target_hidden(self, kv, table, rows, ctx) -> torch.Tensor:
        """The target's final hidden state at position ``ctx - 1`` ([q, d])."""
        return self.target_stack.column(self.weights(kv.device, "target"), kv, table, rows, ctx)

    def target_logits(self, kv, table, rows, ctx) -> torch.Tensor:
        W = self.weights(kv.device, "target")
        return self.logits(W, self.target_stack.column(W, kv, table, rows, ctx))

    def target(self, kv, table, rows, ctx_lens, seeds_, seeded) -> torch.Tensor:
        return self.sample(self.target_logits(kv, table, rows, ctx_lens), seeds_, ctx_lens, seeded)

    def draft(self, draft_kv, table, rows, ctx_lens, seeds_, seeded, topk: int = 1) -> torch.Tensor:
        W = self.weights(draft_kv.device, "draft")
        h = self.draft_stack.column(W, draft_kv, table, rows, ctx_lens)
        logits = self.logits(W, h)
        tok = self.sample(logits, seeds_, ctx_lens, seeded)
        return self.ranked(logits, tok, topk) if topk > 1 else tok

    @staticmethod
    def ranked(logits, first, topk: int) -> torch.Tensor:
        """Tree drafts' ``topk`` candidates ([q, topk]): the sampled token ``first``, then
        the highest logits of the others (a stable sort: ties by token id)."""
        rest = logits.scatter(-1, first.unsqueeze(-1), float("-inf"))
        order = torch.argsort(rest, dim=-1, descending=True, stable=True)[:, :topk - 1]
        return torch.cat([first.unsqueeze(1), order], 1)

    def head(self, kind: str):
        """The ``eagle`` or ``mtp`` draft head of this target (built once)."""
        if kind not in self._heads:
            from .tiny_heads import make_tiny_head
            self._heads[kind] = make_tiny_head(kind, self)
        return self._heads[kind]

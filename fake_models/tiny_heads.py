"""EAGLE-style head and frozen-KV MTP draft for the tiny transformer.

Both take the target's hidden state (``TinyModel.target_hidden``: the final residual
at a position) and a token embedding, fused as ``x = embed(t) + gamma * (f @ W_f)``,
and predict through the target's output head:

* EAGLE: one decoder layer with its own KV (``[token, position, request, x, K, V]``
  per draft position; position ``p`` holds the pair (``t_{p+1}``, ``f_p``)); its
  output at ``p`` is the hidden state fed to the next chained step.
* MTP: one decoder layer *without* KV: its query attends to the target's last-layer
  K/V at the request's committed positions ``0..lens-1`` (frozen).

Batch invariant like the target (``tiny_ops`` only).
"""
from __future__ import annotations

import torch

from . import tiny_ops as T
from .kv_store import kept_sources, store
from .tiny_weights import META, layer_weights, normal


class _Head:
    def __init__(self, model, name: str, beta: float = 0.35, gamma: float = 0.25):
        d = model.d
        self.model, self.name, self.beta, self.gamma, self.d = model, name, beta, gamma, d
        self.cpu = layer_weights(model.seed, name, d, 2 * d)
        self.cpu["wf"] = normal(model.seed, name + ".wf", (d, d), d ** -0.5)
        self._dev = {}

    def weights(self, device):
        key = str(device)
        if key not in self._dev:
            self._dev[key] = {k: v.to(device) for k, v in self.cpu.items()}
        return self.model.weights(device), self._dev[key]

    def fuse(self, W, P, toks, feats):
        return W["embed"][toks] + self.gamma * T.linear(feats, P["wf"])

    def finish(self, W, P, x, a, seeds, positions, seeded, topk: int = 1):
        """Residual + MLP over attention output ``a``; (hidden, sampled token; with
        ``topk`` > 1 the tree drafts' ``topk`` candidates, ``TinyModel.ranked``)."""
        g = x + self.beta * T.linear(a, P["wo"])
        g = g + self.beta * T.linear(torch.relu(T.linear(T.rms_norm(g), P["w1"])), P["w2"])
        logits = self.model.logits(W, g)
        tok = self.model.sample(logits, seeds, positions, seeded)
        return g, (self.model.ranked(logits, tok, topk) if topk > 1 else tok)


class TinyEagleHead(_Head):
    kv_dtype = torch.float32

    def __init__(self, model):
        super().__init__(model, "eagle")
        self.kv_width = META + 3 * self.d

    def write(self, ekv, table, rows, pos, toks, feats, rids, keep=None) -> None:
        """Draft position ``pos`` from (token ``t_{pos+1}``, feature ``f_pos``)."""
        W, P = self.weights(ekv.device)
        d, slots = self.d, table[rows, pos]
        x = self.fuse(W, P, toks, feats)
        n = T.rms_norm(x)
        k = T.rope(T.linear(n, P["wk"]), pos, W["cos"], W["sin"])
        meta = torch.stack([toks, pos, rids], 1).to(ekv.dtype)
        new = torch.cat([meta, x, k, T.linear(n, P["wv"])], 1)
        store(ekv[:, :META + 3 * d], slots, new,
              None if keep is None else kept_sources(ekv.shape[0], slots, keep))

    def out(self, ekv, table, rows, pos, seeds, seeded, topk: int = 1):
        """Head output at draft position ``pos``: hidden, and the token for ``pos + 2``
        (``topk`` > 1: its candidates)."""
        W, P = self.weights(ekv.device)
        d = self.d
        x = ekv[table[rows, pos], META:META + d]
        slots, mask = T.context_slots(table, rows, pos)
        q = T.rope(T.linear(T.rms_norm(x), P["wq"]), pos, W["cos"], W["sin"])
        a = T.attend(q, ekv[slots, META + d:META + 2 * d], ekv[slots, META + 2 * d:META + 3 * d],
                     mask)
        return self.finish(W, P, x, a, seeds, pos + 2, seeded, topk)


class TinyMTPHead(_Head):
    def __init__(self, model):
        super().__init__(model, "mtp")

    def step(self, kv, table, rows, lens, pos, toks, feats, seeds, seeded):
        """Token ``toks`` at ``pos`` with hidden ``feats``: (hidden, token for ``pos+1``).
        Attends to the target's last-layer K/V of positions ``0..lens-1``."""
        W, P = self.weights(kv.device)
        x = self.fuse(W, P, toks, feats)
        slots, mask = T.context_slots(table, rows, lens - 1)
        a0, a1, a2 = self.model.target_stack.cols(len(self.model.target_stack.layers) - 1)
        q = T.rope(T.linear(T.rms_norm(x), P["wq"]), pos, W["cos"], W["sin"])
        a = T.attend(q, kv[slots, a0:a1], kv[slots, a1:a2], mask)
        return self.finish(W, P, x, a, seeds, pos + 1, seeded)


def make_tiny_head(kind: str, model):
    if kind == "eagle":
        return TinyEagleHead(model)
    if kind == "mtp":
        return TinyMTPHead(model)
    raise ValueError(f"unknown head {kind!r} (eagle or mtp)")

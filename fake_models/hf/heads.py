"""EAGLE-style head and frozen-KV MTP draft for the HF-family decoder.

Both are one decoder layer of the target's shape (``Decoder`` machinery, one layer)
fed ``x = fc([embed(t); f])`` — the EAGLE fusion of a token embedding and the target's
final hidden state ``f`` (``fc: [d, 2d]``) — and predict through the target's final
norm and lm head. Layouts follow ``fake_models.tiny_heads``:

* EAGLE: its own KV ``[token, position, request, x, K, V]`` per draft position
  (position ``p`` holds the pair (``t_{p+1}``, ``f_p``)).
* MTP: no KV; its query attends to the target's last-layer K/V of the committed
  positions ``0..lens-1`` (frozen).

When a checkpoint ships no head, ``derived_head_tensors`` builds one from the target:
the layer's weights are the target's first layer (EAGLE: a layer-skip draft over the
shifted tokens) or last layer (MTP: it reads that layer's cache), and ``fc = [I | 0]``.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..kv_store import kept_sources, store
from . import kernels
from .decoder import META, Decoder


def derived_head_tensors(target: Decoder, kind: str, source) -> dict:
    """HF-named tensors of a one-layer head derived from the target's tensors."""
    c = target.cfg
    t = source()
    src = 0 if kind == "eagle" else c.num_hidden_layers - 1
    out = {n.replace(f"model.layers.{src}.", "model.layers.0."): v for n, v in t.items()
           if n.startswith(f"model.layers.{src}.")}
    for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        if n in t:
            out[n] = t[n]
    d = c.hidden_size
    out["fc.weight"] = torch.cat([torch.eye(d), torch.zeros(d, d)], 1)
    return out


class _Head:
    def __init__(self, model, kind: str, tensors):
        self.model, self.kind = model, kind
        self.dec = Decoder(replace(model.tdec.cfg, num_hidden_layers=1), tensors)
        self._tensors = tensors
        self._fc = {}
        self.d = model.tdec.cfg.hidden_size

    def weights(self, device):
        key = str(device)
        if key not in self._fc:
            fc = self._tensors()["fc.weight"].t().contiguous().to(device)
            self._fc[key] = kernels.for_device(device).prepare(fc)
        return self.dec.weights(device), self._fc[key]

    def fuse(self, W, fc, toks, feats):
        return W["ops"].linear(torch.cat([W["embed"][toks], feats], 1), fc)

    def finish(self, W, h, seeds, positions, seeded):
        """The MLP over ``h`` (the input plus its attention output); (normed hidden,
        sampled token)."""
        g = W["ops"].rms_norm(self.dec.mlp(W, 0, h), W["norm"], self.dec.cfg.rms_norm_eps)
        return g, self.model.sample(self.dec.logits(W, g), seeds, positions, seeded)


class EagleHead(_Head):
    kv_dtype = torch.float32

    def __init__(self, model, tensors):
        super().__init__(model, "eagle", tensors)
        self.kv_width = META + self.d + 2 * self.dec.kvw

    def write(self, ekv, table, rows, pos, toks, feats, rids, keep=None) -> None:
        """Draft position ``pos`` from (token ``t_{pos+1}``, feature ``f_pos``)."""
        W, fc = self.weights(ekv.device)
        slots = table[rows, pos]
        x = self.fuse(W, fc, toks, feats)
        meta = torch.stack([toks, pos, rids], 1).to(ekv.dtype)
        new = torch.cat([meta, x, self.dec.kv_of_residual(W, 0, x, pos)], 1)
        store(ekv[:, :self.kv_width], slots, new,
              None if keep is None else kept_sources(ekv.shape[0], slots, keep))

    def out(self, ekv, table, rows, pos, seeds, seeded):
        """Head output at draft position ``pos``: hidden, and the token for ``pos + 2``."""
        W, _ = self.weights(ekv.device)
        d, kvw = self.d, self.dec.kvw
        x = ekv[table[rows, pos], META:META + d]
        slots, mask = W["ops"].context_slots(table, rows, pos)
        cols = (META + d, META + d + kvw, META + d + 2 * kvw)
        h = self.dec.attend(W, 0, self.dec.query(W, 0, x, pos), ekv, cols, slots, mask,
                            residual=x)
        return self.finish(W, h, seeds, pos + 2, seeded)


class MTPHead(_Head):
    def __init__(self, model, tensors):
        super().__init__(model, "mtp", tensors)

    def step(self, kv, table, rows, lens, pos, toks, feats, seeds, seeded):
        """Token ``toks`` at ``pos`` with hidden ``feats``: (hidden, token for ``pos+1``).
        Attends to the target's last-layer K/V of positions ``0..lens-1``."""
        W, fc = self.weights(kv.device)
        x = self.fuse(W, fc, toks, feats)
        slots, mask = W["ops"].context_slots(table, rows, lens - 1)
        tgt = self.model.tdec
        h = self.dec.attend(W, 0, self.dec.query(W, 0, x, pos), kv,
                            tgt.cols(tgt.cfg.num_hidden_layers - 1), slots, mask, residual=x)
        return self.finish(W, h, seeds, pos + 1, seeded)


HEADS = {"eagle": EagleHead, "mtp": MTPHead}

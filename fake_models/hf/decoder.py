"""A Llama / Qwen2 / Qwen3 decoder over the engine's paged KV cache.

KV row of a slot: ``[token, position, request id]`` (the canary the checkers read,
exact in float32), then per layer the rotated K and the V of every KV head
(``2 * num_key_value_heads * head_dim`` columns). As in ``fake_models.tiny``:
``write`` stores the rows of new tokens layer by layer (causal within one call, so
prefill chunks and verify windows work), and ``column`` recomputes the last context
token through every layer from the cache, reading every context slot through the
request->token table. Every op is from the device's kernel module (``hf.kernels``:
``hf.ops``, the exact path, or ``hf.triton_ops`` on a GPU): bitwise batch invariant.

Weights come from a zero-argument ``source`` (HF names, float32, ``[out, in]``) that is
called on first use only, so naming a real size costs nothing until it runs.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from ..kv_store import kept_sources
from ..kv_store import store as store_rows
from . import kernels
from .config import DecoderConfig

TOK, POS, RID = 0, 1, 2
META = 3
MAX_POS = 4096
MATRICES = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")   # large ones become ExactWeights


class Decoder:
    """One decoder (target or standalone draft) of ``cfg``; weights from ``source()``."""

    def __init__(self, cfg: DecoderConfig, source: Callable[[], Dict[str, torch.Tensor]]):
        self.cfg, self._source = cfg, source
        self.kvw = cfg.num_key_value_heads * cfg.head_dim
        self.kv_width = META + 2 * self.kvw * cfg.num_hidden_layers
        self._cpu: Optional[dict] = None
        self._dev: Dict[str, dict] = {}

    def _prepare(self) -> dict:
        c, t = self.cfg, self._source()
        mat = lambda n: t[n].t().contiguous()                      # noqa: E731  [in, out]
        layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            L = {k: mat(p + n) for k, n in (("wq", "self_attn.q_proj.weight"),
                                           ("wk", "self_attn.k_proj.weight"),
                                           ("wv", "self_attn.v_proj.weight"),
                                           ("wo", "self_attn.o_proj.weight"),
                                           ("wg", "mlp.gate_proj.weight"),
                                           ("wu", "mlp.up_proj.weight"),
                                           ("wd", "mlp.down_proj.weight"))}
            L["ln1"], L["ln2"] = t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"]
            for k in ("q", "k", "v"):
                L["b" + k] = t.get(p + f"self_attn.{k}_proj.bias")
            L["qn"], L["kn"] = t.get(p + "self_attn.q_norm.weight"), t.get(p + "self_attn.k_norm.weight")
            layers.append(L)
        embed = t["model.embed_tokens.weight"]
        head = embed if c.tie_word_embeddings else t["lm_head.weight"]
        cos, sin = kernels.ops.rope_tables(MAX_POS, c.head_dim, c.rope_theta, c.rope_llama3)
        return {"embed": embed, "head": head.t().contiguous(), "norm": t["model.norm.weight"],
                "cos": cos, "sin": sin, "layers": layers}

    def weights(self, device) -> dict:
        """The prepared weights on ``device`` (built and copied once per device), with
        the device's kernel module under ``"ops"``."""
        key = str(device)
        if key not in self._dev:
            if self._cpu is None:
                self._cpu = self._prepare()
            O = kernels.for_device(device)
            to = lambda x: None if x is None else x.to(device)      # noqa: E731
            w = {k: to(v) for k, v in self._cpu.items() if k != "layers"}
            w["head"] = O.prepare(w["head"])
            w["layers"] = [O.layer_weights({k: (O.prepare(to(v)) if k in MATRICES else to(v))
                                            for k, v in L.items()})
                           for L in self._cpu["layers"]]
            w["ops"] = O
            self._dev[key] = w
        return self._dev[key]

    # -- pieces ---------------------------------------------------------------------------
    def cols(self, l: int):
        k = META + 2 * self.kvw * l
        return k, k + self.kvw, k + 2 * self.kvw

    def kv_of_residual(self, W, l: int, h, pos):
        """Layer ``l``'s KV rows of residual inputs ``h`` (normed by its ``ln1`` first;
        on the GPU path the norm is the matmul's prologue)."""
        c = self.cfg
        return W["ops"].attention_inputs(h, W["layers"][l], c.rms_norm_eps,
                                         c.num_attention_heads, c.num_key_value_heads,
                                         c.head_dim, pos, W["cos"], W["sin"], want_q=False)[1]

    def query(self, W, l: int, h, pos):
        """Layer ``l``'s rotated query heads of residual inputs ``h`` at ``pos``."""
        c = self.cfg
        return W["ops"].query(h, W["layers"][l], c.rms_norm_eps, c.num_attention_heads,
                              c.head_dim, pos, W["cos"], W["sin"])

    def attend(self, W, l: int, q, kv, cols, slots, mask, residual=None):
        """Layer ``l``'s attention of the rotated query heads ``q`` over ``kv``'s columns
        ``cols = (k0, k1, v1)`` of ``slots`` where ``mask`` (``context_slots``), through
        the output projection, added to ``residual`` when given; ``[q, d]``."""
        c, L, O = self.cfg, W["layers"][l], W["ops"]
        a = O.attend(q, kv, cols, slots, mask, c.num_key_value_heads)
        return O.linear(a.reshape(slots.shape[0], -1), L["wo"], residual=residual)

    def mlp(self, W, l: int, h):
        L, eps, O = W["layers"][l], self.cfg.rms_norm_eps, W["ops"]
        return O.linear(O.norm_gated(h, L["ln2"], eps, L["wg"], L["wu"]), L["wd"], residual=h)

    def layer(self, W, l: int, h, q, kv, ctx):
        """Layer ``l`` for queries ``q`` (rotated heads) whose K/V are cached: attention
        over positions ``0..pos`` of each query's row (``ctx``: their ``context_slots``,
        the same for every layer), then the MLP; the new residual."""
        h = self.attend(W, l, q, kv, self.cols(l), ctx[0], ctx[1], residual=h)
        return self.mlp(W, l, h)

    # -- the interface the model uses ----------------------------------------------------
    def write(self, kv, table, rows, pos, toks, rids, keep=None) -> None:
        """Write the KV rows of new tokens (all layers), causally within the call."""
        W, eps = self.weights(kv.device), self.cfg.rms_norm_eps
        O = W["ops"]
        slots = table[rows, pos]
        src = None if keep is None else kept_sources(kv.shape[0], slots, keep)

        def store(a: int, b: int, val) -> None:
            store_rows(kv[:, a:b], slots, val, src)

        store(0, META, torch.stack([toks, pos, rids], 1).to(kv.dtype))
        h = W["embed"][toks]
        n = len(W["layers"])
        ctx = O.context_slots(table, rows, pos) if n > 1 else None
        c = self.cfg
        for l in range(n):
            k0, _, v1 = self.cols(l)
            # the last layer's queries are never used: its KV rows alone; without masked
            # entries (unique slots) the kernel that makes the rows stores them too
            q, rows_kv = O.attention_inputs(h, W["layers"][l], eps, c.num_attention_heads,
                                            c.num_key_value_heads, c.head_dim, pos, W["cos"],
                                            W["sin"], want_q=l + 1 < n,
                                            store=(kv, slots, k0) if src is None else None)
            if src is not None:
                store(k0, v1, rows_kv)
            if l + 1 < n:
                h = self.layer(W, l, h, q, kv, ctx)

    def hidden(self, kv, table, rows, ctx) -> torch.Tensor:
        """Final normed hidden state of the token at ``ctx - 1`` (its K/V cached)."""
        W, eps = self.weights(kv.device), self.cfg.rms_norm_eps
        O = W["ops"]
        pos = ctx - 1
        h = W["embed"][kv[table[rows, pos], TOK].long()]
        ctx = O.context_slots(table, rows, pos)
        for l in range(len(W["layers"])):
            h = self.layer(W, l, h, self.query(W, l, h, pos), kv, ctx)
        return O.rms_norm(h, W["norm"], eps)

    def logits(self, W, hidden) -> torch.Tensor:
        return W["ops"].linear(hidden, W["head"])

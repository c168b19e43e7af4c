"""Deterministic fake models for overlapcheck's reference engine.

A model is a target/draft *pair* the engine's kernels call (all tensors on the device
of the buffers they are given):

* ``kv_width``, ``draft_kv_width``, ``kv_dtype``: the KV row of a slot;
  ``hidden_width``, ``hidden_dtype``: the target hidden state EAGLE/MTP heads take;
* ``write_kv`` / ``write_draft_kv(kv, table, rows, pos, toks, rids, keep=None)``: store
  the KV of new tokens (causally within the call), only where ``keep``;
* ``target`` / ``draft(kv, table, rows, ctx_lens, seeds, seeded)``: the token at
  position ``ctx_len`` from the KV of positions ``0..ctx_len-1`` (read through the
  request->token table);
* ``target_hidden(kv, table, rows, ctx_lens)``: the hidden state behind that token;
* ``head("eagle" | "mtp")``: the EAGLE-style head or the frozen-KV MTP draft.

Models: ``oracle`` (integer hashes; ``oracle_heads``; ``oracle-hostlens``: its draft
also reads the host's sequence lengths, ``reads_host_lens`` and ``host_lens_cut``; the
token rule the whole oracle family shares, the targets' fake models included, is
``oracle_rule``),
``tiny`` (a small RoPE transformer over the paged KV; ``tiny``, ``tiny_heads``,
``tiny_ops``), and the real-architecture Llama/Qwen decoders of ``hf``: ``hf:DIR``,
``random:NAME``, ``trained``. A model that cannot be built raises ``hf.ModelError``
(a ``ValueError``).
"""
from .oracle import OracleModel
from .tiny import TinyModel

__all__ = ["OracleModel", "TinyModel", "MODELS", "kv_tagged", "make_model", "vocab_of"]


# the models built here, by name: (class, its arguments)
_BUILT = {"oracle": (OracleModel, {}), "oracle-hostlens": (OracleModel, {"host_lens": True}),
          "tiny": (TinyModel, {})}
MODELS = tuple(_BUILT)


def kv_tagged(name: str) -> bool:
    """Whether model ``name``'s KV rows carry the (token, position, request) tags the
    engine's KV canary checks (``kv_tag_columns``), without building the model: the
    oracle's do; the tiny and real-architecture models' hold keys and values only."""
    cls = _BUILT.get(name, (None,))[0]
    return getattr(cls, "kv_tag_columns", None) is not None


def vocab_of(name: str):
    """The vocabulary size of model ``name`` built by its name alone (``make_model``),
    without building it: the oracle's and the tiny model's; None for the models read
    from weights (``trained``, ``hf:DIR``, ``random:NAME``: their built model's
    ``vocab`` says)."""
    import inspect
    cls = _BUILT.get(name, (None,))[0]
    if cls is None:
        return None
    default = inspect.signature(cls.__init__).parameters.get("vocab")
    return None if default is None else default.default


def make_model(name: str, **kw):
    """A model by name: ``oracle``, ``oracle-hostlens``, ``tiny``, ``trained``, ``hf:DIR``
    or ``random:NAME``."""
    if name == "trained" or name.startswith(("hf:", "random:")):
        from . import hf
        if name == "trained":
            return hf.trained()
        hf.check_name(name)
        return hf.from_dir(name[3:]) if name.startswith("hf:") else hf.random_pair(name[7:])
    if name in _BUILT:
        cls, args = _BUILT[name]
        return cls(**args, **kw)
    raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODELS)}, trained, hf:DIR, random:NAME)")

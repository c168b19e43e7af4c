"""Real-architecture models: Llama / Qwen2 / Qwen3 decoders over the paged KV cache.

* ``hf:DIR``: an HF-format directory (``config.json`` + ``*.safetensors``). ``DIR`` is
  the target, or holds ``target/``; the standalone draft is ``DIR/draft/`` when present,
  else a layer-skip draft (the target's first ``max(1, L // 4)`` layers, its norm and
  head). EAGLE / MTP heads are derived from the target (``heads``).
* ``random:NAME``: seeded random weights of a named shape (``config.SIZES``: real sizes
  such as ``qwen3-0.6b`` and ``llama-1b``, and ``tiny-qwen3`` / ``tiny-llama`` for
  tests), allocated on first use only.
* ``trained``: the committed trained pair in ``fake_models/weights/trained``
  (``fake_models.train_pair`` makes it).

Modules: ``config`` (config.json, named sizes), ``weights`` (HF tensor names,
safetensors I/O, random init), ``ops`` (batch-invariant ops), ``decoder`` (one
decoder over the paged KV), ``heads`` (EAGLE / MTP), ``model`` (the pair).
Errors are ``ModelError`` (one line, naming the file or tensor).
"""
from __future__ import annotations

import os
from dataclasses import replace

from . import config as C
from . import weights as Wt
from .errors import ModelError
from .model import HFModel, Lazy

__all__ = ["HFModel", "ModelError", "from_dir", "random_pair", "trained", "TRAINED_DIR",
           "check_name"]

TRAINED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "weights", "trained")


def check_name(name: str) -> None:
    """Validate the *form* of an ``hf:`` / ``random:`` name (nothing is read)."""
    if name.startswith("hf:") and len(name) > 3:
        return
    if name.startswith("random:"):
        if name[7:] not in C.SIZES:
            raise ModelError(f"unknown random size {name[7:]!r} (choose from {', '.join(C.SIZES)})")
        return
    raise ModelError(f"bad model name {name!r} (hf:DIR or random:NAME)")


def _dir(path: str):
    cfg = C.read(path)
    tensors = Wt.load(path, cfg)
    return cfg, (lambda: tensors)


def from_dir(path: str, name: str = None) -> HFModel:
    """The pair of an HF-format directory (checked now: config and every tensor)."""
    name = name or f"hf:{path}"
    if not os.path.isdir(path):
        raise ModelError(f"{path}: no such model directory")
    tdir = os.path.join(path, "target") if os.path.isdir(os.path.join(path, "target")) else path
    tcfg, tsrc = _dir(tdir)
    ddir = os.path.join(path, "draft")
    if os.path.isdir(ddir):
        dcfg, dsrc = _dir(ddir)
    else:
        dcfg, dsrc = replace(tcfg, num_hidden_layers=max(1, tcfg.num_hidden_layers // 4)), tsrc
    return HFModel(name, tcfg, tsrc, dcfg, dsrc)


def random_pair(size: str, seed: int = 0) -> HFModel:
    """Seeded random weights of ``config.SIZES[size]``; nothing allocated until used."""
    check_name("random:" + size)
    tcfg, dcfg = C.SIZES[size]
    return HFModel(f"random:{size}", tcfg, Lazy(lambda: Wt.random_init(tcfg, seed, size + ".target")),
                   dcfg, Lazy(lambda: Wt.random_init(dcfg, seed, size + ".draft")))


def trained(path: str = TRAINED_DIR) -> HFModel:
    """The committed trained pair (``target/`` and ``draft/`` under ``path``)."""
    if not os.path.isdir(os.path.join(path, "target")):
        raise ModelError(f"model 'trained': no weights in {path} (make them with "
                         f"'python -m fake_models.train_pair --out {path}')")
    return from_dir(path, "trained")

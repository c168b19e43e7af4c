"""The engine's model with its device calls replayed from CUDA graphs.

``GraphedModel(model)`` stands in for the model pair (``fake_models``' interface) and
its EAGLE/MTP heads. Until ``arm(cache)`` its calls go straight to the model; after, the
calls below go through the runtime's ``GraphCache`` (``device.graphs``): the engine's
long-lived buffers (KV, request->token table) are static arguments, the per-step index
tensors are copied into the graph's inputs. Everything else (widths, dtypes, ``sample``)
is the model's own attribute.

The engine arms it at the end of its set-up, when every long-lived buffer exists and no
per-step buffer does yet (``Engine.__init__``).
"""
from __future__ import annotations

from typing import Dict, Optional

MODEL_CALLS = frozenset(("write_kv", "write_draft_kv", "target", "draft", "target_hidden",
                         "host_lens_cut"))
HEAD_CALLS = frozenset(("write", "out", "step"))


class _Graphed:
    def __init__(self, inner, prefix: str, calls, box: list):
        self._inner, self._prefix, self._calls, self._box = inner, prefix, calls, box

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name not in self._calls:
            return attr
        box, key = self._box, f"{self._prefix}.{name}"

        def call(*args, **kwargs):
            cache = box[0]
            if cache is None:
                return attr(*args, **kwargs)
            return cache.call(key, attr, *args, **kwargs)
        self.__dict__[name] = call    # made once: later lookups skip __getattr__
        return call


class GraphedModel(_Graphed):
    """A model pair whose calls replay from CUDA graphs once ``arm``ed."""

    def __init__(self, model):
        super().__init__(model, "model", MODEL_CALLS, [None])
        self._heads: Dict[str, _Graphed] = {}

    @property
    def model(self):
        return self._inner

    @property
    def cache(self):
        return self._box[0]

    def arm(self, cache: Optional[object]) -> None:
        self._box[0] = cache

    def head(self, kind: str):
        if kind not in self._heads:
            self._heads[kind] = _Graphed(self._inner.head(kind), f"head:{kind}", HEAD_CALLS,
                                         self._box)
        return self._heads[kind]

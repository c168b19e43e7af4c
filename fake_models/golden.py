"""The golden reference: what a request must produce, computed without the engine
(docs/design.md §9.3).

``Golden(model, width)`` answers, for one request at a time (prompt, sampling seed,
greedy or seeded):

* ``sequence(prompt, seed, seeded, need, hint)``: the prompt followed by the model's own
  continuation, ``need`` tokens long — the tokens the target gives, greedy or seeded,
  with no paging, batching, overlap or speculation. ``hint`` (the engine's tokens) only
  speeds it up: a hinted token counts only once the model has produced it too.
* ``accept_lens(prompt, seed, seeded, kind, k, starts)``: for verifies at committed
  lengths ``starts`` (context ``G[:L]``, input ``G[L]``), the accept length the golden
  draft and golden target imply: 1 + the longest prefix of the ``k`` drafts the draft
  kind proposes from that prefix that equal the continuation.

Models of the oracle family run as exact Python integers (``golden_oracle``), every
other model through its own API on the CPU (``golden_torch``; on the run's device where
the model is not exact there: ``exact_on``). Results are cached per
request, so a checker asking again, or a fuzz campaign re-running a shrunk workload,
pays once; ``shared(model, width)`` keeps one ``Golden`` per (model, row width) — a memo
of pure functions: nothing in it changes what any call returns.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import List, Sequence, Tuple

from .golden_oracle import OracleRequest
from .golden_torch import ModelRequest
from .oracle import OracleModel

CACHED_REQUESTS = 512
# the draft kinds with a golden draft written here (a kind added to the engine's registry
# alone is not predicted: accept-oracle stays idle on it until its golden draft lands)
GOLDEN_KINDS = ("standalone", "eagle", "mtp")


class Golden:
    """The golden reference of model ``model`` (a name ``make_model`` knows, or a model
    object) for contexts up to ``width`` tokens (the engine's row width)."""

    kinds = GOLDEN_KINDS

    def __init__(self, model, width: int, cached: int = CACHED_REQUESTS, device: str = "cpu"):
        if isinstance(model, str):
            from . import make_model
            model = make_model(model)
        self.model, self.width, self.cached, self.device = model, width, cached, device
        self.exact = isinstance(model, OracleModel)
        self._reqs: "OrderedDict[tuple, object]" = OrderedDict()

    def _req(self, prompt, seed: int, seeded: bool):
        key = (tuple(int(t) for t in prompt), int(seed), bool(seeded))   # drafts read the seed
        r = self._reqs.get(key)
        if r is None:
            if self.exact:
                r = OracleRequest(self.model, key[0], key[1], seeded)
            else:
                r = ModelRequest(self.model, self.width, key[0], key[1], seeded,
                                 device=self.device)
            self._reqs[key] = r
            if len(self._reqs) > self.cached:
                self._reqs.popitem(last=False)
        else:
            self._reqs.move_to_end(key)
        return r

    def sequence(self, prompt, seed: int, seeded: bool, need: int,
                 hint: Sequence[int] = ()) -> Tuple[int, ...]:
        """Prompt + golden continuation, ``min(need, width)`` tokens."""
        r = self._req(prompt, seed, seeded)
        need = min(need, self.width)
        if len(r.G) < need:
            if self.exact:
                r.extend(need)
            else:
                r.extend(need, hint)
        return tuple(r.G[:need])

    def accept_lens(self, prompt, seed: int, seeded: bool, kind: str, k: int,
                    starts: Sequence[int], hint: Sequence[int] = (), topk: int = 1) -> List[int]:
        """Golden accept lengths of verifies at committed lengths ``starts`` (``topk`` > 1:
        tree drafts, docs/design.md §4.12)."""
        if not starts:
            return []
        self.sequence(prompt, seed, seeded, max(starts) + k + 1, hint)
        r = self._req(prompt, seed, seeded)
        if self.exact:
            return [r.accept_len(kind, k, L, topk) for L in starts]
        return r.accept_lens(kind, k, starts, topk)


@functools.lru_cache(maxsize=4)
def _model(name: str):
    from . import make_model
    return make_model(name)


def shared(model: str, width: int, device: str = "cpu") -> Golden:
    """One ``Golden`` per (model name, row width, device), built on first use; the model
    itself is built once per name."""
    return _shared(model, width, device)


@functools.lru_cache(maxsize=16)
def _shared(model: str, width: int, device: str) -> Golden:
    return Golden(_model(model), width, device=device)


def exact_on(model, device: str) -> bool:
    """Whether ``model`` (a name or a model) computes the same bits on torch device
    ``device`` as on the CPU, so that its references (golden, parity's) may run on the
    CPU for a run there; models without ``exact_on`` are exact everywhere."""
    m = _model(model) if isinstance(model, str) else model
    check = getattr(m, "exact_on", None)
    return True if check is None else bool(check(device))

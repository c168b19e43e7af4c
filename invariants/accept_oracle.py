"""accept-oracle: each verify's accept length is the one the golden draft and golden
target imply for that request at that position (docs/design.md §5.2, §9.3).

For a kept verify at committed length ``L`` (KV holds the request's first ``L``
tokens, its input is token ``L``), the expected accept length is 1 + the longest prefix
of the ``k`` drafts the draft kind proposes from that prefix that equal the golden
continuation — computed by ``fake_models.golden`` without the engine, for every draft
kind: standalone (its own KV over the prefix), EAGLE (the head over the pairs of the
prefix and its own chained state), frozen-KV MTP (the head over the target KV of
``0..L-1``), whether the round was drafted at the decode's start or, with zero bubble,
one decode ahead (the same pure function of the same prefix). A decode without spec
accepts exactly 1. The accept length compared is the device's, before the engine cuts
the kept tokens at a stop token or the length limit (``golden`` checks those tokens).

What the golden run cannot see, and the bound kept: a draft that reads host state
(``oracle-hostlens`` reads the host's sequence lengths, an upper bound of the round's
start) is predicted as if that bound held, which the engine must guarantee; a stale
bound is reported here too. Only verifies whose context and kept tokens are the
golden ones are judged: once a request's tokens leave its continuation (``golden``
reports that), its later accept lengths are not predictable and are skipped.

Parity first, as for golden: with parity's reference in the context, a request's
verifies from the first whose accept length (with ``parity_accept``) or tokens differ
from the reference's are parity's finding; this checker judges what both runs share.

Context: ``model_golden`` and ``engine_config`` (``spec``, ``spec_steps``,
``draft_kind``); without them, or for a draft kind with no golden draft
(``fake_models.golden.GOLDEN_KINDS``: a kind added to the engine's registry alone), the
checker is idle; ``reference`` and ``parity_accept``
(parity's) when given.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation

SEEDED = "seeded"


class AcceptOracle(Checker):
    name = "accept-oracle"
    targets = ("reference",)

    def __init__(self, model_golden=None, engine_config=None, reference=None,
                 parity_accept: bool = True, **context) -> None:
        super().__init__()
        cfg = engine_config
        self.k = cfg.spec_steps if cfg is not None and cfg.spec else 0
        self.kind = getattr(cfg, "draft_kind", "")
        self.topk = getattr(cfg, "topk", 1) if self.k else 1    # tree drafts (§4.12)
        predicted = not self.k or self.kind in getattr(model_golden, "kinds", ())
        self.golden = model_golden if cfg is not None and predicted else None
        self.idle = self.golden is None
        self.ref = reference.requests if reference is not None else None
        self.ref_accept = parity_accept
        self.specs: Dict[int, object] = {}
        self.out: Dict[int, List[int]] = {}
        # per request: (verify index, L, accept length, tokens kept, batch, step)
        self.verifies: Dict[int, List[Tuple[int, int, int, int, int, int]]] = {}

    def on_Arrived(self, ev: E.Arrived):
        if self.golden is not None and ev.spec is not None:
            self.specs[ev.rid] = ev.spec
            self.out[ev.rid], self.verifies[ev.rid] = [], []

    def on_Prefilled(self, ev: E.Prefilled):
        if not ev.dropped and ev.token >= 0 and ev.rid in self.out:
            self.out[ev.rid].append(ev.token)

    def on_Verified(self, ev: E.Verified):
        out = self.out.get(ev.rid)
        if ev.dropped or out is None:
            return
        L = len(self.specs[ev.rid].prompt) + len(out) - 1
        self.verifies[ev.rid].append((ev.index, L, ev.accept_len, len(ev.tokens), ev.batch,
                                      ev.iteration))
        out.extend(ev.tokens)

    def on_VerifiedBatch(self, ev: E.VerifiedBatch):
        """``on_Verified`` over the run in one loop."""
        outs, specs, verifies, it, bid = self.out, self.specs, self.verifies, ev.iteration, ev.batch
        for rid, index, got, tokens, dropped in zip(ev.rids, ev.index, ev.accept_len,
                                                     ev.tokens, ev.dropped):
            out = outs.get(rid)
            if dropped or out is None:
                continue
            verifies[rid].append((index, len(specs[rid].prompt) + len(out) - 1, got,
                                  len(tokens), bid, it))
            out.extend(tokens)

    def on_Finished(self, ev: E.Finished):
        return self._check(ev.rid)

    def on_Aborted(self, ev: E.Aborted):
        return self._check(ev.rid)

    def on_RunEnd(self, ev: E.RunEnd):
        return self.finish()

    def finish(self) -> List[Violation]:
        out: List[Violation] = []
        for rid in list(self.specs):
            out += self._check(rid)
        return out

    def _shared(self, rid: int, out: List[int], verifies: list, P: int) -> list:
        """The verifies judged here: those before the request leaves parity's reference."""
        ref = self.ref.get(rid) if self.ref is not None else None
        if ref is None:
            return verifies
        split = next((i for i in range(min(len(out), len(ref.tokens)))
                      if out[i] != ref.tokens[i]), len(out))
        if ref.finish_reason != "abort":
            split = min(split, len(ref.tokens))
        keep = []
        for v in verifies:
            index, L, got, n = v[:4]
            if L + n - P >= split or (self.ref_accept and index < len(ref.accept_lens)
                                      and ref.accept_lens[index] != got):
                break
            keep.append(v)
        return keep

    def _check(self, rid: int) -> List[Violation]:
        spec = self.specs.pop(rid, None)
        out, verifies = self.out.pop(rid, []), self.verifies.pop(rid, [])
        if spec is None or not verifies:
            return []
        verifies = self._shared(rid, out, verifies, len(spec.prompt))
        if not self.k:
            want = [1] * len(verifies)
        else:
            prompt, P = tuple(spec.prompt), len(spec.prompt)
            seeded, hint = spec.sampling == SEEDED, prompt + tuple(out)
            seq = self.golden.sequence(prompt, spec.seed, seeded, P + len(out), hint)
            good = next((i for i, t in enumerate(out) if P + i >= len(seq) or t != seq[P + i]),
                        len(out))
            # judged: verifies whose context and kept tokens are all golden
            verifies = [v for v in verifies if v[1] + v[3] - P < good]
            want = self.golden.accept_lens(prompt, spec.seed, seeded, self.kind, self.k,
                                           [v[1] for v in verifies], hint,
                                           **({"topk": self.topk} if self.topk > 1 else {}))
        for (index, L, got, _, batch, step), exp in zip(verifies, want):
            if got != exp:
                kind = f"{self.k} {self.kind} drafts" if self.k else "no spec"
                if self.topk > 1:
                    kind += f", a tree of top-{self.topk}"
                return [Violation(
                    self.name, step, f"request {rid}: verify #{index} accepted {got}, not what "
                    f"the golden draft and target give", f"accept length {exp} ({kind} at "
                    f"committed length {L})", f"accept length {got} (batch {batch})",
                    ("accept-length",), {"rid": rid, "batch": batch, "index": index,
                                         "committed": L, "expected": exp, "seen": got})]
        return []

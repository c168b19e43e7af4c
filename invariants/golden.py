"""golden: every request's tokens are the model's own continuation of its prompt,
computed without the engine (docs/design.md §5.2, §9.3).

Parity compares the overlap run with the engine's own non-overlap run, so a bug both
schedules share (a kernel reading the wrong position, a draft-extend off by one) is
invisible to it. This checker compares each request with the golden reference
(``fake_models.golden``): the target's greedy or seeded continuation, one request at a
time, no paging, batching, overlap or speculation. Batch invariance makes it bit-exact.

* every kept token equals the continuation's token at its position (a request's tokens
  are checked when it ends, or at the end of the run for one that never ended; an
  aborted one need only be a prefix);
* a finished request ends where the continuation ends: at its first stop token, else
  at ``min(max_new_tokens, max_context - prompt)`` tokens (and a request keeps no token
  past that end, finished or not).

Parity first: when parity's reference run is in the context too, a request's tokens
from the first one that differs from the reference's, and an end unlike the
reference's, are parity's finding (one bug, one report); this checker judges what the
two runs share — exactly the bugs parity cannot see. Without a reference it judges
everything.

Context: ``model_golden`` (a ``Golden``) and ``engine_config`` (for ``max_context``);
without them the checker is idle; ``reference`` (parity's) when given. Violations name
the request, the position, the continuation's token and the engine's.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from overlapcheck.protocol import events as E

from .base import Checker, Violation

SEEDED = "seeded"


class Golden(Checker):
    name = "golden"
    targets = ("reference",)    # the reference engine's models have a golden reference

    def __init__(self, model_golden=None, engine_config=None, reference=None,
                 **context) -> None:
        super().__init__()
        self.golden = model_golden if engine_config is not None else None
        self.idle = self.golden is None
        self.ref = reference.requests if reference is not None else None
        self.max_context = getattr(engine_config, "max_context", 0)
        self.specs: Dict[int, object] = {}
        self.out: Dict[int, List[int]] = {}
        self.kept: Dict[int, List[tuple]] = {}    # per request: (tokens so far, step, batch)

    # -- bookkeeping ----------------------------------------------------------------------
    def on_Arrived(self, ev: E.Arrived):
        if self.golden is not None and ev.spec is not None:
            self.specs[ev.rid] = ev.spec
            self.out[ev.rid], self.kept[ev.rid] = [], []

    def _keep(self, ev, tokens) -> None:
        out = self.out[ev.rid]
        out.extend(tokens)
        self.kept[ev.rid].append((len(out), ev.iteration, ev.batch))

    def on_Prefilled(self, ev: E.Prefilled):
        if not ev.dropped and ev.token >= 0 and ev.rid in self.out:
            self._keep(ev, (ev.token,))

    def on_Verified(self, ev: E.Verified):
        if not ev.dropped and ev.rid in self.out:
            self._keep(ev, ev.tokens)

    def on_VerifiedBatch(self, ev: E.VerifiedBatch):
        """``on_Verified`` over the run in one loop."""
        outs, kept_of, it, bid = self.out, self.kept, ev.iteration, ev.batch
        for rid, tokens, dropped in zip(ev.rids, ev.tokens, ev.dropped):
            out = outs.get(rid)
            if not dropped and out is not None:
                out.extend(tokens)
                kept_of[rid].append((len(out), it, bid))

    def on_Finished(self, ev: E.Finished):
        return self._check(ev.iteration, ev.batch, ev.rid, list(ev.tokens), ev.reason)

    def on_Aborted(self, ev: E.Aborted):
        return self._check(ev.iteration, ev.batch, ev.rid, list(ev.tokens), None)

    def on_RunEnd(self, ev: E.RunEnd):
        return self._rest(ev.iteration)

    def finish(self) -> List[Violation]:
        return self._rest(-1)

    def _rest(self, step: int) -> List[Violation]:
        out: List[Violation] = []
        for rid in list(self.specs):
            out += self._check(step, -1, rid, self.out[rid], None)
        return out

    # -- the check ------------------------------------------------------------------------
    def _v(self, step, batch, rid, kind, msg, expected, seen, **details) -> List[Violation]:
        return [Violation(self.name, step, f"request {rid}: {msg}", expected, seen, (kind,),
                          {"rid": rid, "batch": batch, **details})]

    def _check(self, step: int, batch: int, rid: int, tokens: List[int],
               reason: Optional[str]) -> List[Violation]:
        spec = self.specs.pop(rid, None)
        self.out.pop(rid, None)
        kept = self.kept.pop(rid, [])
        if spec is None:
            return []
        prompt, P = tuple(spec.prompt), len(spec.prompt)
        seeded = spec.sampling == SEEDED
        shared, ends = self._shared(rid, tokens, reason)
        seq = self.golden.sequence(prompt, spec.seed, seeded, P + len(tokens),
                                   prompt + tuple(tokens))
        for i, tok in enumerate(tokens[:shared]):
            if P + i >= len(seq):
                break
            if tok != seq[P + i]:
                # named by the result that kept it
                _, step, batch = next((k for k in kept if k[0] > i), (0, step, batch))
                return self._v(step, batch, rid, "token", f"output token {i} is not the "
                               f"model's continuation", f"token {seq[P + i]} (the model after "
                               f"the prompt and {i} output tokens)", f"token {tok}", position=i)
        if not ends:
            return []
        limit = min(spec.max_new_tokens, self.max_context - P)
        stops = [i for i, t in enumerate(tokens) if t in spec.stop_ids]
        end = min(stops[0] + 1 if stops else limit, limit)
        if len(tokens) > end:
            return self._v(step, batch, rid, "past-end", f"{len(tokens)} tokens kept, past the "
                           f"end of the continuation", self._end(spec, tokens[:end], end),
                           f"{len(tokens) - end} more token(s): {tokens[end:end + 4]}")
        if reason is not None:
            want = "stop" if stops and stops[0] + 1 == len(tokens) else "length"
            if len(tokens) < end or want != reason:
                return self._early(step, batch, rid, spec, tokens, reason, limit)
        return []

    def _shared(self, rid: int, tokens: List[int], reason: Optional[str]):
        """(leading tokens judged here, whether the end is): the rest is parity's."""
        ref = self.ref.get(rid) if self.ref is not None else None
        if ref is None:
            return len(tokens), True
        ref_toks = ref.tokens
        for i in range(min(len(tokens), len(ref_toks))):
            if tokens[i] != ref_toks[i]:
                return i, False
        if ref.finish_reason == "abort":
            return len(tokens), True
        if len(tokens) > len(ref_toks):
            return len(ref_toks), False
        return len(tokens), reason is None or (reason, len(tokens)) == (ref.finish_reason,
                                                                         len(ref_toks))

    @staticmethod
    def _end(spec, kept, n: int) -> str:
        last = kept[-1] if kept else None
        why = f"stop token {last}" if last in spec.stop_ids else f"the length limit {n}"
        return f"{n} tokens, ending at {why}"

    def _early(self, step, batch, rid, spec, tokens, reason, limit) -> List[Violation]:
        """A finished request that does not end where its continuation ends."""
        prompt, P = tuple(spec.prompt), len(spec.prompt)
        seq = self.golden.sequence(prompt, spec.seed, spec.sampling == SEEDED, P + limit,
                                   prompt + tuple(tokens))[P:]
        stops = [i for i, t in enumerate(seq) if t in spec.stop_ids]
        end = min(stops[0] + 1 if stops else limit, limit)
        want = "stop" if stops and stops[0] + 1 == end else "length"
        return self._v(step, batch, rid, "end",
                       f"finished '{reason}' after {len(tokens)} tokens; its continuation ends "
                       f"elsewhere", f"'{want}' after {end} tokens", f"'{reason}' after "
                       f"{len(tokens)} tokens")

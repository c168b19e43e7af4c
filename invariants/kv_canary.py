"""kv-canary: every KV slot a forward reads holds the (request, position, token) the
reader expects.

The device checks each slot it reads against its (request, position) tag and digests
the tokens; the record comes back with the batch's result (``Canary`` events, no extra
sync). Here the host side holds it against what the host knows: no mismatching tag;
the digest equal to that of the request's own tokens at positions 0..n-1 (when the host
knows them all); and for a verify the host kept, the device read exactly the committed
length the host had (a stale FutureMap length reads rejected draft slots).

The expected digest is kept per request as that of the longest read so far, extended
to a longer read by its new tokens (a record then costs its newly read tokens, not
O(context), and a long run's steps do not grow slower with its contexts); a shorter
read (after a retraction) is summed from the start. A result only appends its
tokens, so a model without canary records pays nearly nothing here.

With a draft kind that keeps KV rows with tags (EAGLE's KV, a standalone draft's;
``Canary.draft``), the same holds for them: each row the draft keeps (positions
0..n-1 of the record) is tagged with its own (request, position), and holds the
request's token at position + shift (EAGLE's pair at p holds the token at p + 1).

Context: ``kv_tags`` False (the model's KV has no tags: no record will come, e.g. the
real-architecture models) makes it idle; the reference target says so for its model.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from overlapcheck.protocol import events as E
from overlapcheck.protocol.canary import (C_BAD, C_DIGEST, C_LEN, DK_BAD, DK_DIGEST, DK_LEN,
                                          DK_SHIFT)
from overlapcheck.protocol.digest import DIGEST_M, weight

from .base import Checker, Violation


# the digest's weight of each position (``digest.weight`` mod M), for positions 0.. as
# far as a context has reached: computed once per position, not once per committed token
_WEIGHTS: List[int] = []


def _grow_weights(n: int) -> None:
    w = _WEIGHTS
    for p in range(len(w), n):
        w.append(weight(p) % DIGEST_M)


class KVCanary(Checker):
    name = "kv-canary"
    targets = ("reference",)    # reads what only the reference engine emits

    def __init__(self, kv_tags: Optional[bool] = None, **context) -> None:
        super().__init__()
        # ``kv_tags`` False: the model's KV has no canary tags, so no record comes (and
        # keeping every request's tokens would be for nothing); None: not known
        self.idle = kv_tags is False
        self.tokens: Dict[int, List[int]] = {}          # prompt + accepted output, per request
        # per request: (n, E.token_digest(tokens[:n])) for the longest read so far
        # (``digest`` moves it)
        self.mark: Dict[int, Tuple[int, int]] = {}
        # per request: (batch, committed length) of its kept verify whose record is due
        # (a record comes right after its entry's result: ``events.Canary``)
        self.kept: Dict[int, Tuple[int, int]] = {}
        # the draft KV's rows (``Canary.draft``): per request, the mark of ``digest``
        # for the tokens shifted by the draft's shift
        self.dmark: Dict[int, Tuple[int, int]] = {}

    def on_Arrived(self, ev: E.Arrived):
        if ev.spec is not None:
            self.tokens[ev.rid] = list(ev.spec.prompt)
            self.mark[ev.rid] = (0, 0)

    def digest(self, rid: int, n: int) -> int:
        """``events.token_digest`` of the request's first ``n`` tokens (``n`` at most
        its count): from the mark on when ``n`` reaches it, else from the start, one
        position at a time (the sum of (t mod M) * w mod M and t * w agree mod M)."""
        start, h = self.mark[rid]
        if n == start:
            return h
        longer = n > start
        if not longer:
            start, h = 0, 0
        toks, w = self.tokens[rid], _WEIGHTS
        if len(w) < n:
            _grow_weights(n)
        for p in range(start, n):
            h = (h + toks[p] * w[p]) % DIGEST_M
        if longer:
            self.mark[rid] = (n, h)
        return h

    def draft_digest(self, rid: int, n: int, shift: int) -> Optional[int]:
        """``events.token_digest`` of the tokens a draft KV holds at positions 0..n-1
        (the request's tokens ``shift``.. ``shift + n - 1`` at those positions), or None
        while the host does not know them all; kept like ``digest`` (one shift a run)."""
        toks = self.tokens.get(rid)
        if toks is None or n + shift > len(toks):
            return None
        start, h = self.dmark.get(rid, (0, 0))
        longer = n >= start
        if not longer:
            start, h = 0, 0
        w = _WEIGHTS
        if len(w) < n:
            _grow_weights(n)
        for p in range(start, n):
            h = (h + toks[p + shift] * w[p]) % DIGEST_M
        if longer:
            self.dmark[rid] = (n, h)
        return h

    def _draft_ok(self, rid: int, rec) -> bool:
        """A draft KV record (``DK_*`` columns of ``rec``) with nothing to report."""
        if rec[DK_BAD] or rec[DK_LEN] < 0:
            return False
        want = self.draft_digest(rid, rec[DK_LEN], rec[DK_SHIFT])
        return want is None or want == rec[DK_DIGEST]

    def on_Prefilled(self, ev: E.Prefilled):
        if not ev.dropped and ev.token >= 0 and ev.rid in self.tokens:
            self.tokens[ev.rid].append(ev.token)

    def on_Verified(self, ev: E.Verified):
        toks = self.tokens.get(ev.rid)
        if toks is not None and not ev.dropped:
            self.kept[ev.rid] = (ev.batch, len(toks) - 1)
            toks.extend(ev.tokens)

    def on_Canary(self, ev: E.Canary) -> List[Violation]:
        rid, n = ev.rid, ev.read_len
        kept = self.kept.pop(rid, None)
        exp = kept[1] if kept is not None and kept[0] == ev.batch else None
        if not ev.bad and n >= 0 and (exp is None or exp == n):
            # nearly every record: a good one, told apart without building a message
            toks = self.tokens.get(rid)
            if (toks is None or n > len(toks) or self.digest(rid, n) == ev.digest) and (
                    not ev.draft or self._draft_ok(rid, (0,) * DK_LEN + tuple(ev.draft))):
                return []
        return self._check(ev, exp)

    def on_VerifiedBatch(self, ev: E.VerifiedBatch) -> List[Tuple[int, Violation]]:
        """``on_Verified``, then ``on_Canary`` when the run has records, entry by entry
        in one loop."""
        tokens, kept, records, bid = self.tokens, self.kept, ev.records, ev.batch
        out: List[Tuple[int, Violation]] = []
        for i, (rid, new, dropped) in enumerate(zip(ev.rids, ev.tokens, ev.dropped)):
            toks = tokens.get(rid)
            if toks is not None and not dropped:
                exp = len(toks) - 1
                toks.extend(new)
                if not records:
                    kept[rid] = (bid, exp)
                    continue
                if kept:            # its record is right here: nothing stays due
                    kept.pop(rid, None)
            elif not records:
                continue
            else:
                k = kept.pop(rid, None) if kept else None
                exp = k[1] if k is not None and k[0] == bid else None
            rec = records[i]
            n = rec[C_LEN]
            if not rec[C_BAD] and n >= 0 and (exp is None or exp == n) and (
                    toks is None or n > len(toks) or self.digest(rid, n) == rec[C_DIGEST]) and (
                    not ev.draft or self._draft_ok(rid, rec)):
                continue
            p = ev.position(i, canary=True)
            out += [(p, v) for v in self._check(ev.canary(i), exp)]
        return out

    def _check(self, ev: E.Canary, exp) -> List[Violation]:
        """The record's violations; ``exp``: the committed length the host kept for its
        verify (None: not a kept verify)."""
        out = []
        toks = self.tokens.get(ev.rid)
        where = f"batch {ev.batch} (request {ev.rid})"
        if ev.read_len < 0 or ev.bad < 0 or ev.bad > max(ev.read_len, 0):
            # not a record the forward wrote: the host read the pinned buffer before the
            # copy landed (poison) or after the next batch's copy (a stale record)
            return [Violation(
                self.name, ev.iteration, f"the canary record of {where} is not one a "
                f"forward wrote", "0 <= mismatching slots <= read length",
                f"read length {ev.read_len}, mismatching slots {ev.bad}", ("garbled-record",),
                {"rid": ev.rid, "read_len": ev.read_len, "bad": ev.bad})]
        if ev.bad:
            tok, pos, rid = ev.found
            want = f"request {ev.rid}, position {ev.position}"
            if toks is not None and 0 <= ev.position < len(toks):
                want += f", token {toks[ev.position]}"
            kind = "stale-own-slot" if rid == ev.rid else "foreign-slot"
            out.append(Violation(
                self.name, ev.iteration, f"forward of {where} read {ev.bad} KV slot(s) holding "
                f"another (request, position); first: slot {ev.slot} at position {ev.position}",
                f"slot {ev.slot} holds ({want})",
                f"slot {ev.slot} holds (request {rid}, position {pos}, token {tok})", (kind,),
                {"rid": ev.rid, "slot": ev.slot, "position": ev.position, "found": ev.found}))
        elif toks is not None and ev.read_len <= len(toks):
            want = self.digest(ev.rid, ev.read_len)
            if want != ev.digest:
                out.append(Violation(
                    self.name, ev.iteration, f"forward of {where} read tokens that are not the "
                    f"request's at positions 0..{ev.read_len - 1}",
                    f"token digest {want} of the committed tokens",
                    f"token digest {ev.digest} of the KV read", ("token-digest",),
                    {"rid": ev.rid, "read_len": ev.read_len}))
        if ev.draft:
            out += self._check_draft(ev, where)
        if exp is not None and exp != ev.read_len:
            out.append(Violation(
                self.name, ev.iteration, f"forward of {where} read a committed length the host "
                f"did not commit", f"{exp} positions (the host's committed length)",
                f"{ev.read_len} positions read", ("committed-length",),
                {"rid": ev.rid, "expected": exp, "seen": ev.read_len}))
        return out

    def _check_draft(self, ev: E.Canary, where: str) -> List[Violation]:
        """The draft KV's rows (``ev.draft``): each kept row holds the (request, position)
        it stands at and the request's token at position + shift."""
        n, bad, slot, pos, tok, kpos, rid, digest, shift = ev.draft
        toks = self.tokens.get(ev.rid)
        if n < 0 or bad < 0 or bad > max(n, 0):
            return [Violation(
                self.name, ev.iteration, f"the draft KV canary record of {where} is not one "
                f"a forward wrote", "0 <= mismatching rows <= rows read",
                f"rows read {n}, mismatching rows {bad}", ("draft-garbled-record",),
                {"rid": ev.rid, "read_len": n, "bad": bad})]
        if bad:
            want = f"request {ev.rid}, position {pos}"
            if toks is not None and 0 <= pos + shift < len(toks):
                want += f", token {toks[pos + shift]}"
            kind = "draft-stale-own-slot" if rid == ev.rid else "draft-foreign-slot"
            return [Violation(
                self.name, ev.iteration, f"draft KV of {where}: {bad} of the {n} rows it keeps "
                f"hold another (request, position); first: slot {slot} at position {pos}",
                f"slot {slot} holds ({want})",
                f"slot {slot} holds (request {rid}, position {kpos}, token {tok})", (kind,),
                {"rid": ev.rid, "slot": slot, "position": pos, "found": (tok, kpos, rid),
                 "shift": shift})]
        want = self.draft_digest(ev.rid, n, shift)
        if want is not None and want != digest:
            return [Violation(
                self.name, ev.iteration, f"draft KV of {where} holds tokens that are not the "
                f"request's at positions {shift}..{n + shift - 1}",
                f"token digest {want} of the committed tokens", f"token digest {digest} of the "
                f"draft KV's rows 0..{n - 1}", ("draft-token-digest",),
                {"rid": ev.rid, "read_len": n, "shift": shift})]
        return []

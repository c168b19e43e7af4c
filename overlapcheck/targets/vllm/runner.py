"""The fake model runner: what vLLM's V2 GPU runner would do with a ``SchedulerOutput``,
minus the model, with the golden rule of ``golden.py`` for tokens and drafts.

Like the V2 runner it keeps its own per-request state (known tokens, computed
positions, block table, the drafts it proposed after the request's last batch), fed
only by the scheduler outputs it receives: new requests (resumed ones included) bring
their tokens and blocks, cached ones bring new blocks, finished and preempted ids drop
the state. It runs a batch when the batch is scheduled (batches run in issue order, as
on one GPU stream) and returns a ``ModelRunnerOutput``: empty token lists for partial
prefills, the verified tokens for decodes. It never raises on a scheduler mistake: it
records what it saw in the batch's ``FrameEntry`` and the checkers judge.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .events import FrameEntry
from .golden import Golden


@dataclass
class _Req:
    known: List[int]                 # prompt + tokens sampled so far (the runner's view)
    pos: int                         # positions whose KV is computed and valid
    prefill_len: int                 # tokens known at (re)admission
    table: List[int]                 # block table
    sampled: bool = False            # sampled since (re)admission
    drafts: Optional[Tuple[int, ...]] = None   # proposed after its last batch


class FakeRunner:
    def __init__(self, V, cfg, goldens: Dict[int, Golden]):
        self.V, self.cfg, self.goldens = V, cfg, goldens
        self.reqs: Dict[int, _Req] = {}

    def _sync_state(self, so) -> None:
        for rid in sorted(int(r) for r in so.finished_req_ids | so.preempted_req_ids):
            self.reqs.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            toks = list(nr.prefill_token_ids or nr.prompt_token_ids or ())
            self.reqs[int(nr.req_id)] = _Req(known=toks, pos=nr.num_computed_tokens,
                                             prefill_len=len(toks), table=list(nr.block_ids[0]))
        c = so.scheduled_cached_reqs
        for rid, blocks in zip(c.req_ids, c.new_block_ids):
            st = self.reqs.get(int(rid))
            if st is not None and blocks is not None:
                st.table.extend(blocks[0])

    def execute(self, so) -> Tuple[object, Tuple[FrameEntry, ...]]:
        """Run scheduler output ``so``; return the runner output and the frame entries."""
        self._sync_state(so)
        bs, k = self.cfg.block_size, so.num_spec_tokens_to_schedule
        propose = bool(self.cfg.spec_tokens) and not so.skip_drafts
        req_ids, sampled, entries = [], [], []
        for rid_s, n in so.num_scheduled_tokens.items():
            rid = int(rid_s)
            spec = so.scheduled_spec_decode_tokens.get(rid_s, ())
            s = len(spec)
            st = self.reqs.get(rid)
            req_ids.append(rid_s)
            if st is None:      # scheduled without ever being given to the runner
                sampled.append([])
                entries.append(FrameEntry(rid, -1, n, s, False, "unknown", "none", 0, (), (), -1, -1))
                continue
            g = self.goldens[rid]
            start, m, known = st.pos, n - s, len(st.known)
            samples = start + m == known
            if start + m > known:
                kind = "overrun"
            elif not samples:
                kind = "chunk"
            else:
                kind = "decode" if st.sampled else "prefill"
            if s == 0:
                src, used = "none", ()
            elif start < st.prefill_len:
                src, used = "pad", ()
            elif st.drafts is not None and len(st.drafts) >= s and (
                    spec[0] == -1 or tuple(spec) == st.drafts[:s]):
                src, used = "fresh", st.drafts[:s]
            else:
                src, used = "stale", ()
            blocks = tuple(st.table[p // bs] if p // bs < len(st.table) else -1
                           for p in range(max(start, 0), start + n))
            tokens: Tuple[int, ...] = ()
            if samples:
                tokens = g.verify(known, used)
                st.known.extend(tokens)
                st.pos = start + m + len(tokens) - 1
                st.sampled = True
                st.drafts = g.drafts(len(st.known), k) if propose and k else None
            else:
                st.pos = min(start + m, known)
                st.drafts = None
            entries.append(FrameEntry(rid, start, n, s, samples, kind, src,
                                      max(len(tokens) - 1, 0), tokens, tuple(sorted(set(blocks))),
                                      known, len(st.table)))
            sampled.append(list(tokens))
        out = self.V.ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[])
        return out, tuple(entries)

    def draft_token_ids(self, rids) -> Optional[object]:
        """The drafts proposed after the last batch for ``rids`` (the sync engine hands
        them to the scheduler after processing the batch's output)."""
        ids, drafts = [], []
        for rid in rids:
            st = self.reqs.get(rid)
            if st is not None and st.drafts:
                ids.append(str(rid))
                drafts.append(list(st.drafts))
        if not ids:
            return None
        return self.V.DraftTokenIds(req_ids=ids, draft_token_ids=drafts)

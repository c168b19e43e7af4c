"""The fake model workers: deterministic stand-ins for SGLang's ``TpModelWorker``
(no spec decode) and ``EAGLEWorkerV2`` (spec v2, topk 1), returning what the real ones
return — a ``GenerationBatchResult`` of CPU tensors — from what the real ones read.

The model is the oracle's rule (``fake_models/oracle_rule.py``) on plain integers: a KV slot
holds the token written there; the token at context length ``n`` is a hash of the
tokens read from the request's slots ``req_to_token[row, 0:n]`` mixed with the
request's sampling seed. Reading through SGLang's own request->token table makes the
tokens depend on what SGLang's bookkeeping says: a stale, recycled or mis-indexed slot
changes the output, which parity and the golden checker then see. Each request is
computed on its own, so tokens do not depend on batch-mates, chunking or retraction.

Drafts follow the same rule and agree with the target ``agreement`` percent of the
time, decided by a hash of the context: acceptance is seeded and exact, so the
overlap loop and the normal loop commit the same tokens and accept lengths.

Spec v2 protocol (what ``EAGLEWorkerV2.forward_batch_generation`` does, as the
scheduler sees it): a prefill returns the target's first token as the next draft
input's ``bonus_tokens`` and ``new_seq_lens = seq_lens``; a decode verifies the chain
``[bonus, d1..dk]`` written at positions ``seq_len..seq_len+k`` (slots from SGLang's
table), returns ``next_token_ids`` as ``bs * (k+1)`` target tokens, ``accept_lens``,
``new_seq_lens = seq_lens + accept_lens`` and the new bonus; both call ``on_publish``
with the new lengths before returning, as the real worker does between verify and
draft-extend. One deviation: under overlap the next draft input carries no
``topk_p``/``topk_index`` (the FutureMap relays them with a Triton kernel that has no
CPU build; the fake's drafts do not read them), so only the bonus token is relayed.
"""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from fake_models.oracle_rule import M, draft_at, extend, term, token_at

PAD = -1


class Oracle:
    """The token rule on integers; ``kv`` maps a KV slot to the token stored there."""

    def __init__(self, vocab: int, agreement: int, slots: int):
        self.vocab, self.agreement = vocab, agreement
        self.kv = np.full(slots, PAD, dtype=np.int64)

    def raw(self, slots: np.ndarray) -> int:
        toks = self.kv[slots]
        terms = term(toks, np.arange(len(slots), dtype=np.int64))
        # each term < 2**31: partial sums of up to 2**32 terms stay below 2**63
        return int(terms.sum() % M)

    extend = staticmethod(extend)

    def target(self, raw: int, n: int, seed: int, seeded: bool) -> int:
        """The token at position ``n`` after a context of length ``n`` with hash ``raw``."""
        return token_at(raw, n, seed, seeded, self.vocab)

    def draft(self, raw: int, n: int, seed: int, seeded: bool) -> int:
        """The draft for position ``n`` after that context."""
        return draft_at(raw, n, seed, seeded, self.vocab, self.agreement)


def _req_rng(req):
    """(seed, seeded) of a request. SGLang turns temperature 0 into top_k 1 (greedy)."""
    sp = req.sampling_params
    seed = sp.sampling_seed if sp.sampling_seed is not None else 0
    return int(seed), sp.top_k != 1


class FakeModelWorker:
    """Installed as the scheduler's ``model_worker`` (and the spec worker's target
    step): ``forward_batch_generation(batch, ...)`` like the real one."""

    def __init__(self, scheduler, cfg):
        self.scheduler = scheduler
        self.cfg = cfg
        self.k = cfg.spec_steps
        table = scheduler.req_to_token_pool.req_to_token
        self.table = table
        slots = scheduler.token_to_kv_pool_allocator.size + 2 * cfg.page_size + 1
        self.oracle = Oracle(cfg.vocab, cfg.agreement, slots)
        self.real = scheduler.model_worker
        self.forwards = 0

    def install(self) -> None:
        sch = self.scheduler
        if self.k:
            self.real.fake = self          # FakeSpecWorker delegates its forward to us
        else:
            import dataclasses
            sch.model_worker = self
            sch.batch_result_processor = dataclasses.replace(
                sch.batch_result_processor, model_worker=self)

    def reset(self, cfg) -> None:
        """A new session: an empty KV, and its config's acceptance rate (a build is
        shared by every config with its build key, which the rate is not part of)."""
        self.cfg = cfg
        self.oracle.agreement = cfg.agreement
        self.oracle.kv.fill(PAD)
        self.forwards = 0

    # -- what the scheduler calls on its model worker ------------------------------------
    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0):
        pass

    @property
    def last_shared_read_runner(self):
        return self.real.last_shared_read_runner

    def __getattr__(self, name):
        # anything else (hooks the scheduler probes with getattr) is the real worker's
        return getattr(self.__dict__["real"], name)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                 pp_proxy_tensors=None, **kwargs):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        self.forwards += 1
        mode = batch.forward_mode
        if mode.is_idle():
            raise RuntimeError("the fake worker got an idle batch (no DP attention here)")
        if mode.is_extend():
            tokens = self._prefill(batch)
            result = GenerationBatchResult(
                logits_output=LogitsProcessorOutput(next_token_logits=None),
                next_token_ids=torch.tensor(tokens, dtype=torch.int64))
            if self.k:
                result.new_seq_lens = batch.seq_lens
                result.next_draft_input = self._draft_input(batch, result.next_token_ids)
                if on_publish is not None:
                    on_publish(result.new_seq_lens)
            return result
        if not mode.is_decode():
            raise RuntimeError(f"the fake worker does not run forward mode {mode!r}")
        if not self.k:
            tokens = self._decode(batch)
            return GenerationBatchResult(
                logits_output=LogitsProcessorOutput(next_token_logits=None),
                next_token_ids=torch.tensor(tokens, dtype=torch.int64))
        return self._verify(batch, on_publish)

    # -- the three forwards ------------------------------------------------------------------
    def _rows(self, batch) -> List[int]:
        return [int(x) for x in batch.req_pool_indices.tolist()]

    def _prefill(self, batch) -> List[int]:
        ids = batch.input_ids.tolist()
        locs = batch.out_cache_loc.tolist()
        seq_lens = batch.seq_lens.tolist()
        rows = self._rows(batch)
        out, off = [], 0
        for i, req in enumerate(batch.reqs):
            n_ext = batch.extend_lens[i]
            self.oracle.kv[locs[off:off + n_ext]] = ids[off:off + n_ext]
            off += n_ext
            n = int(seq_lens[i])
            raw = self.oracle.raw(self.table[rows[i], :n].numpy())
            seed, seeded = _req_rng(req)
            out.append(self.oracle.target(raw, n, seed, seeded))
        return out

    def _decode(self, batch) -> List[int]:
        ids = batch.input_ids.tolist()
        locs = batch.out_cache_loc.tolist()
        seq_lens = batch.seq_lens.tolist()
        rows = self._rows(batch)
        self.oracle.kv[locs] = ids
        out = []
        for i, req in enumerate(batch.reqs):
            n = int(seq_lens[i])
            raw = self.oracle.raw(self.table[rows[i], :n].numpy())
            seed, seeded = _req_rng(req)
            out.append(self.oracle.target(raw, n, seed, seeded))
        return out

    def _draft_input(self, batch, bonus: torch.Tensor):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        bs = bonus.shape[0]
        relayed = self.scheduler.enable_overlap
        return EagleDraftInput(
            topk_p=None if relayed else torch.ones((bs, 1), dtype=torch.float32),
            topk_index=None if relayed else bonus.view(bs, 1).clone(),
            hidden_states=None, bonus_tokens=bonus.to(torch.int64),
            num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
            capture_hidden_mode=CaptureHiddenMode.NULL)

    def _verify(self, batch, on_publish):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        k, o = self.k, self.oracle
        seq_lens = [int(x) for x in batch.seq_lens.tolist()]
        roots = [int(x) for x in batch.spec_info.bonus_tokens.tolist()]
        rows = self._rows(batch)
        predict, accept, index = [], [], []
        for i, req in enumerate(batch.reqs):
            n, row = seq_lens[i], rows[i]
            seed, seeded = _req_rng(req)
            slots = self.table[row, :n + k + 1].numpy()
            raw = o.raw(slots[:n])
            chain = [roots[i]]
            raws = []
            for j in range(k + 1):           # the draft chain, as the draft model writes it
                raw = o.extend(raw, chain[j], n + j)
                raws.append(raw)
                if j < k:
                    chain.append(o.draft(raw, n + j + 1, seed, seeded))
            o.kv[slots[n:n + k + 1]] = chain  # verify writes the chain's KV
            targets = [o.target(raws[j], n + j + 1, seed, seeded) for j in range(k + 1)]
            a = 1
            while a <= k and chain[a] == targets[a - 1]:
                a += 1
            predict.extend(targets)
            accept.append(a)
            index.append([i * (k + 1) + j if j < a else -1 for j in range(k + 1)])
        accept_lens = torch.tensor(accept, dtype=torch.int32)
        new_seq_lens = batch.seq_lens + accept_lens.to(batch.seq_lens.dtype)
        bonus = torch.tensor([predict[i * (k + 1) + accept[i] - 1] for i in range(len(accept))],
                             dtype=torch.int64)
        if on_publish is not None:
            on_publish(new_seq_lens)
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=torch.tensor(predict, dtype=torch.int64),
            speculative_num_draft_tokens=k + 1, accept_lens=accept_lens,
            accept_index=torch.tensor(index, dtype=torch.int64), new_seq_lens=new_seq_lens,
            next_draft_input=self._draft_input(batch, bonus))


def _spec_worker_class():
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

    class FakeSpecWorker(BaseSpecWorker):
        """Stands where SGLang builds ``EAGLEWorkerV2``: no draft model, no draft KV;
        its forward is the fake model's (``FakeModelWorker`` sets ``fake``)."""

        def __init__(self, server_args, gpu_id, nccl_port, target_worker):
            super().__init__()
            self._target_worker = target_worker
            self._draft_worker = None
            self.fake = None

        def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                     pp_proxy_tensors=None, **kwargs):
            return self.fake.forward_batch_generation(batch, on_publish=on_publish)

        def clear_cache_pool(self):
            pass

    return FakeSpecWorker


def __getattr__(name):
    if name == "FakeSpecWorker":      # built on first use: it subclasses SGLang's base
        cls = _spec_worker_class()
        globals()["FakeSpecWorker"] = cls
        return cls
    raise AttributeError(name)

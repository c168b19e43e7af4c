"""kv-canary over the KV a draft kind keeps (``Canary.draft``, ``canary.draft_canary``):
EAGLE's rows (position p holds the token at p + 1) and a standalone draft's are held to
their (request, position) tags and the request's tokens, as the target KV is; a wrong
tag on a committed EAGLE row, which no head reads, is a finding, and a correct run is
quiet."""
import dataclasses

import numpy as np
import pytest
import torch

from invariants.kv_canary import KVCanary
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import RequestSpec, generate
from overlapcheck.engine import canary as C
from overlapcheck.protocol import canary as L
from overlapcheck.protocol.digest import token_digest
from overlapcheck.protocol import events as E
from overlapcheck.engine.kernels import N, RID, ROW, START
from overlapcheck.run import Case, ScheduleSpec, execute

PROMPT = (3, 4, 5, 6)
CFG = EngineConfig(page_size=2, pool_tokens=96, row_width=32, max_running=4, chunk_size=8,
                   spec_steps=3, draft_kind="eagle")


def _checker():
    c = KVCanary()
    c.feed(E.Arrived(0, -1, 7, RequestSpec(7, 0, PROMPT, 8)))
    c.feed(E.Prefilled(1, 0, 7, 9, False))        # tokens: 3 4 5 6 9
    return c


def _draft_digest(toks, n, shift):
    return token_digest(list(toks[shift:shift + n]))


def _event(draft):
    toks = PROMPT + (9,)
    return E.Canary(2, 1, 7, 4, 0, -1, -1, (0, 0, 7), token_digest(toks[:4]), (), draft)


def test_a_good_draft_record_is_quiet():
    toks = PROMPT + (9,)
    for shift in (0, 1):
        d = (4, 0, -1, -1, 0, 0, 7, _draft_digest(toks, 4, shift), shift)
        assert _checker().feed(_event(d)) == []


def test_a_wrong_position_tag_on_a_draft_row_is_reported():
    toks = PROMPT + (9,)
    d = (4, 2, 13, 2, 6, 3, 7, _draft_digest(toks, 4, 1), 1)
    (v,) = _checker().feed(_event(d))
    assert v.site == ("draft-stale-own-slot",) and "draft KV" in v.message
    assert "slot 13 at position 2" in v.message and "position 3" in v.seen
    assert "token 6" in v.expected          # the pair at 2 holds the token at 3


def test_a_foreign_draft_row_and_a_wrong_token_are_reported():
    toks = PROMPT + (9,)
    d = (4, 1, 13, 0, 4, 0, 8, _draft_digest(toks, 4, 1), 1)
    assert [v.site for v in _checker().feed(_event(d))] == [("draft-foreign-slot",)]
    d = (4, 0, -1, -1, 0, 0, 7, _draft_digest(toks, 4, 0), 1)    # unshifted tokens
    assert [v.site for v in _checker().feed(_event(d))] == [("draft-token-digest",)]
    d = (-5, 0, -1, -1, 0, 0, 7, 0, 1)
    assert [v.site for v in _checker().feed(_event(d))] == [("draft-garbled-record",)]


def test_the_batched_run_reports_what_the_events_do():
    toks = PROMPT + (9,)
    rec = [0] * L.CANARY
    rec[L.C_LEN], rec[L.C_SLOT], rec[L.C_POS], rec[L.C_RID] = 4, -1, -1, 7
    rec[L.C_DIGEST] = token_digest(toks[:4])
    rec[L.DK_LEN:L.DK_SHIFT + 1] = [4, 2, 13, 2, 6, 3, 7, _draft_digest(toks, 4, 1), 1]
    ev = E.VerifiedBatch(2, 1, (7,), (0,), (1,), ((10,),), (False,), (tuple(rec),), False, True)
    one, two = _checker(), _checker()
    got = [(p, v.to_json()) for p, v in one.on_VerifiedBatch(ev)]
    from invariants.base import Checker
    want = [(p, v.to_json()) for p, v in Checker.on_VerifiedBatch(two, ev)]
    assert got == want and [v["site"] for _, v in got] == [["draft-stale-own-slot"]]


@pytest.mark.parametrize("prefill", [False, True])
def test_the_draft_canary_on_numpy_is_the_kernel_on_torch(prefill):
    rng = np.random.default_rng(3)
    for _ in range(40):
        b, width, pool = 2, 8, 24
        table = rng.permutation(pool)[:3 * width].reshape(3, width) % pool
        kv = np.stack([rng.integers(0, 5, pool), rng.integers(0, width, pool),
                       rng.integers(0, 3, pool), rng.integers(0, 9, pool)], 1)
        meta = np.zeros((b + 1, 16), dtype=np.int64)
        meta[:, ROW] = rng.integers(0, 3, b + 1)
        meta[:, RID] = rng.integers(0, 3, b + 1)
        meta[:, START], meta[:, N] = rng.integers(0, 4, b + 1), rng.integers(1, 4, b + 1)
        lens = rng.integers(0, width, b + 1)
        shift = int(rng.integers(0, 2))
        want = np.full((b + 1, L.CANARY), 7, dtype=np.int64)
        got = want.copy()
        t = [torch.from_numpy(a) for a in (kv, table, meta, lens, want)]
        C.canary_with_draft(t[0], t[1], t[2], t[3], t[4], (0, 1, 2), b, prefill, None,
                            t[0], (0, 1, 2), shift)
        C.canary_with_draft(kv, table, meta, lens, got, (0, 1, 2), b, prefill, None,
                            kv, (0, 1, 2), shift)
        assert (got == want).all(), (got, want)


def test_fault_eagle_kv_tag_wrong_is_found_by_the_draft_canary_only():
    wl = generate(1, 6, CFG, max_prompt=10, max_new=16)
    case = Case(CFG, wl, ScheduleSpec("random", 1), faults=("eagle-kv-tag-wrong",))
    out = execute(case)
    assert {f.checker for f in out.findings} == {"kv-canary"}
    assert "draft KV" in out.findings[0].text
    from invariants.base import names_for
    others = tuple(n for n in names_for("reference") if n != "kv-canary")
    assert execute(dataclasses.replace(case, checks=others)).findings == []


@pytest.mark.parametrize("kind", ["standalone", "eagle"])
@pytest.mark.parametrize("over", [
    {}, {"zero_bubble": True}, {"prefix_cache": True}, {"future_map": "ring"},
    {"pool_tokens": 40}, {"topk": 2, "row_width": 40, "pool_tokens": 128},
    {"chunk_size": 2}, {"tp": 2}])
def test_clean_engine_draft_canary_is_quiet(kind, over):
    cfg = dataclasses.replace(CFG, draft_kind=kind, **over)
    for seed in range(2):
        wl = generate(seed, 6, cfg, max_prompt=10, max_new=16)
        out = execute(Case(cfg, wl, ScheduleSpec("random", seed)))
        assert not out.findings, out.findings[0].text

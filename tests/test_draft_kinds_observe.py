"""The three draft kinds are observably different, seen through the sim runtime's
exact access records (``access="infer"``: the rows each launch really touched) and by
corrupting memory between steps:

* EAGLE: each decode step's first draft launch reads the FutureMap rows (first draft
  token, hidden state) of its request, last written by the previous step's
  draft-extend (or the prefill); corrupting that row changes the next accept length;
* MTP: its draft launches read exactly the target KV slots of the committed positions
  of the batch's requests (plus the padding slot), and it owns no KV of its own;
* standalone: its drafts read neither the target KV nor a hidden-state FutureMap.
"""
import dataclasses
import re

import pytest

from fake_models import make_model
from overlapcheck import seeds
from overlapcheck.device.sched import make_strategy
from overlapcheck.device.sim import SimRuntime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import RequestSpec, Workload
from overlapcheck.protocol import events as E

WL = Workload((RequestSpec(0, 0, (5, 9, 2, 7, 1, 3), 24),
               RequestSpec(1, 0, (8, 8, 4, 6, 2, 9, 11, 30, 12), 24)))


pytestmark = pytest.mark.usefixtures("one_thread")


class Recording(SimRuntime):
    """A sim runtime that also logs, per retired launch, the exact rows it touched;
    ``probe()`` (set by the test) adds host context to each entry."""

    def __init__(self):
        super().__init__(make_strategy("eager", seeds.stream(0, "schedule")), access="infer")
        self.log, self.probe = [], (lambda: None)

    def _feed(self, ctx, clock, op, acc, declared):
        if acc is not None:
            ctxinfo = self.probe()
            for buf, r, w in acc.exact.values():
                self.log.append((op.name, buf.name, r, w, ctxinfo))
        super()._feed(ctx, clock, op, acc, declared)


def _run(kind, model="oracle", observer=None, overlap=False):
    cfg = EngineConfig(pool_tokens=256, row_width=64, draft_kind=kind, model=model,
                       overlap=overlap)
    rt = Recording()
    eng = Engine(cfg, rt, make_model(model), observer)
    return eng, rt


@pytest.mark.parametrize("model", ["oracle", "tiny"])
def test_eagle_step_resolves_the_futuremap_row_the_previous_step_stashed(model):
    eng, rt = _run("eagle", model)
    res = eng.run(WL)
    last_writer, resolved = {}, 0
    for name, buf, r, w, _ in rt.log:
        if buf not in ("future_hidden", "future_draft_token"):
            continue
        if r and name != "eagle_prefill":      # the prefill rewrites rows in place (masked)
            assert name == "draft1", f"{name} reads {buf}"
            for row in r:
                assert last_writer[(buf, row)] in ("draft_extend", "eagle_prefill"), (buf, row)
            resolved += 1
        for row in w or ():
            last_writer[(buf, row)] = name
    verifies = sum(len(r.accept_lens) for r in res.requests.values())
    assert resolved >= 2 * 6 and verifies >= 6


def test_corrupting_the_stashed_draft_token_changes_the_next_accept_length():
    ref = _run("eagle")[0].run(WL)
    a = ref.requests[0].accept_lens
    i = next(i for i in range(1, len(a)) if a[i] > 1)   # a verify whose first draft was right
    verified = {"n": 0}

    def corrupt(ev):
        if isinstance(ev, E.Verified) and ev.rid == 0 and not ev.dropped:
            verified["n"] += 1
            if verified["n"] == i:          # after verify i-1 was processed: stash of verify i-1
                fm = eng.worker.drafter.fm_draft.t
                row = eng.requests[0].row
                fm[row] = (fm[row] + 1) % 64

    eng, _ = _run("eagle", observer=corrupt)
    got = eng.run(WL)
    assert got.requests[0].tokens == ref.requests[0].tokens           # still lossless
    assert got.requests[0].accept_lens[i] == 1 != a[i]
    assert got.requests[0].accept_lens[:i] == a[:i]


@pytest.mark.parametrize("model,overlap", [("oracle", False), ("oracle", True), ("tiny", True)])
def test_mtp_reads_the_target_kv_slots_of_its_requests(model, overlap):
    holder = {}

    def probe():
        """Device-exact committed slots of the requests of the batch being drafted."""
        eng = holder["eng"]
        dev_lens = eng.dev.lens.t
        out = set()
        for i, rid in enumerate(holder.get("batch", ())):
            r = eng.requests[rid]
            n = max(0, min(int(dev_lens[i]), eng.cfg.row_width))
            table = eng.dev.table.t[r.row] if r.row is not None else None
            if table is not None:
                out |= {int(s) for s in table[:n]}
        return frozenset(out)

    def observe(ev):
        if isinstance(ev, E.Scheduled):
            holder["batch"] = ev.rids

    eng, rt = _run("mtp", model, observe, overlap)
    holder["eng"] = eng
    rt.probe = probe
    eng.run(WL)
    drafts = [(r, expect) for name, buf, r, w, expect in rt.log
              if name.startswith("draft") and buf == "target_kv"]
    assert drafts, "the MTP draft never read the target KV"
    for rows, expect in drafts:
        assert set(rows) - {0} == set(expect) - {0}
    assert [b.name for b in eng.dev.kv_buffers] == ["target_kv"]   # no draft KV at all
    ledger_purposes = {p for _, _, p, _ in eng.snapshot().ledger}
    assert ledger_purposes <= {"prefill", "verify"}


def test_mtp_decode_reserve_is_labelled_verify_in_the_ledger():
    seen = set()
    eng, _ = _run("mtp", observer=lambda ev: isinstance(ev, E.Allocated) and seen.add(ev.purpose))
    eng.run(WL)
    assert seen == {"prefill", "verify"}


def test_standalone_and_eagle_drafts_do_not_read_the_target_kv():
    for kind in ("standalone", "eagle"):
        _, rt = (lambda e: (e[0].run(WL), e[1]))(_run(kind))
        bufs = {buf for name, buf, r, w, _ in rt.log if re.fullmatch(r"draft\d+", name) and r}
        assert "target_kv" not in bufs, kind
        assert ("future_hidden" in bufs) == (kind == "eagle")


def test_the_kinds_draft_differently():
    accepts = {kind: _run(kind)[0].run(WL).requests[1].accept_lens for kind in
               tuple(DRAFT_KINDS)}
    toks = {kind: _run(kind)[0].run(WL).requests[1].tokens for kind in accepts}
    assert len(set(toks.values())) == 1
    assert len(set(accepts.values())) == 3, accepts


def test_no_spec_has_no_drafter():
    cfg = dataclasses.replace(EngineConfig(draft_kind="mtp"), spec=False)
    eng = Engine(cfg, Recording(), make_model("oracle"))
    assert eng.worker.drafter is None

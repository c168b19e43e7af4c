"""Tree drafts (``EngineConfig(topk=N)``, N > 1; docs/design.md §4.12): the draft keeps its
top-k candidates at each depth, the verify runs the tree under a tree mask, accepts the
longest path that matches the target, moves the path's KV to contiguous positions and
releases the pages past the chain's reach. The clean engine on it runs every mode with
every checker quiet (parity, golden and accept-oracle, kv-accounting, kv-canary, no
leaks), equals its own non-overlap and no-spec runs, and accepts at least what a chain
accepts; the fuzzer draws it; configs it does not run with are one-line errors."""
import dataclasses

import numpy as np

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from fake_models import make_model
from fake_models.golden_oracle import OracleRequest
from overlapcheck.engine import EngineConfig
from overlapcheck.engine import kernels as K
from overlapcheck.fuzz.strategies import cases
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import ENGINE_MODES, assert_parity, run_clean

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = dict(page_size=2, pool_tokens=320, row_width=56, max_running=3, chunk_size=5,
            spec_steps=3)
LAG = ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),))
# every mode but zero bubble, which tree drafts do not run with (a config error below)
MODES = {m: kw for m, kw in ENGINE_MODES.items() if not kw.get("zero_bubble")}


def _reference(cfg):
    """The same engine without overlap, spec or the variants: what every mode must equal."""
    return dataclasses.replace(cfg, overlap=False, spec=False, kv_backup=False,
                               verify_sync=False)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("topk", [2, 3])
@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_tree_drafts_run_clean_in_every_mode_and_equal_no_spec(kind, topk, mode):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "topk": topk, **MODES[mode]})
    for seed in range(2):
        wl = generate(seed, 6, cfg, max_prompt=14, max_new=24)
        ref = execute(Case(_reference(cfg), wl, ScheduleSpec("random", seed))).result
        serial = execute(Case(dataclasses.replace(cfg, overlap=False), wl,
                              ScheduleSpec("random", seed)))
        for sched in (LAG, ScheduleSpec("random", seed)):
            out = execute(Case(cfg, wl, sched))
            assert out.status == "completed" and not out.findings, out.findings[0].text
            assert_parity(ref, out.result, f"{kind}/top-{topk}/{mode} seed {seed}",
                          accept=False)
            assert_parity(serial.result, out.result, f"{kind}/top-{topk}/{mode} overlap",
                          accept=cfg.spec)


@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_tree_drafts_on_the_tiny_model(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "topk": 2, "model": "tiny"})
    wl = generate(3, 4, cfg, max_prompt=10, max_new=14)
    ref = execute(Case(_reference(cfg), wl, ScheduleSpec("random", 3))).result
    out = execute(Case(cfg, wl, ScheduleSpec("random", 3)))
    assert out.status == "completed" and not out.findings, out.findings[0].text
    assert_parity(ref, out.result, f"tiny {kind}", accept=False)
    assert any(a > 1 for r in out.result.requests.values() for a in r.accept_lens)


@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_rejected_branches_are_released_and_the_pool_comes_back_full(kind):
    """The pages past the chain's reach leave the request after each verify (``Freed``
    with reason ``tree``), pending while a batch it rides may write there; the pool is
    full and consistent at idle, no race, no undeclared sync."""
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "topk": 3, "page_size": 1})
    freed = []

    def observe(ev):
        if isinstance(ev, E.Freed) and ev.reason == "tree":
            freed.append(ev)

    wl = generate(5, 6, cfg, max_prompt=12, max_new=24)
    for strategy in ("random", "pct"):
        freed.clear()
        run_clean(cfg, wl, 5, strategy, observer=observe)
        assert freed and any(ev.pending for ev in freed)


def test_a_tree_accepts_at_least_what_its_chain_accepts():
    """The rank-0 candidates are the chain's drafts, so at every committed length the
    tree's golden accept length is at least the chain's, and above it somewhere."""
    model = make_model("oracle")
    for kind in ("standalone", "eagle"):
        r = OracleRequest(model, (5, 9, 2), 7, False)
        r.extend(80)
        chain = [r.accept_len(kind, 3, L) for L in range(3, 70)]
        tree = [r.accept_len(kind, 3, L, 3) for L in range(3, 70)]
        assert all(t >= c for t, c in zip(tree, chain))
        assert sum(tree) > sum(chain)
        assert [r.accept_len(kind, 3, L, 1) for L in range(3, 70)] == chain


def test_the_accept_oracle_sees_a_tree_accepted_as_a_chain(monkeypatch):
    """Planted: the accept kernel ignores every candidate but rank 0 (a chain's
    acceptance). The committed tokens stay the target's (golden and parity are quiet);
    the accept lengths fall short of the golden tree's and accept-oracle reports it."""
    real = K.tree_accept

    def chain_only(drafts, tgt, out_tok, out_acc, path, chain, k, topk, b):
        d = drafts.clone()
        for depth in range(1, k + 1):
            for rank in range(1, topk):
                d[:b, K.tree_node(depth, rank, topk)] = -1
        real(d, tgt, out_tok, out_acc, path, chain, k, topk, b)
        chain[:b] = drafts[:b].gather(1, path[:b])

    monkeypatch.setattr(K, "tree_accept", chain_only)
    cfg = EngineConfig(**BASE, topk=3)
    out = execute(Case(cfg, generate(1, 6, cfg, max_prompt=12, max_new=24),
                       ScheduleSpec("random", 1)))
    assert {f.checker for f in out.findings} == {"accept-oracle"}, \
        [f.text for f in out.findings]


@pytest.mark.parametrize("like", [torch.zeros(1, dtype=torch.int64), np.zeros(1, np.int64)])
def test_tree_shape_and_paths(like):
    """One source: the same tree in torch (a GPU) and numpy (the sim)."""
    parent, depth = K.tree_shape(3, 2, like)
    assert type(parent) is type(like) and type(depth) is type(like)
    assert parent.tolist() == [-1, 0, 0, 1, 1, 3, 3]
    assert depth.tolist() == [0, 1, 1, 2, 2, 3, 3]
    path = K.tree_paths(parent, depth, 3)
    assert path[6].tolist() == [0, 1, 3, 6]
    assert path[2].tolist() == [0, 2, 2, 2]


def test_tree_accept_walks_the_parent_array():
    """Greedy tree acceptance: a rank-1 match at depth 1 is a leaf; rank-0 matches go
    on; the bonus is the target's token after the last accepted node."""
    k, topk = 3, 2
    #              root  d1r0 d1r1 d2r0 d2r1 d3r0 d3r1
    drafts = torch.tensor([[10, 11, 12, 13, 14, 15, 16],
                           [10, 11, 12, 13, 14, 15, 16],
                           [10, 11, 12, 13, 14, 15, 16]])
    tgt = torch.tensor([[12, 0, 0, 0, 0, 0, 0],       # depth 1: rank 1 -> leaf
                        [11, 14, 0, 0, 9, 0, 0],      # rank 0, then rank 1 at depth 2
                        [11, 13, 0, 15, 0, 8, 0]])    # the whole rank-0 path + bonus 8
    out_tok, out_acc = torch.zeros(3, k + 1, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    path, chain = torch.zeros(3, k + 1, dtype=torch.int64), torch.zeros(3, k + 1, dtype=torch.int64)
    K.tree_accept(drafts, tgt, out_tok, out_acc, path, chain, k, topk, 3)
    assert out_acc.tolist() == [2, 3, 4]
    assert path.tolist() == [[0, 2, 2, 2], [0, 1, 4, 4], [0, 1, 3, 5]]
    assert out_tok[2].tolist() == [11, 13, 15, 8] and out_tok[1, :3].tolist() == [11, 14, 9]
    assert chain[1, :3].tolist() == [10, 11, 14]


def test_configs_tree_drafts_do_not_run_with_are_one_line_errors():
    for kw, msg in ((dict(topk=0), "topk must be a positive integer"),
                    (dict(topk=9), "topk must be at most 8"),
                    (dict(topk=2, draft_kind="mtp"), "needs draft_kind standalone or eagle"),
                    (dict(topk=2, zero_bubble=True), "does not run with zero_bubble"),
                    (dict(topk=2, model="trained"), "needs model")):
        with pytest.raises(ValueError, match=msg) as e:
            EngineConfig(**kw)
        assert "\n" not in str(e.value)
    assert EngineConfig().margin == 8 and EngineConfig(topk=3).margin == 4 + 10


def test_run_topk_flag(capsys):
    from overlapcheck.cli import main
    assert main(["run", "--topk", "2", "--draft", "eagle", "--pool-tokens", "256",
                 "--row-width", "64", "--max-running", "3", "--json"]) == 0
    assert main(["run", "--topk", "2", "--draft", "mtp"]) == 2
    assert "needs draft_kind standalone or eagle" in capsys.readouterr().err


def test_the_fuzzer_draws_tree_drafts():
    seen = set()

    @settings(max_examples=60, database=None, derandomize=True, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), deadline=None)
    @given(cases())
    def prop(case):
        cfg = case.config
        seen.add(cfg.topk)
        if cfg.topk > 1:
            assert cfg.draft_kind in ("standalone", "eagle") and not cfg.zero_bubble
            assert cfg.max_context >= 8

    prop()
    assert 1 in seen and seen & {2, 3}


@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_tree_kernels_declare_what_they_touch(kind):
    """Under full access inference (every torch op intercepted) the tree kernels'
    accesses raise no race report: their declarations hold (docs/design.md §3.4)."""
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "topk": 2})
    run_clean(cfg, generate(2, 4, cfg, max_prompt=10, max_new=12), 2, "random", access="infer")


def test_the_kv_canary_sees_an_accepted_path_left_where_the_tree_put_it(monkeypatch):
    """Planted: no move after the verify. The accepted path's KV stays at its tree
    positions, so committed positions hold rejected nodes' KV (another position's), which
    the next forward's canary reads."""
    monkeypatch.setattr(K, "tree_compact", lambda *args: None)
    cfg = EngineConfig(**BASE, topk=3)
    out = execute(Case(cfg, generate(1, 6, cfg, max_prompt=12, max_new=24),
                       ScheduleSpec("random", 1)))
    assert "kv-canary" in {f.checker for f in out.findings}, [f.text for f in out.findings]

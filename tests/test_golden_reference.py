"""The golden reference (``fake_models.golden``): for every model, the continuation and
the accept lengths the engine's own standard run gives; the oracle's integer path is
the oracle run through its API; a hint is never trusted. And the golden and
accept-oracle checkers on synthetic event streams: each conflict named with both facts."""
import pytest

from fake_models import make_model
from fake_models.golden import Golden, shared
from fake_models.golden_oracle import OracleRequest
from fake_models.golden_torch import ModelRequest
from invariants import make_checkers
from overlapcheck.engine import EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import RequestSpec, generate
from overlapcheck.protocol import events as E
from overlapcheck.run import Case, reference_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("model", ["oracle", "oracle-hostlens"])
def test_oracle_integer_path_is_the_model_through_its_api(model):
    m = make_model(model)
    for seeded in (False, True):
        for prompt in ((3,), (1, 2, 3), (5, 9, 11, 40, 2, 7, 63, 0)):
            fast = OracleRequest(m, prompt, 777, seeded)
            slow = ModelRequest(m, 96, prompt, 777, seeded)
            fast.extend(60)
            slow.extend(60)
            assert fast.G == slow.G
            for kind in DRAFT_KINDS:
                starts = list(range(len(prompt), 50))
                assert [fast.accept_len(kind, 8, L) for L in starts] == \
                    slow.accept_lens(kind, 8, starts)


def _starts(prompt_len, accept_lens):
    out, n = [], 1
    for a in accept_lens:
        out.append(prompt_len + n - 1)
        n += a
    return out


@pytest.mark.parametrize("kind", sorted(DRAFT_KINDS))
@pytest.mark.parametrize("model", ["oracle", "tiny", "trained", "random:tiny-qwen3"])
def test_golden_is_the_engines_standard_run(model, kind):
    """Tokens and accept lengths of the engine's standard (non-overlap) run are the
    golden ones: the golden reference and the engine agree on every model and kind."""
    light = model == "oracle"
    cfg = EngineConfig(page_size=4, pool_tokens=256, row_width=64, max_running=4,
                       chunk_size=8, spec_steps=4, draft_kind=kind, model=model)
    wl = generate(7, 6 if light else 2, cfg, max_new=24 if light else 8)
    ref = reference_run(Case(cfg, wl))
    g = Golden(model, cfg.row_width)
    for spec in wl.requests:
        r, P, seeded = ref.requests[spec.rid], len(spec.prompt), spec.sampling == "seeded"
        seq = g.sequence(spec.prompt, spec.seed, seeded, P + len(r.tokens))
        assert seq[P:] == r.tokens
        assert g.accept_lens(spec.prompt, spec.seed, seeded, kind, 4,
                             _starts(P, r.accept_lens)) == list(r.accept_lens)


def test_a_hint_is_never_trusted():
    g, tiny = Golden("tiny", 48), Golden("tiny", 48)
    prompt = (4, 8, 15, 16, 23, 42)
    want = tiny.sequence(prompt, 0, False, 30)
    wrong = list(want)
    wrong[12] = (wrong[12] + 1) % 64
    wrong[20] = -6510615555426900571          # poison: never looked up
    assert g.sequence(prompt, 0, False, 30, hint=tuple(wrong)) == want
    assert g.sequence(prompt, 0, False, 40, hint=want) == tiny.sequence(prompt, 0, False, 40)


def test_shared_keeps_one_golden_per_model_and_width():
    assert shared("oracle", 64) is shared("oracle", 64)
    assert shared("oracle", 64) is not shared("oracle", 72)


# -- the checkers on synthetic streams ----------------------------------------------------
CFG = EngineConfig(row_width=40, spec_steps=3)
SPEC = RequestSpec(0, 0, (1, 2, 3, 4), 12, stop_ids=())


def _feed(name, events):
    (chk,) = make_checkers([name], model_golden=shared(CFG.model, CFG.row_width),
                           engine_config=CFG)
    out = []
    for ev in events:
        out += chk.feed(ev)
    return out + chk.finish()


def _gold(n):
    return shared(CFG.model, CFG.row_width).sequence(SPEC.prompt, 0, False, 4 + n)[4:]


def test_golden_checker_names_the_wrong_token_and_the_result_that_kept_it():
    g = list(_gold(6))
    bad = (g[3] + 1) % 64
    evs = [E.Arrived(0, -1, 0, SPEC), E.Prefilled(1, 0, 0, g[0], False),
           E.Verified(2, 1, 0, 0, 2, (g[1], g[2]), False),
           E.Verified(3, 2, 0, 1, 2, (bad, g[4]), False),
           E.Aborted(4, 2, 0, (g[0], g[1], g[2], bad, g[4]))]
    (v,) = _feed("golden", evs)
    assert v.site == ("token",) and (v.step, v.details["batch"]) == (3, 2)
    assert f"token {g[3]}" in v.expected and f"token {bad}" == v.seen and "output token 3" in v.message
    assert _feed("golden", evs[:3] + [E.Aborted(3, 1, 0, tuple(g[:3]))]) == []


def test_golden_checker_sees_a_request_ending_off_its_continuation():
    g = list(_gold(12))
    early = [E.Arrived(0, -1, 0, SPEC), E.Prefilled(1, 0, 0, g[0], False),
             E.Finished(1, 0, 0, "length", (g[0],))]
    (v,) = _feed("golden", early)
    assert v.site == ("end",) and "'length' after 12 tokens" in v.expected
    stop = RequestSpec(0, 0, SPEC.prompt, 12, stop_ids=(g[1],))
    past = [E.Arrived(0, -1, 0, stop), E.Prefilled(1, 0, 0, g[0], False),
            E.Verified(2, 1, 0, 0, 3, tuple(g[1:4]), False)]
    (v,) = _feed("golden", past)
    assert v.site == ("past-end",) and f"stop token {g[1]}" in v.expected


def test_accept_oracle_names_the_verify_and_both_lengths():
    g = _gold(12)
    want = shared(CFG.model, CFG.row_width).accept_lens(SPEC.prompt, 0, False, "standalone", 3,
                                                        [4])[0]
    evs = [E.Arrived(0, -1, 0, SPEC), E.Prefilled(1, 0, 0, g[0], False),
           E.Verified(2, 1, 0, 0, want % 4 + 1, tuple(g[1:want % 4 + 2]), False)]
    (v,) = _feed("accept-oracle", evs)
    assert v.details["index"] == 0 and v.details["committed"] == 4
    assert f"accept length {want}" in v.expected and f"accept length {want % 4 + 1}" in v.seen
    ok = evs[:2] + [E.Verified(2, 1, 0, 0, want, tuple(g[1:want + 1]), False)]
    assert _feed("accept-oracle", ok) == []
    # a verify whose kept tokens left the continuation is golden's, not judged here
    off = evs[:2] + [E.Verified(2, 1, 0, 0, 1, ((g[1] + 1) % 64,), False)]
    assert _feed("accept-oracle", off) == []


def test_parity_first_the_oracles_judge_what_both_runs_share():
    """With parity's reference in the context, a difference from the reference is
    parity's finding; a wrong token or accept length both runs share is the oracles'."""
    from overlapcheck.protocol.results import RequestResult, RunResult
    g = list(_gold(6))
    bad = (g[2] + 1) % 64
    toks = (g[0], g[1], bad)
    evs = [E.Arrived(0, -1, 0, SPEC), E.Prefilled(1, 0, 0, g[0], False),
           E.Verified(2, 1, 0, 0, 2, (g[1], bad), False), E.Aborted(3, 1, 0, toks)]
    ctx = dict(model_golden=shared(CFG.model, CFG.row_width), engine_config=CFG)

    def feed(name, ref):
        (chk,) = make_checkers([name], reference=RunResult({0: ref}, None), **ctx)
        return [v for ev in evs for v in chk.feed(ev)] + chk.finish()

    same = RequestResult(0, toks, "abort", (2,), 0)            # the reference shares the bug
    other = RequestResult(0, tuple(g[:3]), "abort", (2,), 0)   # the reference does not
    assert [v.site for v in feed("golden", same)] == [("token",)]
    assert feed("golden", other) == []
    want = shared(CFG.model, CFG.row_width).accept_lens(SPEC.prompt, 0, False, "standalone", 3,
                                                        [4])[0]
    got = want % 4 + 1
    evs = evs[:2] + [E.Verified(2, 1, 0, 0, got, tuple(g[1:got + 1]), False)]
    assert len(feed("accept-oracle", RequestResult(0, tuple(g[:got + 1]), "abort", (got,), 0))) == 1
    assert feed("accept-oracle", RequestResult(0, tuple(g[:want + 1]), "abort", (want,), 0)) == []

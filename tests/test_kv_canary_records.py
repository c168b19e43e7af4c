"""kv-canary on records the host read too early: a poison or stale canary record is a
violation of its own (the copy had not landed), never a crash of the checker; and the
canary checkers are idle where no record can come."""
from invariants.kv_canary import KVCanary
from overlapcheck.protocol import RequestSpec
from overlapcheck.protocol import events as E
from overlapcheck.protocol.digest import token_digest

POISON = -6510615555426900571


def _checker():
    c = KVCanary()
    c.feed(E.Arrived(0, -1, 7, RequestSpec(7, 0, (3, 4, 5), 8)))
    return c


def test_a_poison_record_is_reported_not_crashed_on():
    out = _checker().feed(E.Canary(2, 0, 7, POISON, POISON, POISON, POISON,
                                   (POISON, POISON, POISON), POISON))
    assert [v.site for v in out] == [("garbled-record",)]
    assert "not one a forward wrote" in str(out[0]) and str(POISON) in str(out[0])


def test_a_mismatch_past_the_known_tokens_names_the_slot():
    out = _checker().feed(E.Canary(2, 0, 7, 3, 1, 12, 9, (1, 9, 5), 0))
    assert [v.site for v in out] == [("foreign-slot",)] and "slot 12" in str(out[0])


def test_a_good_record_is_quiet():
    c = _checker()
    digest = token_digest([3, 4, 5])
    assert c.feed(E.Canary(2, 0, 7, 3, 0, -1, -1, (0, 0, 7), digest)) == []


def test_the_prefix_digests_are_the_digests_of_every_committed_prefix():
    # the checker keeps one digest per committed length, extended as records read
    # further (prompt, prefill token, verified runs); each equals the digest recomputed
    # from scratch, so a record of any read length is held against the right one, and
    # a record one token off is not
    import random
    rng = random.Random(5)
    prompt = tuple(rng.randrange(0, 1 << 40) for _ in range(9))
    c = KVCanary()
    c.feed(E.Arrived(0, -1, 7, RequestSpec(7, 0, prompt, 64)))
    c.feed(E.Prefilled(1, 0, 7, 11, False))
    c.feed(E.Verified(2, 1, 7, 0, 3, (12, -3, 2**61 + 5), False))
    toks = list(prompt) + [11, 12, -3, 2**61 + 5]
    assert c.tokens[7] == toks
    for n in range(len(toks) + 1):
        assert c.digest(7, n) == token_digest(toks[:n])
        assert c.feed(E.Canary(3, 9, 7, n, 0, -1, -1, (0, 0, 7), token_digest(toks[:n]))) == []
    bad = c.feed(E.Canary(3, 9, 7, 5, 0, -1, -1, (0, 0, 7), token_digest(toks[:4])))
    assert [v.site for v in bad] == [("token-digest",)]


def test_prefix_digests_read_longest_first_agree():
    # a record reading the whole context extends the digests at once; shorter reads
    # afterwards find the same values
    c = KVCanary()
    c.feed(E.Arrived(0, -1, 7, RequestSpec(7, 0, (5, 6, 7, 8), 16)))
    c.feed(E.Verified(2, 1, 7, 0, 2, (9, 10), False))
    toks = [5, 6, 7, 8, 9, 10]
    for n in (6, 3, 0, 5):
        assert c.digest(7, n) == token_digest(toks[:n])


def test_the_canary_checkers_are_idle_exactly_where_no_record_can_come():
    """``kv_tags`` False (a model whose KV has no tags) makes kv-canary and kv-backup
    idle; the reference target says so by model name, and such a model's run indeed
    sends no canary record, while the oracle's does."""
    from fake_models import kv_tagged, make_model
    from invariants import make_checkers
    from overlapcheck import targets
    from overlapcheck.engine import EngineConfig, make_engine
    from overlapcheck.protocol import generate
    from overlapcheck.engine.canary import tag_columns
    from overlapcheck.run import Case, ScheduleSpec, execute
    for tags, idle in ((False, True), (True, False), (None, False)):
        assert [c.idle for c in make_checkers(["kv-canary", "kv-backup"], kv_tags=tags)] == [idle] * 2
    for name in ("oracle", "oracle-hostlens", "tiny"):
        assert kv_tagged(name) == (tag_columns(make_model(name)) is not None)
    assert not kv_tagged("trained") and not kv_tagged("random:tiny-llama")
    for name in ("oracle", "tiny"):
        cfg = EngineConfig(model=name, page_size=4, pool_tokens=256, row_width=64,
                           max_running=4, chunk_size=16, spec_steps=3)
        assert targets.get("reference").checker_context(cfg)["kv_tags"] == kv_tagged(name)
        records = []

        def factory(cfg, rt, model, observer):
            def obs(ev):
                records.extend([ev] if isinstance(ev, E.Canary) else
                               list(getattr(ev, "records", ())))
                observer(ev)
            obs.batched = True
            return make_engine(cfg, rt, model, obs)
        out = execute(Case(cfg, generate(1, 3, cfg, max_new=6), ScheduleSpec("random", 1), ()),
                      engine=factory)
        assert out.status == "completed" and not out.findings
        assert bool(records) == kv_tagged(name)

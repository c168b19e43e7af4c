"""kv-canary on records the host read too early: a poison or stale canary record is a
violation of its own (the copy had not landed), never a crash of the checker."""
from invariants.kv_canary import KVCanary
from overlapcheck.engine import RequestSpec
from overlapcheck.engine import events as E

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
    digest = E.token_digest([3, 4, 5])
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
        assert c.digest(7, n) == E.token_digest(toks[:n])
        assert c.feed(E.Canary(3, 9, 7, n, 0, -1, -1, (0, 0, 7), E.token_digest(toks[:n]))) == []
    bad = c.feed(E.Canary(3, 9, 7, 5, 0, -1, -1, (0, 0, 7), E.token_digest(toks[:4])))
    assert [v.site for v in bad] == [("token-digest",)]


def test_prefix_digests_read_longest_first_agree():
    # a record reading the whole context extends the digests at once; shorter reads
    # afterwards find the same values
    c = KVCanary()
    c.feed(E.Arrived(0, -1, 7, RequestSpec(7, 0, (5, 6, 7, 8), 16)))
    c.feed(E.Verified(2, 1, 7, 0, 2, (9, 10), False))
    toks = [5, 6, 7, 8, 9, 10]
    for n in (6, 3, 0, 5):
        assert c.digest(7, n) == E.token_digest(toks[:n])

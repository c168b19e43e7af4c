"""One token rule for every fake model (``fake_models/oracle_rule.py``): its int and
tensor forms agree, the context hash is the canary's digest, and the reference
engine's golden continuation, the vLLM target's and the SGLang target's give the same
tokens and drafts for the same request."""
import random

import torch

from fake_models import OracleModel
from fake_models import oracle_rule as R
from fake_models.golden_oracle import OracleRequest
from overlapcheck.protocol.digest import token_digest
from overlapcheck.protocol.types import SEEDED, RequestSpec
from overlapcheck.targets.sglang.config import SglangConfig
from overlapcheck.targets.sglang.golden import Golden as SglangGolden
from overlapcheck.targets.vllm.golden import Golden as VllmGolden


def test_int_and_tensor_forms_agree():
    rng = random.Random(5)
    rows = [(rng.randrange(R.M), rng.randrange(2 ** 31), rng.randrange(500), rng.random() < 0.5,
             rng.randrange(2, 100), rng.randrange(101)) for _ in range(400)]
    h, seed, pos, seeded, vocab, agreement = (torch.tensor([r[i] for r in rows])
                                              for i in range(6))
    got = R.sample(h, seed, pos, seeded, 7, torch.where)
    mixed = R.mix(h, seed, pos)
    drafts = R.agreed(got, mixed, h, 7, 60, torch.where)
    for i, (hi, si, pi, di, _, _) in enumerate(rows):
        want = R.sample(hi, si, pi, di, 7)
        assert got[i].item() == want
        assert drafts[i].item() == R.agreed(want, R.mix(hi, si, pi), hi, 7, 60)
        assert R.term(torch.tensor(hi), torch.tensor(pi)).item() == R.term(hi, pi)


def test_the_context_hash_is_the_canary_digest():
    rng = random.Random(2)
    for _ in range(50):
        toks = [rng.randrange(-3, 10 ** 6) for _ in range(rng.randrange(30))]
        assert R.raw_hash(toks) == token_digest(toks)


def test_three_targets_fake_models_give_the_same_continuation():
    """The reference oracle's golden continuation (salt 0), the vLLM fake model's and
    the SGLang fake worker's: the same tokens and chain drafts for one request."""
    vocab, agreement = 48, 70
    model = OracleModel(vocab=vocab, agreement=agreement)
    sglang = SglangGolden(SglangConfig(vocab=vocab, agreement=agreement, spec_steps=3))
    for seed, sampling in ((3, "greedy"), (11, SEEDED)):
        prompt = (5, 9, 2, 40)
        ref = OracleRequest(model, prompt, seed, sampling == SEEDED)
        ref.extend(40)
        vllm = VllmGolden(prompt, seed, sampling == SEEDED, vocab, agreement)
        spec = RequestSpec(0, 0, prompt, 36, seed=seed, sampling=sampling)
        for n in range(len(prompt), 40):
            assert vllm.token(n) == ref.G[n] == sglang.next(spec, ref.G[:n])
        for L in range(len(prompt), 36):
            assert vllm.draft(L + 1) == ref.draft("standalone", L, 1)
            drafts = vllm.drafts(L + 1, 3)
            assert len(vllm.verify(L + 1, drafts)) == ref.accept_len("standalone", 3, L) \
                == sglang.accept_len(spec, ref.G[:L + 1])

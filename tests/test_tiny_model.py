"""The tiny transformer: bitwise batch invariance (alone vs. a batch of 8 with other
prefill chunking), attention that reads the paged KV through the table, seeded
weights, and batch-invariant EAGLE/MTP heads."""
import pytest
import torch

from fake_models import TinyModel
from fake_models import tiny_ops as T

W, SLOTS = 64, 512
POISON = -0x5A5A5A5A5A5A5A5B
LENGTHS = [20, 13, 25, 7, 30, 11, 19, 22]


@pytest.fixture(scope="module")
def model():
    return TinyModel()


def _tokens(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (n,), generator=g)


def _build(m, lengths, chunks, draft=False, perm_seed=0):
    """Write each request's tokens into fresh NaN-poisoned KV, ``chunks[r]`` tokens of
    request r per call (all requests advance together in one call)."""
    width = m.draft_kv_width if draft else m.kv_width
    kv = torch.full((SLOTS, width), float("nan"))
    table = torch.full((len(lengths), W), POISON, dtype=torch.int64)
    perm = torch.randperm(SLOTS - 1, generator=torch.Generator().manual_seed(perm_seed)) + 1
    k = 0
    for r, n in enumerate(lengths):
        table[r, :n] = perm[k:k + n]
        k += n
    done = [0] * len(lengths)
    write = m.write_draft_kv if draft else m.write_kv
    while any(d < n for d, n in zip(done, lengths)):
        rows, pos, toks = [], [], []
        for r, n in enumerate(lengths):
            c = min(chunks[r], n - done[r])
            toks += _tokens(n, 100 + r)[done[r]:done[r] + c].tolist()
            rows += [r] * c
            pos += list(range(done[r], done[r] + c))
            done[r] += c
        t = torch.tensor
        write(kv, table, t(rows), t(pos), t(toks), t(rows))
    return kv, table


def _zeros(n):
    return torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.bool)


def test_logits_alone_equal_logits_in_a_batch_of_8_with_other_chunking(model):
    kv1, t1 = _build(model, LENGTHS[:1], [LENGTHS[0]])
    kv8, t8 = _build(model, LENGTHS, [3, 5, 7, 2, 11, 1, 4, 6], perm_seed=1)
    for ctx in (1, 9, 20):
        alone = model.target_logits(kv1, t1, torch.tensor([0]), torch.tensor([ctx]))
        lens = torch.tensor([ctx] + [min(ctx, n) for n in LENGTHS[1:]])
        batch = model.target_logits(kv8, t8, torch.arange(8), lens)
        assert torch.equal(alone[0], batch[0]), f"context {ctx}"
    # the KV rows themselves are bitwise equal, whatever the chunking
    assert torch.equal(kv1[t1[0, :20]], kv8[t8[0, :20]])


def test_draft_and_heads_are_batch_invariant(model):
    kv1, t1 = _build(model, LENGTHS[:1], [4])
    kv8, t8 = _build(model, LENGTHS, [9, 2, 3, 7, 1, 5, 8, 2], perm_seed=2)
    dkv1, _ = _build(model, LENGTHS[:1], [LENGTHS[0]], draft=True)
    dkv8, _ = _build(model, LENGTHS, [1, 3, 5, 7, 9, 11, 13, 15], draft=True, perm_seed=2)
    s1, f1 = _zeros(1)
    s8, f8 = _zeros(8)
    lens8 = torch.tensor([12] + [min(12, n) for n in LENGTHS[1:]])
    one, eight = torch.tensor([0]), torch.arange(8)
    assert model.draft(dkv1, t1, one, torch.tensor([12]), s1, f1)[0] == \
        model.draft(dkv8, t8, eight, lens8, s8, f8)[0]
    h1 = model.target_hidden(kv1, t1, one, torch.tensor([12]))
    h8 = model.target_hidden(kv8, t8, eight, lens8)
    assert torch.equal(h1[0], h8[0])
    mtp = model.head("mtp")
    toks8 = torch.arange(8) * 5
    g1, d1 = mtp.step(kv1, t1, one, torch.tensor([12]), torch.tensor([12]), toks8[:1], h1, s1, f1)
    g8, d8 = mtp.step(kv8, t8, eight, lens8, lens8, toks8, h8, s8, f8)
    assert torch.equal(g1[0], g8[0]) and d1[0] == d8[0]


def test_attention_reads_the_context_slots_through_the_table(model):
    kv, table = _build(model, LENGTHS[:2], [LENGTHS[0], LENGTHS[1]])
    rows, lens = torch.tensor([0, 1]), torch.tensor([15, 13])
    before = model.target_logits(kv, table, rows, lens)
    kv[table[0, 4], 3:] += 0.5                       # corrupt one context slot of request 0
    after = model.target_logits(kv, table, rows, lens)
    assert not torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    kv[table[0, 17]] = float("nan")                  # beyond the context read: no effect
    assert torch.equal(model.target_logits(kv, table, rows, lens), after)


def test_weights_are_seeded(model):
    assert torch.equal(TinyModel().cpu["embed"], model.cpu["embed"])
    assert not torch.equal(TinyModel(seed=1).cpu["embed"], model.cpu["embed"])


def test_tree_sum_and_exp():
    x = torch.randn(3, 37, 5, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(T.tree_sum(x, 1), x.sum(1), atol=1e-5)
    y = -torch.rand(100, generator=torch.Generator().manual_seed(1)) * 19
    assert torch.allclose(T.poly_exp(y), torch.exp(y), rtol=1e-4)

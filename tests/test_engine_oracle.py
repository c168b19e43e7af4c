"""The oracle model: reads its context from KV through the table, batch invariant,
tunable draft agreement, seeded sampling a pure function of (seed, position, logits)."""
import torch

from fake_models import OracleModel

W, SLOTS = 16, 64


def _setup(n_req=3, length=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.zeros((SLOTS, 3), dtype=torch.int64)
    table = torch.zeros((n_req, W), dtype=torch.int64)
    slots = torch.randperm(SLOTS - 1, generator=g)[:n_req * length] + 1
    for r in range(n_req):
        table[r, :length] = slots[r * length:(r + 1) * length]
        kv[table[r, :length], 0] = torch.randint(0, 64, (length,), generator=g)
    return kv, table


def _target(m, kv, table, rows, lens, seeded=False):
    rows, lens = torch.tensor(rows), torch.tensor(lens)
    seeds = rows * 11 + 3
    return m.target(kv, table, rows, lens, seeds, torch.full_like(rows, seeded, dtype=torch.bool))


def test_batch_invariant():
    m, (kv, table) = OracleModel(), _setup()
    alone = [int(_target(m, kv, table, [r], [7])[0]) for r in range(3)]
    together = _target(m, kv, table, [2, 0, 1, 0], [7, 7, 7, 7]).tolist()
    assert together == [alone[2], alone[0], alone[1], alone[0]]


def test_output_depends_on_the_kv_it_reads():
    m, (kv, table) = OracleModel(vocab=1 << 20), _setup()
    before = _target(m, kv, table, [0, 1], [8, 8]).tolist()
    kv[table[0, 3], 0] += 1                     # corrupt one slot of request 0
    after = _target(m, kv, table, [0, 1], [8, 8]).tolist()
    assert after[0] != before[0] and after[1] == before[1]
    kv[table[1, 9], 0] += 1                     # beyond the context read: no effect
    assert _target(m, kv, table, [1], [8]).tolist() == [before[1]]


def test_draft_agreement_is_tunable():
    kv, table = _setup(n_req=3, length=12)
    rows = torch.tensor([0, 1, 2] * 3)
    lens = torch.tensor([4] * 3 + [6] * 3 + [9] * 3)
    seeds, seeded = rows * 5, torch.zeros(9, dtype=torch.bool)
    for agreement, expect in ((100, 9), (0, 0)):
        m = OracleModel(agreement=agreement)
        same = (m.draft(kv, table, rows, lens, seeds, seeded)
                == m.target(kv, table, rows, lens, seeds, seeded)).sum()
        assert int(same) == expect


def test_seeded_sampling_is_pure_and_differs_from_greedy_sometimes():
    m = OracleModel()
    h = torch.arange(200, dtype=torch.int64) * 7919
    seeds, pos = torch.full((200,), 5), torch.arange(200)
    a = m.sample(h, seeds, pos, torch.ones(200, dtype=torch.bool))
    b = m.sample(h, seeds, pos, torch.ones(200, dtype=torch.bool))
    g = m.sample(h, seeds, pos, torch.zeros(200, dtype=torch.bool))
    assert torch.equal(a, b) and 0 < int((a != g).sum()) < 200

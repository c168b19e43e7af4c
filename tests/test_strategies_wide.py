"""The fuzzer's wide search (docs/design.md §6.2): k up to 8, pages up to 16, pools
from barely fitting one row to roomy, both reserve rules, every combination of the
seed variants — each reachable, each a valid config, and clean under every checker."""
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from overlapcheck.fuzz.strategies import Features, cases, configs
from overlapcheck.run import execute

pytestmark = pytest.mark.usefixtures("one_thread")

WIDE = Features(aborts=False, stops=False, seeded=False, tight_pool=False, overlap=True,
                spec=True, wide=True)
TIGHT = Features(aborts=False, stops=False, seeded=False, tight_pool=True, overlap=True,
                 spec=True, wide=True)
FIND = settings(database=None, max_examples=2000, derandomize=True,
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("what, feat, cond", [
    ("k = 8", WIDE, lambda c: c.spec_steps == 8),
    ("page 16", WIDE, lambda c: c.page_size == 16),
    ("k 8 on page 16", WIDE, lambda c: c.spec_steps == 8 and c.page_size == 16),
    ("16 rows", WIDE, lambda c: c.pool_tokens >= c.page_size + 16 * c.row_width),
    ("barely fits", TIGHT, lambda c: c.pool_tokens == c.page_size + c.row_width),
    ("exact reserve, k 7", WIDE, lambda c: c.draft_reserve == "exact" and c.spec_steps == 7),
    ("all three variants", WIDE, lambda c: c.zero_bubble and c.kv_backup and c.verify_sync),
    ("chunk 1", WIDE, lambda c: c.chunk_size == 1),
])
def test_the_wide_search_reaches(what, feat, cond):
    cfg = find(configs(feat), cond, settings=FIND)
    assert cond(cfg) and cfg.pool_tokens - cfg.page_size >= cfg.row_width, what


def test_wide_examples_are_a_quarter_and_shrink_away():
    from overlapcheck.fuzz.strategies import features
    assert not find(features(), lambda f: True, settings=FIND).wide
    assert find(features(), lambda f: f.wide, settings=FIND).wide


@settings(max_examples=12, derandomize=True, database=None, deadline=None,
          phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
@given(cases())
def test_drawn_cases_run_clean_with_every_checker(case):
    out = execute(case)
    assert not out.findings, [f.text for f in out.findings[:3]]

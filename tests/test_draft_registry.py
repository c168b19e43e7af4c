"""A draft kind is one module and one registry entry: a toy kind written here (its
draft token is the previous token again) becomes a config value, a ``run --draft`` and
``fuzz --draft`` choice and a fuzzer draw without touching anything else, and the
engine runs it clean, with overlap equal to non-overlap."""
import pytest
import torch

from overlapcheck.engine import EngineConfig
from overlapcheck.engine import drafts
from overlapcheck.engine.kernels import gate_mask
from overlapcheck.protocol import generate

pytestmark = pytest.mark.usefixtures("one_thread")


def echo_step(meta, drafts_t, j, b, gate):
    """Draft token j is token j-1 again (entries outside a gated round keep theirs)."""
    keep = gate_mask(meta[:b], gate)
    new = drafts_t[:b, j - 1]
    drafts_t[:b, j] = new if keep is None else torch.where(keep, new, drafts_t[:b, j])


class EchoDraft:
    """The toy kind: no model, no KV; drafts the last token k times."""

    kind = "echo"
    owns_kv = False
    ahead_writes = 0
    kv = None

    def __init__(self, dev, model):
        self.dev = dev

    def launch_prefill(self, st, meta, b):
        return []

    def launch_drafts(self, st, meta, table_r, b, rnd):
        names = []
        for j in range(1, self.dev.cfg.spec_steps + 1):
            self.dev.rt.launch(self.dev.fwd, echo_step, meta.t, rnd.drafts.t, j, b, rnd.gate,
                               name=f"{rnd.prefix}draft{j}", reads=[meta, rnd.drafts],
                               writes=[rnd.drafts])
            names.append(f"{rnd.prefix}draft{j}")
        return names

    def launch_extend(self, st, meta, table_r, b):
        return []


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(drafts.DRAFT_KINDS, "echo", f"{__name__}:EchoDraft")


def test_a_toy_kind_needs_only_its_registry_entry(echo, tmp_path):
    from overlapcheck.cli import main
    from overlapcheck.run import run_checked
    cfg = EngineConfig(draft_kind="echo", pool_tokens=256, row_width=64, max_running=4,
                       chunk_size=16)
    wl = generate(3, 6, cfg, max_new=12)
    run = run_checked(cfg, wl, seed=3)
    assert run.status == "completed" and not run.violations and not run.problems
    ref = run_checked(EngineConfig(**{**cfg.__dict__, "draft_kind": "standalone"}), wl, seed=3)
    assert {r: x.tokens for r, x in run.result.requests.items()} == \
        {r: x.tokens for r, x in ref.result.requests.items()}     # drafts never change tokens
    assert main(["run", "--draft", "echo", "--requests", "3", "--seed", "1"]) == 0
    assert main(["fuzz", "--draft", "echo", "--examples", "3", "--out", str(tmp_path)]) == 0


def test_the_fuzzer_draws_every_registered_kind(echo):
    from hypothesis import given, settings
    from overlapcheck.fuzz.strategies import configs, features
    seen = set()

    @settings(max_examples=150, derandomize=True, database=None)
    @given(features().flatmap(configs))
    def draw(cfg):
        seen.add(cfg.draft_kind)

    draw()
    assert seen == set(drafts.DRAFT_KINDS)


def test_an_unknown_kind_is_one_line():
    with pytest.raises(ValueError, match="draft_kind must be one of standalone, eagle, mtp"):
        EngineConfig(draft_kind="tree")

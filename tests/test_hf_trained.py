"""The trained pair: the training script's CPU smoke run writes directories the loader
reads; the committed pair (``fake_models/weights/trained``) loads, runs the engine
with parity and lossless on the sim, and ``overlapcheck run --model trained`` is
deterministic. Tests of the committed pair skip only when its directory is absent."""
import json
import os
import subprocess
import sys

import pytest

from fake_models import make_model
from fake_models.hf import TRAINED_DIR, from_dir
from overlapcheck.engine.drafts import DRAFT_KINDS

from engine_checks import check_parity_and_lossless

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))
import accept_report  # noqa: E402

HAVE = os.path.isdir(os.path.join(TRAINED_DIR, "target"))
need_weights = pytest.mark.skipif(not HAVE, reason=f"no committed trained pair in {TRAINED_DIR} "
                                  "(python -m fake_models.train_pair --out it on a GPU machine)")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_train_smoke_writes_loadable_pair(tmp_path, capsys):
    from fake_models import train_pair
    rc = train_pair.main(["--out", str(tmp_path), "--device", "cpu", "--steps", "3", "--batch", "4",
                          "--length", "16"])
    assert rc == 0 and "bench/accept_report.py" in capsys.readouterr().out
    rc = accept_report.main([str(tmp_path), "--requests", "2"])
    assert rc in (0, 1)   # a 3-step pair need not pass the acceptance figures
    out = capsys.readouterr().out
    assert '"draft_kind": "standalone"' in out and "acceptance:" in out
    m = from_dir(str(tmp_path))
    assert m.tdec.cfg == train_pair.TARGET and m.ddec.cfg == train_pair.DRAFT
    total = sum(os.path.getsize(tmp_path / p / "model.safetensors") for p in ("target", "draft"))
    assert total <= 20 * 2 ** 20


def test_figures():
    f = accept_report.figures([1, 2, 5, 3, 4, 1], 4)
    assert f["rejections_by_position"] == [2, 1, 1, 1] and f["mean_accept_length"] == 2.6667


def test_trained_missing_dir_is_one_line(tmp_path):
    from fake_models.hf import ModelError, trained
    with pytest.raises(ModelError, match="no weights in"):
        trained(str(tmp_path))


@need_weights
@pytest.mark.parametrize("kind", tuple(DRAFT_KINDS))
def test_trained_parity_and_lossless(kind):
    from overlapcheck.engine import EngineConfig
    from overlapcheck.protocol import generate
    model = make_model("trained")
    for seed in ((0,) if kind == "standalone" else (1,)):
        base = dict(model="trained", draft_kind=kind, spec_steps=4, row_width=64,
                    pool_tokens=(160, 512)[seed], page_size=(1, 4)[seed], max_running=6,
                    chunk_size=16)
        wl = generate(seed, 6, EngineConfig(**base), max_new=24)
        check_parity_and_lossless(base, wl, seed, model, kind)


@need_weights
def test_trained_run_deterministic():
    cmd = [sys.executable, "-m", "overlapcheck", "run", "--model", "trained", "--seed", "7",
           "--requests", "16", "--json"]
    env = dict(os.environ, OMP_NUM_THREADS="1")   # one intra-op thread, as docs/design.md §4.10 asks
    runs = [subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    assert json.loads(runs[0].stdout)["summary"]["verifies"] > 0

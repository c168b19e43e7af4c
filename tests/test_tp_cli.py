"""``overlapcheck run --tp N``: tp=2 gives tp=1's tokens, bad values are one-line
errors (exit 2); ``--dist`` runs real ``torch.distributed`` ranks (gloo on CPU), gives
the same tokens, and reports a rank killed mid-run, or ranks that disagree, as findings
within the timeout instead of hanging."""
import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from overlapcheck.cli import main
from overlapcheck.engine import EngineConfig
from overlapcheck.engine.dist import EXIT_CODE, EXIT_ENV
from overlapcheck.protocol import generate
from overlapcheck.run.dist import run_dist

RUN = [sys.executable, "-m", "overlapcheck", "run", "--seed", "4", "--requests", "6"]


@pytest.mark.parametrize("text", ["0", "x", "-3", "1.5", ""])
def test_bad_tp_is_one_line_exit_2(text, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--tp", text])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "--tp" in err and "positive number of ranks" in err and repr(text) in err


def test_tp2_gives_tp1_tokens(capsys):
    docs = []
    for tp in ("1", "2"):
        assert main(RUN[3:] + ["--tp", tp, "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["requests"] == docs[1]["requests"] and docs[1]["violations"] == []
    assert docs[1]["run"]["config"]["tp"] == 2
    assert main(["run", "--tp", "2", "--device", "cuda", "--requests", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --dist" in err


def _run(args, env=None, timeout=180):
    start = time.monotonic()
    p = subprocess.run(RUN + args, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p, time.monotonic() - start


def test_dist_ranks_give_tp1_tokens():
    p1, _ = _run(["--json"])
    p2, _ = _run(["--tp", "2", "--dist", "--json"])
    assert p1.returncode == 0 and p2.returncode == 0, p2.stdout + p2.stderr
    one, two = json.loads(p1.stdout), json.loads(p2.stdout)
    assert one["requests"] == two["requests"] and two["violations"] == []
    assert [r["status"] for r in two["ranks"]] == ["completed", "completed"]


def test_dist_rank_killed_mid_run_is_a_finding_not_a_hang():
    p, took = _run(["--tp", "2", "--dist", "--dist-timeout", "60"], {EXIT_ENV: "1:4"})
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"rank 1 exited with code {EXIT_CODE}" in p.stdout
    assert "[liveness] step 4: stuck wait: all-gather of step 4's batch decisions" in p.stdout
    assert took < 60


def test_dist_ranks_that_disagree_are_compared_by_rank_agreement():
    cfg = EngineConfig(tp=2, pool_tokens=256, row_width=64, faults=("rank-local-overlap",))
    run = run_dist(cfg, generate(1, 4, cfg), seed=1, timeout=60)
    found = run.reports[0]["violations"]
    assert found and found[0].startswith("[rank-agreement] step 1: rank 1 and rank 0 "
                                         "disagree at step 1 on overlap"), found
    clean = run_dist(dataclasses.replace(cfg, faults=()), generate(1, 4, cfg), seed=1,
                     timeout=60)
    assert clean.reports[0]["violations"] == [] and clean.problems() == []
    assert clean.exitcodes == [0, 0]

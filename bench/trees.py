"""Two revisions of overlapcheck side by side: the same time-boxed campaign (``fuzz
--time T --seed S``, the sim, the oracle model, every checker) run in each, in
alternating order over rounds, one process at a time; prints each revision's checked
engine steps per campaign second (median and range over the rounds) and their ratio.
A refactor that must not cost throughput is measured here against the revision
before it. Asserts nothing.

    python bench/trees.py OLD NEW [--time T] [--rounds R] [--seed S] [--extra ARGS]

OLD and NEW are git revisions of this repository (checked out for the run as detached
worktrees in a temporary folder, removed after). A shared host's speed drifts by tens
of percent within minutes, so each round runs both, the order alternating, and the
ratio is taken per round (NEW over OLD) before its median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def campaign(tree: str, seconds: float, seed: int, extra) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "overlapcheck", "fuzz", "--time", str(seconds),
                          "--seed", str(seed), "--json", *extra],
                         cwd=tree, env=env, capture_output=True, text=True,
                         timeout=seconds * 4 + 120)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{tree}: fuzz exited {out.returncode}: {out.stderr[-400:]}")
    return json.loads(out.stdout)


def rate(summary: dict) -> float:
    """Checked engine steps per second of the campaign's own time."""
    return summary["steps"] / max(summary["seconds"], 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--time", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--extra", default="", help="more fuzz flags, one string")
    args = ap.parse_args()
    extra = args.extra.split()
    with tempfile.TemporaryDirectory(prefix="oc-trees-") as tmp:
        trees = {}
        try:
            for label, rev in (("old", args.old), ("new", args.new)):
                path = os.path.join(tmp, label)
                subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, rev],
                               check=True)
                trees[label] = path
            rates = {"old": [], "new": []}
            for r in range(args.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for label in order:
                    s = campaign(trees[label], args.time, args.seed, extra)
                    rates[label].append(rate(s))
                    print(f"round {r + 1} {label}: {rates[label][-1]:8.1f} steps/s "
                          f"({s['steps']} steps, {s['examples']} examples)", flush=True)
        finally:
            for path in trees.values():
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path],
                               check=False)
    ratios = [n / o for n, o in zip(rates["new"], rates["old"])]
    for label, rev in (("old", args.old), ("new", args.new)):
        v = rates[label]
        print(f"{label} {rev}: median {statistics.median(v):8.1f} steps/s "
              f"(range {min(v):.1f}-{max(v):.1f})")
    print(f"ratio new/old per round: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()

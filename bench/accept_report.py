"""Accept figures of a model pair through the engine: the mean accept length and the
rejections per draft position (a verify that commits ``a <= k`` tokens rejected the
draft token at position ``a``), per draft kind.

    python bench/accept_report.py fake_models/weights/trained [--requests 24] [--k 4]

Exit status 0 when the standalone draft's mean accept length is strictly between 1.5
and k with rejections at every draft position (the pair is worth fuzzing with), 1
otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, Iterable


def figures(accept_lens: Iterable[int], k: int) -> Dict[str, object]:
    """Mean accept length, rejections per draft position 1..k, verifies."""
    accs = list(accept_lens)
    rej = [0] * k
    for a in accs:
        if a <= k:
            rej[a - 1] += 1
    return {"verifies": len(accs), "mean_accept_length": round(sum(accs) / max(1, len(accs)), 4),
            "rejections_by_position": rej}


def measure(model_name: str, k: int = 4, n: int = 24, seed: int = 7, kind: str = "standalone",
            model=None) -> Dict[str, object]:
    """Run ``n`` generated requests (seed ``seed``) on the sim, non-overlap, and return
    ``figures`` of every verify."""
    import torch

    from overlapcheck.engine import EngineConfig
    from overlapcheck.protocol import generate
    from overlapcheck.run import run_workload
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = EngineConfig(model=model_name, spec_steps=k, row_width=128, pool_tokens=2048,
                           max_running=8, chunk_size=64, draft_kind=kind, overlap=False)
        res = run_workload(cfg, generate(seed, n, cfg, max_new=64), seed=seed, strategy="eager",
                           detect=False, model=model)
    finally:
        torch.set_num_threads(threads)
    return figures((a for r in res.requests.values() for a in r.accept_lens), k)


def report(path: str, k: int = 4, n: int = 24) -> int:
    """Print the figures of the pair in ``path`` per draft kind; exit status 0 when the
    standalone draft's mean accept length is strictly between 1.5 and ``k`` with
    rejections at every draft position."""
    from fake_models.hf import from_dir
    model = from_dir(path, "trained")
    ok = True
    from overlapcheck.engine.drafts import DRAFT_KINDS
    for kind in DRAFT_KINDS:
        f = measure(f"hf:{path}", k, n, kind=kind, model=model)
        print(json.dumps({"draft_kind": kind, "k": k, **f}))
        if kind == "standalone":
            ok = 1.5 < f["mean_accept_length"] < k and all(f["rejections_by_position"])
    print("acceptance: " + ("PASS" if ok else "FAIL") + f" (standalone: 1.5 < mean < {k}, "
          "rejections at every position)")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="a model pair directory (target/ and draft/)")
    ap.add_argument("--requests", type=int, default=24, help="requests of the run (default 24)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per verify (default 4)")
    args = ap.parse_args(argv)
    from fake_models.hf import ModelError
    try:
        return report(args.dir, k=args.k, n=args.requests)
    except ModelError as e:
        print(f"accept_report: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

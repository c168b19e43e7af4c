"""Accept figures of a model pair through the engine: the mean accept length and the
rejections per draft position (a verify that commits ``a <= k`` tokens rejected the
draft token at position ``a``). ``python -m fake_models.train_pair --report DIR``."""
from __future__ import annotations

import json
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

    from overlapcheck.engine import EngineConfig, generate, run_workload
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
    from .hf import from_dir
    model = from_dir(path, "trained")
    ok = True
    for kind in ("standalone", "eagle", "mtp"):
        f = measure(f"hf:{path}", k, n, kind=kind, model=model)
        print(json.dumps({"draft_kind": kind, "k": k, **f}))
        if kind == "standalone":
            ok = 1.5 < f["mean_accept_length"] < k and all(f["rejections_by_position"])
    print("acceptance: " + ("PASS" if ok else "FAIL") + f" (standalone: 1.5 < mean < {k}, "
          "rejections at every position)")
    return 0 if ok else 1

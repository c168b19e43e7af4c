"""Real tensor-parallel ranks: ``overlapcheck run --tp N --dist``.

N spawned processes join a ``torch.distributed`` group on 127.0.0.1 (the device's
collective backend: gloo on the sim, NCCL on a GPU). Each runs the whole engine
(``engine.dist.DistRank``) on its own runtime from the same seed; rank 0 runs the
checkers through the run driver, and every rank writes a report. Every collective
has the run's timeout and the parent kills what is left at the deadline: never a hang.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Optional

import torch

from ..device import StuckWait
from ..engine.dist import DistRank, exit_step
from ..protocol.results import RequestResult, RunResult, Summary


def _rank_main(rank: int, job: dict, out: str) -> None:
    """One rank's process: join the group, run, write ``rank<N>.json`` in ``out``."""
    import torch.distributed as dist
    from fake_models import make_model
    from ..device import make_runtime
    torch.set_num_threads(1)
    _join(rank, job)
    rt = make_runtime(job["device"], seed=job["seed"], strategy=job["schedule"],
                      access=job["access"], graphs=job["graphs"])
    doc = _run_rank(rank, job, rt, make_model(job["cfg"].model))
    _write(os.path.join(out, f"rank{rank}.json"), doc)
    dist.destroy_process_group()


def _join(rank: int, job: dict) -> None:
    """Join the group with the device's collective backend (NCCL on a GPU, one device
    per rank; gloo on the sim); every collective times out after the run's timeout."""
    import torch.distributed as dist
    from ..device import device_info
    info = device_info(job["device"])
    if info.gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(info.collective, rank=rank,
                            init_method=f"tcp://127.0.0.1:{job['port']}",
                            world_size=job["cfg"].tp, timeout=timedelta(seconds=job["timeout"]))


def _run_rank(rank: int, job: dict, rt, model) -> dict:
    """Run the workload: rank 0 with the checkers (its report carries the result and
    the violations), the others without (their report says how they ended)."""
    from ..protocol import EngineStuck
    from .case import Case, ScheduleSpec
    from .driver import execute

    def factory(cfg, rt, model, observer=None, strict=False):
        eng = DistRank(cfg, rt, model, observer, strict)
        eng.rank, eng.exit_at = rank, exit_step(rank)
        return eng

    cfg, wl = job["cfg"], job["workload"]
    if rank == 0:
        case = Case(cfg, wl, ScheduleSpec(job["schedule"], job["seed"]), tuple(job["checks"]))
        run = execute(case, runtime=rt, model=model, engine=factory, trace=False)
        return {"rank": 0, "status": run.status, "step": run.steps,
                "result": run.result.to_json() if run.result is not None else None,
                "violations": [str(v) for v in run.violations] + [f.text for f in run.problems],
                "races": [str(r) for r in run.races]}
    eng = factory(cfg, rt, model)
    try:
        eng.run(wl)
        return {"rank": rank, "status": "completed", "step": eng.iteration}
    except (StuckWait, EngineStuck) as e:
        return {"rank": rank, "status": "stalled", "step": eng.iteration, "error": str(e)}


def _write(path: str, doc: dict) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


@dataclass
class DistRun:
    """What came back: each rank's report (None: it wrote none) and exit code."""

    reports: List[Optional[dict]]
    exitcodes: List[Optional[int]]
    killed: List[int]            # ranks still running at the deadline

    def problems(self) -> List[str]:
        """One line per rank that died, was killed or stalled (rank 0's own findings
        are its ``violations``)."""
        out = []
        for r, (doc, code) in enumerate(zip(self.reports, self.exitcodes)):
            if r in self.killed:
                out.append(f"[liveness] rank {r} had not finished at the deadline (killed)")
            elif code != 0:
                out.append(f"[liveness] rank {r} exited with code {code} before the end "
                           f"of the run")
            elif r and doc and doc.get("status") != "completed":
                out.append(f"[liveness] rank {r} step {doc['step']}: stuck wait: {doc['error']}")
        return out

    def result(self) -> Optional[RunResult]:
        doc = self.reports[0]
        if not doc or not doc.get("result"):
            return None
        reqs = {d["rid"]: RequestResult(d["rid"], tuple(d["tokens"]), d["finish_reason"],
                                        tuple(d["accept_lens"]), d["retractions"])
                for d in doc["result"]["requests"]}
        return RunResult(reqs, Summary(**doc["result"]["summary"]))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dist(cfg, workload, seed: int = 0, device: str = "sim", schedule: str = "random",
             access: str = "declared", checks=(), timeout: float = 120.0,
             graphs: bool = False) -> DistRun:
    """Run ``workload`` on ``cfg.tp`` real ranks; give up (killing the ranks) after
    ``timeout`` seconds plus a short grace."""
    import multiprocessing as mp
    job = {"cfg": cfg, "workload": workload, "seed": seed, "device": device,
           "schedule": schedule, "access": access, "checks": list(checks), "graphs": graphs,
           "timeout": timeout, "port": free_port()}
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="overlapcheck-dist-") as out:
        procs = [ctx.Process(target=_rank_main, args=(r, job, out), daemon=True)
                 for r in range(cfg.tp)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout + 10
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        killed = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in killed:
            procs[r].kill()
            procs[r].join()
        return DistRun([_read(os.path.join(out, f"rank{r}.json")) for r in range(cfg.tp)],
                       [p.exitcode for p in procs], killed)


def _read(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_command(args, cfg, workload, checks) -> int:
    """``overlapcheck run --dist``: print rank 0's result and every finding; exit 1
    when a rank disagreed, stalled or died, or rank 0 found a violation or a race."""
    import sys
    from fake_models import make_model
    from ..errors import UsageError
    if args.log:
        raise UsageError("--log is not available with --dist")
    try:
        make_model(cfg.model)
    except ValueError as e:
        raise UsageError(str(e)) from None
    run = run_dist(cfg, workload, seed=args.seed, device=args.device, schedule=args.schedule,
                   access=args.access, checks=checks, timeout=args.dist_timeout,
                   graphs=args.cuda_graphs)
    rank0 = run.reports[0] or {}
    found = rank0.get("violations", []) + run.problems()
    res = run.result()
    if args.json:
        doc = res.to_json() if res is not None else {"requests": [], "summary": None}
        doc["ranks"] = [{"rank": r, "exit": c, "status": (d or {}).get("status")}
                        for r, (d, c) in enumerate(zip(run.reports, run.exitcodes))]
        doc["races"], doc["violations"] = rank0.get("races", []), found
        print(json.dumps(doc, sort_keys=True, indent=1))
    else:
        if res is not None:
            print(res.text())
        else:
            print(f"run {rank0.get('status', 'lost')} at step {rank0.get('step', '?')}")
        for line in rank0.get("races", [])[:5]:
            print(line, file=sys.stderr)
        for v in found:
            print(v)
        if found:
            print(f"{len(found)} finding(s) over {cfg.tp} rank(s)")
    return 1 if (found or rank0.get("races") or any(run.exitcodes)) else 0

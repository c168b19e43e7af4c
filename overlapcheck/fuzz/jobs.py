"""A campaign as several jobs (``--jobs N``): their options and their merged summary
(``workers.run_jobs`` runs them).

Each job is an independent campaign with its own sub-seed (``derive(seed, "job",
j)``), run by a worker process (``workers.py``) that reports to the parent as it goes.
The parent merges the summaries and deduplicates findings across jobs.
"""
from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
from typing import TYPE_CHECKING

from .. import seeds

if TYPE_CHECKING:
    from .campaign import Options

# (the campaign's modules are imported where they are used: ``start_server`` runs before
# this process has imported them, so that the fork server imports them at the same time)


def tune_process(device: str) -> None:
    """Settings for a process that runs campaigns on ``device``: one intra-op thread
    for a backend whose work is tiny CPU ops (threads only add contention, and the
    models are batch invariant on one thread), and a garbage collector that does not
    rescan the libraries' objects at every full collection (``gc.freeze`` after a
    collection) nor look for cycles every 700 allocations (a run leaves its engine's
    object graph as cyclic garbage once, and little else; docs/design.md §8)."""
    from ..device import device_info
    if device_info(device).cpu_work:
        import torch
        torch.set_num_threads(1)
    gc.collect()
    gc.freeze()
    gc.set_threshold(10000, 20, 20)


def _context():
    """Worker processes forked from a server that imported the campaign's modules once
    (with ``spawn`` each of N workers spends seconds importing them again; a fork of
    the parent could inherit its threads). The server itself runs no torch op."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["overlapcheck.fuzz.campaign", "overlapcheck.fuzz.strategies",
                                "overlapcheck.engine.target", "overlapcheck.engine.tp",
                                "fake_models",
                                "fake_models.oracle_host", "invariants.base",
                                "overlapcheck.fuzz.workers"])
    return ctx


def start_server() -> None:
    """Start the worker processes' fork server now (``_context``): it imports the
    campaign's modules while this process imports them too, instead of after. ``fuzz
    -j N`` calls it first thing: on a machine with a core to spare the workers start
    about as soon as one process would (docs/design.md §8). A no-op without a fork
    server (spawn) or once it runs."""
    if _context().get_start_method() == "forkserver":
        from multiprocessing import forkserver
        forkserver.ensure_running()


def job_options(opts: "Options", jobs: int) -> list:
    """The options of each of ``jobs`` independent campaigns (processes, Ray slices):
    sub-seeds, the example budget split, a local database folder each (a shared one
    stays shared)."""
    from .db import DEFAULT_LOCAL
    base = dataclasses.replace(opts, progress=None, on_finding=None, stop=None, on_stats=None,
                               on_begin=None)
    local = opts.db or (DEFAULT_LOCAL if opts.shared_db else None)
    return [dataclasses.replace(base, seed=seeds.derive(opts.seed, "job", j) % (2 ** 31),
                                examples=None if opts.examples is None else -(-opts.examples // jobs),
                                db=None if local is None else f"{local}/job{j}")
            for j in range(jobs)]


def merge(opts: "Options", parts: list, secs: float, jobs: int) -> dict:
    """One summary from the jobs' summaries: findings deduplicated by id (the earliest
    kept), figures added up, rates over the wall time ``secs``."""
    merged, seen = [], {}
    for part in parts:
        for f in part["findings"]:
            old = seen.get(f["id"])
            if old is None or f["seconds_before"] < old["seconds_before"]:
                seen[f["id"]] = f
    merged = sorted(seen.values(), key=lambda f: f["seconds_before"])
    steps = sum(p["steps"] for p in parts)
    return {"seed": opts.seed, "device": opts.device, "target": opts.target,
            "engine_version": parts[0]["engine_version"] if parts else "", "jobs": jobs,
            "examples": sum(p["examples"] for p in parts), "steps": steps,
            "seconds": round(secs, 2), "steps_per_second": round(steps / secs, 1) if secs else 0.0,
            "cpu_seconds": round(sum(p.get("cpu_seconds", 0.0) for p in parts), 2),
            "hypothesis_runs": sum(p["hypothesis_runs"] for p in parts),
            "shrink_runs": sum(p["shrink_runs"] for p in parts),
            "replayed": sum(p.get("replayed", 0) for p in parts), "findings": merged}

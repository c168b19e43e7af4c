"""Overhead of ``overlapcheck watch`` on a 1,000-op program, PyTorch's CUDA sanitizer beside it.

    PYTHONPATH=. python bench/watch_overhead.py --out DIR            # a GPU machine
    PYTHONPATH=. python bench/watch_overhead.py --out DIR            # here: the CPU shim

The program is a race-free overlap loop of 250 steps, 4 ops each (a forward write,
a copy into the staging tensor, a non-blocking device-to-host copy on a copy stream
behind an event wait, a host read after the copy-done event): 1,000 dispatched ops
in the timed loop. Times are medians of ``--repeat`` runs, each run synchronized.

On a GPU: unwatched, then under ``watch(device="cuda")``, then under the sanitizer in
a child process (``TORCH_CUDA_SANITIZER=1``: it is process-wide and cannot be
turned off), each with its ratio to unwatched. Without a GPU: the unwatched run is
the same ops on plain CPU tensors with no streams, the watched run the CPU shim;
the sanitizer needs a GPU. Prints the figures, writes ``watch_overhead.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, OPS_PER_STEP = 250, 4


class _NoStreams:
    """The ``torch.cuda`` calls of the program, as no-ops: the unwatched CPU baseline."""

    class Stream:
        def wait_stream(self, other):
            pass

    class Event:
        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

    @staticmethod
    def stream(s):
        return contextlib.nullcontext()

    @staticmethod
    def synchronize():
        pass


def program(cuda, device: str) -> float:
    """Run the 1,000-op loop; returns its wall time in seconds."""
    import torch
    forward, copy = cuda.Stream(), cuda.Stream()
    with cuda.stream(forward):
        a = torch.zeros(1024, device=device)
        b = torch.empty_like(a)
    host = torch.empty(1024, pin_memory=device != "cpu")
    copy_done = cuda.Event()
    cuda.synchronize()
    t0 = time.perf_counter()
    total = 0.0
    for _ in range(STEPS):
        with cuda.stream(forward):
            a.add_(1.0)                            # op 1
            b.copy_(a)                             # op 2
        copy.wait_stream(forward)
        with cuda.stream(copy):
            host.copy_(b, non_blocking=True)       # op 3
        copy_done.record(copy)
        copy_done.synchronize()
        total += host[0].item()                    # op 4 (the index is a view)
    cuda.synchronize()
    elapsed = time.perf_counter() - t0
    assert total == STEPS * (STEPS + 1) / 2
    return elapsed


def _median(f, repeat: int) -> float:
    f()  # warm-up
    return statistics.median(f() for _ in range(repeat))


def measure_watched(device: str, repeat: int) -> dict:
    import torch

    from overlapcheck.watch import watch

    ops = []

    def run():
        with watch(device=device, mode="raise") as w:
            t = program(torch.cuda, "cuda")
        ops.append(w.summary()["ops"])
        return t

    return {"seconds": _median(run, repeat), "ops": ops[-1]}


def child_sanitizer(repeat: int) -> None:
    """In a process started with TORCH_CUDA_SANITIZER=1: time the loop, print JSON."""
    import torch
    import torch.cuda._sanitizer as csan
    if not csan.cuda_sanitizer.enabled:
        csan.enable_cuda_sanitizer()
    print(json.dumps({"seconds": _median(lambda: program(torch.cuda, "cuda"), repeat)}))


def measure_sanitizer(repeat: int) -> dict:
    env = dict(os.environ, TORCH_CUDA_SANITIZER="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-sanitizer",
                        "--repeat", str(repeat)], capture_output=True, text=True, env=env,
                       timeout=900)
    for line in reversed(p.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return {"error": tail}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for watch_overhead.json")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--child-sanitizer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    if args.child_sanitizer:
        child_sanitizer(args.repeat)
        return 0
    if not args.out:
        ap.error("--out is required")
    import torch
    torch.set_num_threads(1)
    gpu = torch.cuda.is_available()
    if gpu:
        base = _median(lambda: program(torch.cuda, "cuda"), args.repeat)
        where = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        base = _median(lambda: program(_NoStreams, "cpu"), args.repeat)
        where = "cpu (no GPU: unwatched = plain CPU tensors, watched = the CPU shim)"
    watched = measure_watched("cuda" if gpu else "cpu", args.repeat)
    san = measure_sanitizer(args.repeat) if gpu else {"error": "needs a GPU"}
    result = {"where": where, "torch": torch.__version__, "steps": STEPS,
              "ops_in_loop": STEPS * OPS_PER_STEP, "ops_watched": watched["ops"],
              "unwatched_s": base, "watched_s": watched["seconds"],
              "watched_ratio": watched["seconds"] / base,
              "sanitizer_s": san.get("seconds"),
              "sanitizer_ratio": san["seconds"] / base if "seconds" in san else None,
              "sanitizer_error": san.get("error")}
    lines = [f"watch overhead: {where}, torch {torch.__version__}",
             f"  {result['ops_in_loop']}-op loop ({watched['ops']} ops seen by watch, setup "
             f"included), median of {args.repeat}",
             f"  unwatched             {base * 1e3:9.1f} ms",
             f"  overlapcheck watch    {watched['seconds'] * 1e3:9.1f} ms  "
             f"{result['watched_ratio']:6.1f}x"]
    if result["sanitizer_ratio"] is not None:
        lines.append(f"  PyTorch sanitizer     {san['seconds'] * 1e3:9.1f} ms  "
                     f"{result['sanitizer_ratio']:6.1f}x")
    else:
        lines.append(f"  PyTorch sanitizer     n/a ({san['error']})")
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "watch_overhead.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

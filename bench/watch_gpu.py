"""The acceptance table of ``overlapcheck watch``: every catalogue program and its twin,
checked by ours on the CPU shim, ours on the GPU, and PyTorch's CUDA sanitizer.

    PYTHONPATH=. python bench/watch_gpu.py --out DIR      # on a GPU machine
    PYTHONPATH=. python bench/watch_gpu.py --out DIR      # here: the cpu column only

Each cell is one fresh process, as a user would run it: ``python -m overlapcheck.watch
--device cpu|cuda --json F -- python prog.py [--fixed]`` for ours, and ``python
prog.py [--fixed]`` with ``TORCH_CUDA_SANITIZER=1`` for the sanitizer (it is
process-wide and raises on its first error). Happens-before verdicts do not depend
on timing, so processes run side by side (``--jobs``).

Expected: ours flags every planted race (with a kind the program declares) and no
twin, on both devices; the sanitizer flags the planted races a program marks
``SANITIZER = True``, misses the others, and flags no twin. Prints the table and a
summary, writes ``watch_gpu.json`` and ``watch_gpu.txt`` to ``--out``; exit status 0
when every cell is as expected, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from overlapcheck.watch import catalogue  # noqa: E402  (torch-free)

PROGRAMS = os.path.join(ROOT, "tests", "watch", "programs")
CSAN_MARK = "CSAN detected a possible data race"
TIMEOUT_S = 300


def _env(**extra) -> Dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def ours(path: str, argv: List[str], device: str) -> Tuple[str, Tuple[str, ...], str]:
    """(verdict, kinds, detail): verdict is "race", "quiet" or "error"."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "overlapcheck.watch", "--device", device, "--json",
               out, "--", sys.executable, path, *argv]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT,
                               timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "error", (), f"timed out after {TIMEOUT_S}s"
        if p.returncode not in (0, 1) or not os.path.exists(out):
            tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            return "error", (), tail
        with open(out) as f:
            data = json.load(f)
    kinds = tuple(sorted({r["kind"] for r in data["races"]}))
    first = data["races"][0]["missing_edge"] if data["races"] else ""
    return ("race" if kinds else "quiet"), kinds, first


def sanitizer(path: str, argv: List[str]) -> Tuple[str, str]:
    """("flagged" | "not flagged" | "error", detail)."""
    try:
        p = subprocess.run([sys.executable, path, *argv], capture_output=True, text=True,
                           env=_env(TORCH_CUDA_SANITIZER="1"), cwd=ROOT, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "error", f"timed out after {TIMEOUT_S}s"
    if CSAN_MARK in p.stderr:
        return "flagged", ""
    if p.returncode == 0:
        return "not flagged", ""
    return "error", (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def judge(prog, racy: bool, cpu, cuda, san) -> List[str]:
    problems = []
    for device, cell in (("cpu", cpu), ("cuda", cuda)):
        if cell is None:
            continue
        verdict, kinds, detail = cell
        if verdict == "error":
            problems.append(f"ours on {device}: {detail}")
        elif racy and verdict != "race":
            problems.append(f"ours on {device}: planted race not reported")
        elif not racy and verdict != "quiet":
            problems.append(f"ours on {device}: twin reported as {', '.join(kinds)}")
        elif racy and not set(kinds) <= set(prog.kinds):
            problems.append(f"ours on {device}: reported as {', '.join(kinds)}, expected "
                            f"{' or '.join(prog.kinds)}")
    if cpu is not None and cuda is not None and cpu[:2] != cuda[:2]:
        problems.append(f"cpu and cuda verdicts differ: {cpu[:2]} vs {cuda[:2]}")
    if san is not None:
        want = "flagged" if racy and prog.sanitizer else "not flagged"
        if san[0] != want:
            problems.append(f"sanitizer: {san[0]} {san[1]}".strip() + f", expected {want}")
    return problems


def _cell(c) -> str:
    if c is None:
        return "n/a"
    if c[0] == "race":
        return "race: " + ",".join(c[1])
    return c[0]


def table(rows: List[dict]) -> List[str]:
    head = ["program", "expected", "ours cpu", "ours cuda", "sanitizer (can see it)", "ok"]
    body = [[r["label"], r["expected"], r["ours_cpu"], r["ours_cuda"],
             f"{r['sanitizer']} ({'yes' if r['sanitizer_sees'] else 'no'})" if r["racy"]
             else r["sanitizer"], "ok" if not r["problems"] else "FAIL"] for r in rows]
    widths = [max(len(x[i]) for x in body + [head]) for i in range(len(head))]

    def fmt(r):
        return "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()

    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body]
    for r in rows:
        out.extend(f"FAIL {r['label']}: {p}" for p in r["problems"])
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for watch_gpu.json and .txt")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--no-sanitizer", action="store_true")
    ap.add_argument("--programs", default=PROGRAMS)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpu = _has_cuda()
    progs = catalogue.load(args.programs)
    cases = [(p, label, extra, racy) for p in progs for label, extra, racy in p.variants()]
    with ThreadPoolExecutor(args.jobs) as pool:
        cpu_f = [pool.submit(ours, p.path, extra, "cpu") for p, _, extra, _ in cases]
        cuda_f = [pool.submit(ours, p.path, extra, "cuda") if gpu else None
                  for p, _, extra, _ in cases]
        san_f = [pool.submit(sanitizer, p.path, extra) if gpu and not args.no_sanitizer
                 else None for p, _, extra, _ in cases]
        rows = []
        for (p, label, _, racy), cf, gf, sf in zip(cases, cpu_f, cuda_f, san_f):
            cpu, cuda = cf.result(), gf.result() if gf else None
            san = sf.result() if sf else None
            rows.append({"label": label, "program": p.name, "racy": racy, "bug": p.bug,
                         "selftest": p.selftest,
                         "expected": ("race: " + " or ".join(p.kinds)) if racy else "quiet",
                         "ours_cpu": _cell(cpu), "ours_cuda": _cell(cuda),
                         "sanitizer": san[0] if san else "n/a", "sanitizer_sees": p.sanitizer,
                         "sanitizer_expected": (("flagged" if racy and p.sanitizer
                                                 else "not flagged") if san else None),
                         "problems": judge(p, racy, cpu, cuda, san)})
    lines = table(rows)
    racy_rows = [r for r in rows if r["racy"]]
    missed = [r for r in racy_rows if r["sanitizer"] == "not flagged"
              and r["ours_cuda" if gpu else "ours_cpu"].startswith("race")]
    failed = sum(bool(r["problems"]) for r in rows)
    import torch
    where = (f"cuda ({torch.cuda.get_device_name(0)}), torch {torch.__version__}" if gpu
             else f"no GPU here: cpu column only, torch {torch.__version__}")
    lines += ["", f"watch acceptance: {where}",
              f"  {len(racy_rows)} planted races, {len(rows) - len(racy_rows)} twins; "
              f"{len([p for p in progs if p.bug])} re-create public bugs",
              f"  planted races ours reports but PyTorch's sanitizer misses: {len(missed)}"
              + ("" if gpu and not args.no_sanitizer else " (sanitizer not run)"),
              f"  {'PASS' if not failed else 'FAIL'}: {len(rows) - failed}/{len(rows)} cells "
              f"as expected"]
    print("\n".join(lines))
    with open(os.path.join(args.out, "watch_gpu.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "watch_gpu.json"), "w") as f:
        json.dump({"gpu": gpu, "where": where, "rows": rows, "failed": failed}, f, indent=1)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

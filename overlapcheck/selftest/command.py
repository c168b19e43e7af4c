"""``overlapcheck selftest``: run the catalogue of planted races and synchronized twins.

Exit status: 0 when every planted race is flagged and no twin is (and, on cuda, the
PyTorch sanitizer agrees on the stream<->stream cases), 1 otherwise, 2 on usage errors.
torch is imported only when the command runs, so ``overlapcheck --help`` stays fast.
"""
from __future__ import annotations

import json
from typing import List

HELP = "run the planted-race catalogue and its synchronized twins"


def register(subparsers) -> None:
    """Add the ``selftest`` subcommand to the ``overlapcheck`` parser."""
    p = subparsers.add_parser("selftest", help=HELP, description=HELP + ".")
    p.add_argument("--device", default="sim", metavar="DEVICE",
                   help="runtime backend: sim (default) or cuda")
    p.add_argument("--seed", type=int, default=0,
                   help="base seed of the sim schedules (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only this case (repeatable)")
    p.add_argument("--list", action="store_true", help="list the catalogue and exit")
    p.add_argument("--no-sanitizer", action="store_true",
                   help="on cuda, skip the PyTorch CUDA sanitizer subprocesses")
    p.set_defaults(func=run)


def _check_device(device: str) -> None:
    from ..errors import UsageError
    from ..device import DEVICES
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    if DEVICES[device].gpu:
        import importlib.util

        import torch
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available on this machine")
        if importlib.util.find_spec("overlapcheck.device.cuda") is None:
            raise UsageError("--device cuda: the cuda backend is not installed")


def run(args) -> int:
    """Entry point of ``overlapcheck selftest``."""
    from ..errors import UsageError
    from . import runner

    _check_device(args.device)
    try:
        cases = runner.select(args.case)
    except KeyError as e:
        raise UsageError(f"unknown case {e.args[0]} (see --list)") from None
    if args.list:
        for c in cases:
            print(f"{c.name:<46} {'race' if c.expect_race else 'twin':<5} {c.description}")
        return 0
    from ..device import DEVICES
    sanitize = DEVICES[args.device].gpu and not args.no_sanitizer
    verdicts = runner.run_catalogue(args.device, args.seed, [c.name for c in cases], sanitize)
    counts = runner.summary(verdicts)
    if args.json:
        print(json.dumps({"device": args.device, "seed": args.seed,
                          "schedules": len(runner.schedules(args.device, args.seed)),
                          "cases": [v.to_json() for v in verdicts],
                          "summary": counts}, indent=1))
    else:
        print("\n".join(table(verdicts, sanitize)))
        print(summary_line(args.device, args.seed, counts))
    return 0 if counts["failed"] == 0 else 1


def table(verdicts, with_sanitizer: bool) -> List[str]:
    """The result table, one row per case, then the problems of failed cases."""
    head = ["case", "expected", "detected", "kind"] + (["sanitizer"] if with_sanitizer else [])
    rows = []
    for v in verdicts:
        row = [v.case.name, "race" if v.case.expect_race else "none",
               "yes" if v.detected else "no", ",".join(v.kinds) or "-"]
        if with_sanitizer:
            row.append(v.sanitizer or "n/a")
        rows.append(row + ["ok" if v.ok else "FAIL"])
    head.append("ok")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]

    def fmt(r):
        return "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()

    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    for v in verdicts:
        for p in v.problems:
            out.append(f"FAIL {v.case.name}: {p}")
    return out


def summary_line(device: str, seed: int, c: dict) -> str:
    from ..device import DEVICES
    from .runner import schedules
    n = len(schedules(device, seed))
    where = f"{n} schedules per case, seed {seed}" if DEVICES[device].replayable else "one run per case"
    verdict = "PASS" if c["failed"] == 0 else "FAIL"
    return (f"selftest {device}: {verdict}: {c['races_flagged']}/{c['races']} planted races "
            f"flagged, {c['twins_flagged']}/{c['twins']} twins flagged, {c['ok']}/{c['cases']} "
            f"cases ok ({where})")

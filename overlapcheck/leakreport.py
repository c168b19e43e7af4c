"""``overlapcheck leak-report FILE``: who leaked KV, from a run log (``run --log``).

Prints leaked slots by request / purpose / allocating step / pages, the step at which
each leak became certain, and a text pool-occupancy timeline; ``--json`` for machines,
``--plot out.png`` (needs matplotlib). Exit codes: 0 no leak, 1 leaks, 2 bad input.
"""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("leak-report", help="report KV leaks from a run log",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("file", metavar="FILE", help="a run log written by 'overlapcheck run --log'")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="also plot the pool occupancy (matplotlib)")
    p.add_argument("--partial", action="store_true",
                   help="accept a log without its end record (a killed run's prefix)")
    p.add_argument("--rows", type=int, default=40, help="timeline rows in the text output")
    p.set_defaults(func=run)


def run(args) -> int:
    from invariants.leaks import analyze, plot
    from invariants.runlog import LogError, read_log

    from .errors import UsageError
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib, which is not installed") from None
    try:
        report = analyze(read_log(args.file, partial=args.partial))
    except LogError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True, indent=1))
    else:
        print(report.text(max(1, args.rows)))
    if args.plot:
        plot(report, args.plot)
    return 1 if report.leaks else 0

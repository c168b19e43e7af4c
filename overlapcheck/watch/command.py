"""``overlapcheck watch``: run an unmodified PyTorch program under the race detector.

    overlapcheck watch [--device auto|cpu|cuda] [--mode log|raise] [--json FILE] \\
        -- python script.py [args...]

The script runs in this process with its own ``sys.argv``. Exit status: the
program's own (130 when it ends by ``KeyboardInterrupt``, as Python's would), unless a
race was found (1, with the reports on stderr); 2 for bad input (no program, a missing
script or one that is not Python, an unknown device or mode, a ``--json`` path that
cannot be written), printed as one line.
torch is imported only once the input is known to be good, so ``--help`` is instant.
"""
from __future__ import annotations

import argparse
import logging
import sys

HELP = "run an unmodified PyTorch program under the race detector"
from .backends import BACKENDS, DEVICES

CLI_MODES = ("log", "raise")   # collect is for drivers that report races themselves


def register(subparsers) -> None:
    """Add the ``watch`` subcommand to the ``overlapcheck`` parser."""
    p = subparsers.add_parser(
        "watch", help=HELP,
        description=HELP + ": streams, events, syncs, allocations and copies of plain "
                           "torch.cuda code, checked by happens-before.",
        epilog="example: overlapcheck watch --device cpu -- python my_engine.py --steps 8")
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help="cuda (a GPU), cpu (a CPU shim of torch.cuda: the same verdicts "
                        "without a GPU) or auto (default: cuda when available)")
    p.add_argument("--mode", default="log", metavar="MODE",
                   help="log (default): run to the end and report every race; raise: stop "
                        "the program at the first race")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM",
                   help="the program: -- python script.py [args...] or -- python -m module")
    p.set_defaults(func=run)


def _check(args):
    from ..errors import UsageError
    from .runner import parse_command
    if args.device not in DEVICES:
        raise UsageError(f"unknown device {args.device!r} (choose from {', '.join(DEVICES)})")
    if args.mode not in CLI_MODES:
        raise UsageError(f"unknown mode {args.mode!r} (choose from {', '.join(CLI_MODES)})")
    target = parse_command(args.program)
    if args.json:
        from ..outputs import output_file
        output_file(args.json, "--json")
    if args.device in BACKENDS and BACKENDS[args.device].gpu:
        import torch
        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: CUDA is not available on this machine "
                             f"(--device cpu runs the same checks on the CPU)")
    return target


def run(args) -> int:
    """Entry point of ``overlapcheck watch``."""
    kind, target, prog_args = _check(args)
    from .runner import run_program

    logger = logging.getLogger("overlapcheck.watch")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("overlapcheck watch: %(message)s"))
    logger.addHandler(handler)
    saved = logger.propagate
    logger.propagate = False
    try:
        out = run_program(target, prog_args, module=(kind == "module"), device=args.device,
                          mode=args.mode, json_path=args.json)
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved
    if out.error is not None:
        _print_program_error(out.error)
    w = out.watch
    for r in w.reports:  # each was printed when first seen; say what came after
        if r.count > 1:
            print(f"overlapcheck watch: race [{r.ident}] {r.seen()}", file=sys.stderr)
    written = ""
    if args.json:
        if out.json_error is None:
            written = f"; report written to {args.json}"
        else:
            print(f"overlapcheck watch: error: --json {args.json}: cannot write the report "
                  f"({out.json_error})", file=sys.stderr)
    s = w.summary()
    if w.reports:
        verdict = _count(s["races"], "race")
        extra = []
        if s["occurrences"] != s["races"]:
            extra.append(f"{s['occurrences']} occurrences")
        if s["tensors"] != s["races"]:
            extra.append(f"on {s['tensors']} tensors")
        if extra:
            verdict += f" ({', '.join(extra)})"
    else:
        verdict = "no race"
    print(f"overlapcheck watch ({w.device}): {verdict} in {_count(s['ops'], 'op')} on "
          f"{_count(s['streams'], 'stream')}" + written, file=sys.stderr)
    return 1 if w.reports else out.status


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _print_program_error(exc: BaseException) -> None:
    """The program's traceback as Python would print it: from the program's frames on
    (the runner's own frames left out), notes included."""
    import traceback

    from .frames import Frames
    frames = Frames()
    tb = exc.__traceback__
    while tb is not None and not frames.is_user(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def main(argv=None) -> int:
    """``python -m overlapcheck.watch [options] -- python script.py``: this command
    alone, without loading the other commands of ``overlapcheck``."""
    from ..errors import EXIT_USAGE, UsageError

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # one line, as the overlapcheck command line does
            self.exit(EXIT_USAGE, f"overlapcheck watch: error: {message}\n")

    top = Parser(prog="overlapcheck")
    register(top.add_subparsers(dest="command", parser_class=Parser))
    args = top.parse_args(["watch", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except UsageError as e:
        print(f"overlapcheck watch: error: {e}", file=sys.stderr)
        return EXIT_USAGE

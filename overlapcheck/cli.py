"""``overlapcheck`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``; heavy
imports (torch) happen inside the command, so ``--help`` is instant. Usage errors and
bad input print one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import List, Optional

from .errors import EXIT_USAGE, UsageError

# the command's start: a time box (``fuzz --time``) counts start-up against its budget
STARTED = time.monotonic()

# subcommand name -> module providing register(subparsers); a module may register
# several subcommands, and is registered once
COMMANDS = {
    "selftest": "overlapcheck.selftest.command",
    "run": "overlapcheck.run.command",
    "leak-report": "overlapcheck.leakreport",
    "fuzz": "overlapcheck.fuzz.command",
    "faults": "overlapcheck.targets.command",
    "replay": "overlapcheck.repro.command",
    "trace": "overlapcheck.repro.command",
    "minimize": "overlapcheck.repro.command",
    "watch": "overlapcheck.watch.command",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    p = _Parser(prog="overlapcheck",
                description="Deterministic testing and fuzzing of overlap-scheduled "
                            "speculative decoding engines.")
    p.add_argument("--version", action="version", version=f"overlapcheck {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(module).register(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    from .protocol.target import TargetUnavailable
    try:
        return int(args.func(args) or 0)
    except (UsageError, TargetUnavailable) as e:
        # a target's engine missing (a repro of a target replayed where it is not
        # installed): one line naming the install command, never "reproduced"
        print(f"overlapcheck {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"overlapcheck {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:       # the reader went away (``| head``): not an error of ours
        import os
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


# commands whose process ends as soon as they return: a campaign's heap (its runs'
# objects, the frozen libraries) takes the interpreter seconds to tear down, which a time
# box (``fuzz --time``) cannot spare; everything they write is written and flushed by then
FAST_EXIT = ("fuzz",)


def entry() -> None:
    """The ``overlapcheck`` program: ``main`` on the command line, then the process's
    exit (at once for ``FAST_EXIT`` commands, after flushing the output)."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in FAST_EXIT:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if "multiprocessing.util" in sys.modules:   # its temporary folders, as at exit
            try:
                sys.modules["multiprocessing.util"]._run_finalizers()
            except Exception:  # noqa: BLE001 - a cleanup that fails leaves a folder behind
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()

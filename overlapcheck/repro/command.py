"""``overlapcheck replay``, ``overlapcheck trace`` and ``overlapcheck minimize``."""
from __future__ import annotations

import json
import os


def register(sub) -> None:
    p = sub.add_parser("replay", help="replay a repro file exactly",
                       description="Replay a repro: exit 1 reproduced, 0 no violation any more, "
                                   "3 diverged (the run no longer follows the recorded choices), "
                                   "2 bad input.")
    p.add_argument("file", metavar="FILE.yaml")
    p.add_argument("--emit-pytest", metavar="TEST.py",
                   help="also write a regression test that replays FILE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_replay)

    p = sub.add_parser("trace", help="write the Chrome/Perfetto trace of a repro",
                       description="Replay a repro and write a Chrome/Perfetto trace JSON of "
                                   "its streams per step: exit 0 written, 3 diverged (the run "
                                   "no longer follows the recorded choices; nothing written), "
                                   "2 bad input.")
    p.add_argument("file", metavar="FILE.yaml")
    p.add_argument("-o", "--output", metavar="OUT.json",
                   help="output path (default: FILE with .trace.json)")
    p.set_defaults(func=run_trace)

    p = sub.add_parser("minimize", help="delta-debug a repro to a smaller one",
                       description="Shrink a repro's workload (requests, aborts, prompts, "
                                   "lengths) while its finding still shows; for repros that "
                                   "did not come from Hypothesis, e.g. from a GPU run.")
    p.add_argument("file", metavar="FILE.yaml")
    p.add_argument("-o", "--output", metavar="OUT.yaml",
                   help="output path (default: FILE with .min.yaml)")
    p.add_argument("--max-runs", type=int, default=400, metavar="N",
                   help="engine runs at most (default 400)")
    p.set_defaults(func=run_minimize)


def _load(path):
    """The repro at ``path``, checked for what running it needs: a bad file, a case this
    machine cannot hold or a prompt outside its model's vocabulary is a usage error."""
    from ..errors import UsageError
    from ..run.case import CaseError, check_fits
    from .format import ReproError, load
    try:
        r = load(path)
        check_fits(r.case)
    except (ReproError, CaseError) as e:
        raise UsageError(f"{path}: {e}" if isinstance(e, CaseError) else str(e)) from None
    if r.case.target == "reference":
        from fake_models import vocab_of
        from ..protocol.workload import WorkloadError, check_vocab
        try:
            check_vocab(r.case.workload, vocab_of(r.case.config.model), r.case.config.model)
        except WorkloadError as e:
            raise UsageError(f"{path}: case.workload.{e}") from None
    return r


def run_replay(args) -> int:
    from ..outputs import output_file
    r = _load(args.file)          # a bad file is a usage error before the engine loads
    if args.emit_pytest:
        output_file(args.emit_pytest, "--emit-pytest")
    from .replay import emit_pytest, replay
    from .format import write_atomic
    res = replay(r)
    if args.emit_pytest:
        write_atomic(args.emit_pytest, emit_pytest(r, args.file))
    if args.json:
        print(json.dumps({"verdict": res.verdict, "exit": res.exit_code, "detail": res.detail,
                          "finding": r.finding.ident, "digest_match": res.digest_match}))
    else:
        print(f"{res.verdict}: {r.finding.ident} ({r.finding.checker})")
        if res.detail:
            print("  " + res.detail.replace("\n", "\n  "))
        if res.verdict != "diverged":
            print(f"  trace digest {'matches' if res.digest_match else 'differs from'} the repro's")
    return res.exit_code


def run_trace(args) -> int:
    from ..outputs import output_file
    r = _load(args.file)
    path = output_file(args.output or os.path.splitext(args.file)[0] + ".trace.json",
                       "--output")
    from ..run import execute
    from .trace import write_trace
    out = execute(r.case, choices=r.choices)
    if out.diverged:
        # the run left the recorded choices: its trace would not be the repro's run
        print(f"diverged: {r.finding.ident} ({r.finding.checker}); no trace written\n"
              f"  {out.diverged}")
        return 3
    write_trace(out, path)
    print(f"wrote {path} ({len(out.retired)} device ops, {out.steps} steps)")
    return 0


def run_minimize(args) -> int:
    from ..errors import UsageError
    from ..outputs import output_file
    from .format import save
    from .minimize import minimize
    if args.max_runs < 1:
        raise UsageError(f"--max-runs must be at least 1, got {args.max_runs}")
    r = _load(args.file)
    path = output_file(args.output or os.path.splitext(args.file)[0] + ".min.yaml", "--output")
    small, runs = minimize(r, args.max_runs)
    if small is None:
        print(f"the finding {r.finding.ident} does not show when the repro's case is run "
              f"on the sim with its schedule spec: nothing to minimize")
        return 3
    save(small, path)
    w0, w1 = r.case.workload, small.case.workload
    print(f"minimized in {runs} runs: {len(w0.requests)} -> {len(w1.requests)} requests, "
          f"{r.steps} -> {small.steps} steps; wrote {path}")
    return 0

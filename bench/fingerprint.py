"""Fingerprint of a campaign: every run a fixed campaign makes, with what it gave, so that a
change meant to be behaviour-neutral (a speed-up, a refactor) can be shown to be one
(docs/design.md §8).

    python bench/fingerprint.py --out before.jsonl                 # on the tree before
    python bench/fingerprint.py --against before.jsonl             # on the tree after
    python bench/fingerprint.py --examples 200 --fault no-copy-done-wait --out f.jsonl

Runs the main job's campaign (``overlapcheck fuzz --examples N --seed S``: the sim, the
oracle model unless ``--model``, every checker) and records one row per run of the
engine, generated examples, shrink steps and replays alike, in order: the case (its
``Case.to_dict`` digest), the run's trace digest, its steps and status, and the
(checker, site) keys of its findings. Two trees that explore alike give the same rows;
the first row that differs says where they part (a different case: the fuzzer drew
differently; the same case with another digest: the engine or runtime ran it
differently; the same digest with other findings: a checker judged it differently).
``--fault`` plants a bug of the zoo, so findings and shrinking are in the fingerprint
too. Exit 0 (``--against``: the same rows), 1 (they differ), 2 (bad arguments or a file
that is not a fingerprint).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

from overlapcheck.fuzz import campaign as C

SCHEMA = "overlapcheck.fingerprint/1"


def _bad(msg: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    print(f"fingerprint: {msg}", file=sys.stderr)
    raise SystemExit(2)


def case_digest(case) -> str:
    return hashlib.sha256(json.dumps(case.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def record(opts: C.Options) -> list:
    """The campaign's runs, in order: [case, digest, steps, status, finding keys]."""
    rows = []
    execute = C.execute

    def recorded(case, *a, **kw):
        out = execute(case, *a, **kw)
        rows.append([case_digest(case), out.digest, out.steps, out.status,
                     sorted("/".join(map(str, f.key)) for f in out.findings)])
        return out
    C.execute = recorded
    try:
        C.Campaign(opts).run()
    finally:
        C.execute = execute
    return rows


def options(args) -> C.Options:
    """The campaign ``overlapcheck fuzz --examples N --seed S [--model M] [--fault F]...``
    runs, checked as that command checks its flags (an unknown fault or model: one line,
    exit 2), writing no repro."""
    from overlapcheck.cli import build_parser
    from overlapcheck.errors import UsageError
    from overlapcheck.fuzz.command import _options
    argv = ["fuzz", "--examples", str(args.examples), "--seed", str(args.seed)]
    argv += ["--model", args.model] if args.model else []
    for f in args.fault:
        argv += ["--fault", f]
    try:
        opts = _options(build_parser().parse_args(argv))
    except UsageError as e:
        _bad(str(e))
    opts.out = None
    return opts


def read(path: str) -> tuple:
    """(header, rows) of a fingerprint file; exit 2 with one line if it is not one."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
        head = json.loads(lines[0]) if lines else None
        if not isinstance(head, dict) or head.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} file")
        rows = [json.loads(line) for line in lines[1:]]
        if not all(isinstance(r, list) and len(r) == 5 for r in rows):
            raise ValueError("a row is not [case, digest, steps, status, findings]")
    except (OSError, ValueError) as e:
        _bad(f"{path}: {e}")
    return head, rows


def first_difference(a: list, b: list):
    """(index, what) of the first row where ``a`` and ``b`` part, or None."""
    fields = ("case", "digest", "steps", "status", "findings")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            k = next(j for j in range(5) if x[j] != y[j])
            return i, f"{fields[k]}: {x[k]} here, {y[k]} there"
    if len(a) != len(b):
        return min(len(a), len(b)), f"{len(a)} runs here, {len(b)} there"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=100, help="generated examples (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="reference engine model (default: oracle)")
    p.add_argument("--fault", action="append", default=[], help="a fault to plant (repeatable)")
    p.add_argument("--out", help="write the fingerprint here (JSON lines)")
    p.add_argument("--against", help="compare with a fingerprint written before")
    args = p.parse_args(argv)
    if args.examples < 1:
        p.error("--examples must be at least 1")
    if not args.out and not args.against:
        p.error("give --out FILE, --against FILE, or both")
    base = read(args.against) if args.against else None
    head = {"schema": SCHEMA, "examples": args.examples, "seed": args.seed,
            "model": args.model, "faults": sorted(args.fault)}
    theirs = {k: base[0].get(k) for k in head} if base is not None else head
    if theirs != head:
        _bad(f"{args.against} is of another campaign ({theirs})")
    rows = record(options(args))
    fp = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
    findings = sorted({k for r in rows for k in r[4]})
    print(f"{len(rows)} runs, {sum(r[2] for r in rows)} steps, {len(findings)} distinct "
          f"finding key(s), fingerprint {fp}")
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(json.dumps({**head, "fingerprint": fp}) + "\n")
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    if base is None:
        return 0
    diff = first_difference(rows, base[1])
    if diff is None:
        print(f"SAME as {args.against}")
        return 0
    print(f"DIFFERENT from {args.against}: first at run {diff[0]}: {diff[1]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())

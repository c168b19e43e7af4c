"""``overlapcheck faults``: list a target's faults. For the reference engine, the bug
zoo (name, class, site, mechanism, checker); for a real engine, its historical bugs
re-created as opt-in patches (name, the fix they revert, checker)."""
from __future__ import annotations

import json
import textwrap


def register(sub) -> None:
    from .. import targets
    p = sub.add_parser("faults", help="list a target's faults (default: the bug zoo)",
                       description="List the named faults of a target. For the reference "
                                   "engine, the bug zoo: class (docs/design.md §7), guarded "
                                   "site, mechanism, the public bug it mirrors, the checker "
                                   "expected to catch it and its trigger. For vllm and "
                                   "sglang, their public fixed bugs re-created as opt-in "
                                   "patches: the fix reverted, the checker, the trigger.")
    p.add_argument("--target", default="reference", metavar="NAME",
                   help=f"{', '.join(targets.TARGETS)} (default reference)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import targets
    from ..errors import UsageError
    try:
        faults = targets.get(args.target).faults()   # listing needs no engine installed
    except ValueError as e:
        raise UsageError(str(e)) from None
    rows = sorted((f.to_dict() for f in faults.values()),
                  key=lambda d: (d.get("class", 0), d["name"]))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"target {args.target} has no faults")
        return 0
    w = max(len(d["name"]) for d in rows)
    head = [k for k in ("class",) if k in rows[0]]
    print(f"{'fault':<{w}}  " + "".join(f"{k:>5}  " for k in head) + f"{'checker':<22} where")
    for d in rows:
        where = d.get("site") or d.get("pr") or ""
        print(f"{d['name']:<{w}}  " + "".join(f"{d[k]:>5}  " for k in head)
              + f"{d['checker']:<22} {where}")
        for key in ("mechanism", "description", "mirrors", "trigger", "sites"):
            if key not in d:
                continue
            value = d[key] if isinstance(d[key], str) else ", ".join(d[key])
            text = value if key in ("mechanism", "description") else f"{key}: {value}"
            for line in textwrap.wrap(text, 88):
                print(f"{'':<{w}}  {line}")
    return 0

"""``overlapcheck faults``: list a target's faults (``overlapcheck.faults.Fault``): name,
the target's own fields (the zoo's class), the checker expected to catch it, where its
mechanism acts; then what goes wrong, the public bug it re-creates and its trigger.
``--json`` gives every field of each, the target's own included."""
from __future__ import annotations

import json
import textwrap


def register(sub) -> None:
    from .. import targets
    p = sub.add_parser("faults", help="list a target's faults (default: the bug zoo)",
                       description="List the named faults of a target: for the reference "
                                   "engine, the bug zoo's guarded sites (class: "
                                   "docs/design.md §7); for vllm and sglang, their public "
                                   "fixed bugs re-created as source patches of the pre-fix "
                                   "code. Each with what goes wrong, the public bug, the "
                                   "checker expected to catch it and its trigger.")
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
    order = sorted(faults.values(), key=lambda f: (f.extra.get("class", 0), f.name))
    if args.json:
        print(json.dumps([f.to_dict() for f in order], indent=1))
        return 0
    if not order:
        print(f"target {args.target} has no faults")
        return 0
    w = max(len(f.name) for f in order)
    # a field every fault has as a short word or number is a column; the others a line
    head = [k for k in order[0].extra
            if all(isinstance(f.extra.get(k), (int, str)) and len(str(f.extra[k])) <= 9
                   for f in order)]
    cw = {k: max(5, len(k), *(len(str(f.extra[k])) for f in order)) for k in head}
    print(f"{'fault':<{w}}  " + "".join(f"{k:>{cw[k]}}  " for k in head)
          + f"{'checker':<22} where")
    for f in order:
        print(f"{f.name:<{w}}  " + "".join(f"{f.extra[k]!s:>{cw[k]}}  " for k in head)
              + f"{f.checker:<22} {', '.join(f.sites)}")
        more = [(k, ", ".join(map(str, v)) if isinstance(v, tuple) else str(v))
                for k, v in f.extra.items() if k not in head and v is not None]
        for label, text in [("", f.description), ("bug", f.cites), ("trigger", f.trigger)] + more:
            for line in textwrap.wrap(f"{label}: {text}" if label else text, 88):
                print(f"{'':<{w}}  {line}")
    return 0

"""``overlapcheck faults``: list the bug zoo (name, class, site, mechanism, checker)."""
from __future__ import annotations

import json
import textwrap


def register(sub) -> None:
    p = sub.add_parser("faults", help="list the bug zoo's faults",
                       description="List the named faults of the bug zoo: bug-zoo class (docs/design.md §7), the "
                                   "guarded site, the mechanism, the public bug it mirrors, "
                                   "the checker expected to catch it and its trigger.")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from . import FAULTS
    faults = sorted(FAULTS.values(), key=lambda f: (f.cls, f.name))
    if args.json:
        print(json.dumps([f.to_dict() for f in faults], indent=1))
        return 0
    w = max(len(f.name) for f in faults)
    print(f"{'fault':<{w}}  class  {'checker':<15} site")
    for f in faults:
        print(f"{f.name:<{w}}  {f.cls:>5}  {f.checker:<15} {f.site}")
        for text in (f.mechanism, f"mirrors: {f.mirrors}", f"trigger: {f.trigger}"):
            for line in textwrap.wrap(text, 88):
                print(f"{'':<{w}}         {line}")
    return 0

"""A catalogue of plain-PyTorch programs, each a planted race beside its fixed twin.

A program is one Python file that uses only ``torch`` (no overlapcheck API): run as
``python prog.py`` it plants its race, as ``python prog.py --fixed`` it is the fixed
twin. Its module docstring describes the race (first line) and the fix; module-level
constants say what is expected of it:

* ``KINDS``: the report kinds the planted race may be reported as;
* ``SANITIZER``: whether PyTorch's CUDA sanitizer can see the planted race (two
  kernels on two streams touching one tensor); it must never flag a twin;
* ``BUG``: the public bug it re-creates (``"vLLM #36013"``), or None;
* ``SELFTEST``: the ``overlapcheck selftest`` case it rewrites, or None.

``load(directory)`` reads them without importing torch (the constants are literals).
The project's catalogue is ``tests/watch/programs/``.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

FIXED_FLAG = "--fixed"
_FIELDS = ("KINDS", "SANITIZER", "BUG", "SELFTEST")


@dataclass(frozen=True)
class Program:
    name: str
    path: str
    kinds: Tuple[str, ...]
    sanitizer: bool
    bug: Optional[str]
    selftest: Optional[str]
    description: str

    def variants(self) -> List[Tuple[str, List[str], bool]]:
        """``(label, argv, racy)`` for the planted race and its twin."""
        return [(self.name, [], True), (f"{self.name} --fixed", [FIXED_FLAG], False)]


def read(path: str) -> Program:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    doc = ast.get_docstring(tree) or ""
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in _FIELDS:
            values[node.targets[0].id] = ast.literal_eval(node.value)
    missing = [k for k in _FIELDS if k not in values]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    first = " ".join(doc.split("\n\n")[0].split())
    return Program(os.path.splitext(os.path.basename(path))[0], path,
                   tuple(values["KINDS"]), bool(values["SANITIZER"]), values["BUG"],
                   values["SELFTEST"], first)


def load(directory: str) -> List[Program]:
    """Every program of ``directory``, by name."""
    names = sorted(n for n in os.listdir(directory)
                   if n.endswith(".py") and not n.startswith(("_", ".")))
    return [read(os.path.join(directory, n)) for n in names]

"""Faults: named bugs a target can switch on, off by default, each caught (or not) by
the checker it names. One type, two mechanisms:

* ``Fault`` (``fault.py``): name, what goes wrong, the public bug it re-creates, the
  checker expected to catch it, the trigger a run needs, the mechanism, and any fields
  of the target's own; ``overlapcheck faults [--target NAME] [--json]`` lists them;
* ``GuardedSite`` and ``Guards`` (``guard.py``): an ``if faults.on(NAME):`` in an engine
  written for overlapcheck (the reference engine's bug zoo, ``engine/faults.py``);
* ``SourcePatch`` (``patch.py``): a real engine's function recompiled from its pre-fix
  source, bound to one object or installed for a block (the vLLM and SGLang targets'
  ``faults.py``).

Each target lists its own (``Target.faults()``); nothing in the fuzzer knows a name.
"""
from .fault import Fault
from .guard import GuardedSite, Guards
from .patch import FunctionPatch, PatchMismatch, SourcePatch

__all__ = ["Fault", "GuardedSite", "Guards", "FunctionPatch", "PatchMismatch", "SourcePatch"]

"""Replay a repro and tell three outcomes apart.

* reproduced (exit 1): the run follows the recorded choices and the finding's
  (checker, site) shows again;
* fixed (exit 0): the run follows the recorded choices and that finding is gone;
* diverged (exit 3): the run no longer follows the recorded choices (the engine
  changed under the repro), or the repro was written against another version of its
  target engine than the one installed, so the repro says nothing either way.

A repro without recorded choices (e.g. from a GPU run) is replayed with its schedule
spec on the sim instead.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..protocol.finding import same_bug
from ..run import Outcome, execute
from .format import Repro

REPRODUCED, FIXED, DIVERGED = "reproduced", "fixed", "diverged"
EXIT = {REPRODUCED: 1, FIXED: 0, DIVERGED: 3}


@dataclass
class ReplayResult:
    verdict: str
    outcome: Optional[Outcome]
    digest_match: bool
    detail: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT[self.verdict]


def replay(r: Repro, device: Optional[str] = None) -> ReplayResult:
    """Replay ``r`` (on the sim unless ``device`` says otherwise). A target engine
    that is missing raises ``TargetUnavailable``."""
    from .. import targets
    from ..device import device_info
    target = targets.get(r.case.target)
    installed = target.version()
    if r.engine_version and r.engine_version != installed and r.case.target != "reference":
        return ReplayResult(DIVERGED, None, False,
                            f"the repro was written against {r.case.target} "
                            f"{r.engine_version}; {installed} is installed")
    dev = device or "sim"
    choices = r.choices if (device_info(dev).replayable and r.choices is not None) else None
    out = execute(r.case, choices=choices, device=dev)
    if out.diverged:
        return ReplayResult(DIVERGED, out, False, out.diverged)
    match = next((f for f in out.findings if same_bug(r.finding.key, f.key)), None)
    digest_match = bool(r.digest) and out.digest == r.digest
    if match is not None:
        return ReplayResult(REPRODUCED, out, digest_match, match.text)
    others = ", ".join(sorted({f.checker for f in out.findings}))
    return ReplayResult(FIXED, out, digest_match,
                        f"other findings: {others}" if others else "no findings")


def emit_pytest(r: Repro, repro_path: str) -> str:
    """A regression test that replays the repro file and expects its finding gone."""
    name = "".join(ch if ch.isalnum() else "_" for ch in r.finding.ident)
    return f'''"""Regression test for {r.finding.checker} finding {r.finding.ident}.

{r.finding.text.splitlines()[0] if r.finding.text else ""}
"""
import os

from overlapcheck.repro import load, replay

REPRO = os.path.join(os.path.dirname(__file__), {os.path.basename(repro_path)!r})


def test_{name}_stays_fixed():
    result = replay(load(REPRO))
    assert result.verdict != "diverged", result.detail
    assert result.verdict == "fixed", result.detail
'''

"""The fuzz properties as ordinary Hypothesis tests, for HypoFuzz and pytest alike.

One test per target and config family, derived from the registries: the reference
engine once per draft kind (``test_reference_standalone``, ``test_reference_eagle``,
``test_reference_mtp``, ...), and each other target once (``test_vllm``,
``test_sglang``: skipped where their engine is not installed). A test draws a case of
its target's campaign strategy (``campaign.case_strategy``: config, workload and
schedule together), runs it through the run driver with every checker on, and fails on
a finding, with an exception type of its own per (checker, site) so that Hypothesis
and HypoFuzz keep different bugs apart. Each finding's repro and trace are written
under ``--overlapcheck-repro-dir`` as ``<checker>-<hash of site>.yaml``: named by
(checker, site), so every process and machine that finds the same bug writes the same
file, and a smaller case replaces a larger one (the shrunk example is the one left).

    hypothesis fuzz -n 2 -- overlapcheck/fuzz/properties.py --overlapcheck-fault NAME
    pytest overlapcheck/fuzz/properties.py -k standalone      # Hypothesis' own examples

Options (the pytest plugin's): ``--overlapcheck-fault NAME`` (repeatable) switches a
fault of the bug zoo on, ``--overlapcheck-device``, ``--overlapcheck-repro-dir``, and
``--overlapcheck-db DIR|redis://HOST:PORT[/N]``, which makes the example database the
one every test (and HypoFuzz) uses, shared across a fleet through Redis. The tests set
no database of their own: HypoFuzz fuzzes only tests on the default one. HypoFuzz needs
an example database: where ``CI`` is set, Hypothesis's own CI profile has none, so a CI
job gives one with ``--overlapcheck-db``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .. import targets
from ..protocol.target import TargetUnavailable
from ..run import execute
from .campaign import Options, case_strategy, write_repro

SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


@dataclass
class Properties:
    """What the tests share in a session: the pytest options, the strategies built
    for them, one exception type per (checker, site), the repros written (their size)."""

    faults: Tuple[str, ...] = ()
    device: str = "sim"
    repro_dir: str = ".overlapcheck/repros"
    _strategies: Dict[tuple, object] = field(default_factory=dict)
    _types: Dict[tuple, type] = field(default_factory=dict)
    _written: Dict[str, tuple] = field(default_factory=dict)

    def strategy(self, target: str, family: Optional[str]):
        key = (target, family)
        if key not in self._strategies:
            kinds = None if family is None else (family,)
            self._strategies[key] = case_strategy(Options(target=target, draft_kinds=kinds,
                                                          faults=self.faults))
        return self._strategies[key]

    def exception_for(self, f) -> type:
        """The exception type of finding ``f``'s (checker, site), named by its id (what
        Hypothesis and HypoFuzz show a failure as)."""
        if f.key not in self._types:
            self._types[f.key] = type(f.ident, (AssertionError,), {})
        return self._types[f.key]

    def _keep(self, path: str, size: tuple) -> bool:
        """Is a case of ``size`` smaller than the repro at ``path``?"""
        if path not in self._written and os.path.exists(path):
            from ..repro.format import ReproError, load
            try:
                old = load(path)
                self._written[path] = (len(old.case.workload.requests), old.steps)
            except (ReproError, OSError):
                pass
        return path not in self._written or size < self._written[path]

    def check(self, case) -> None:
        """Run ``case``; on findings write their repros and fail with the first."""
        out = execute(case, device=self.device)
        if not out.findings:
            return
        size = (len(case.workload.requests), out.steps)
        for f in out.findings:
            path = os.path.join(self.repro_dir, f"{f.ident}.yaml")
            if self._keep(path, size):
                first = path not in self._written
                write_repro(self.repro_dir, case, out, f, self.device,
                            targets.get(case.target).version(), note="from a property test")
                self._written[path] = size
                if first:
                    print(f"overlapcheck: finding {f.ident}: {f.text.splitlines()[0]} -> {path}",
                          file=sys.__stderr__, flush=True)
        f = out.findings[0]
        raise self.exception_for(f)(f.text)


@pytest.fixture(scope="session")
def overlapcheck_properties(request) -> Properties:
    opt = request.config.getoption
    return Properties(tuple(opt("--overlapcheck-fault") or ()), opt("--overlapcheck-device"),
                      opt("--overlapcheck-repro-dir"))


def families() -> Sequence[Tuple[str, Optional[str]]]:
    """(target, family) of each test: a target whose case strategy narrows by draft kind
    gets one per kind, the others one."""
    from ..engine.drafts import DRAFT_KINDS
    out = []
    for name in targets.TARGETS:
        if "draft_kinds" in targets.get(name).case_options:
            out += [(name, kind) for kind in DRAFT_KINDS]
        else:
            out.append((name, None))
    return out


def _unavailable(target: str) -> Optional[str]:
    try:
        targets.get(target).version()
    except TargetUnavailable as e:
        return str(e)
    return None


def property_test(target: str, family: Optional[str] = None):
    """The Hypothesis test of one target and family."""

    # not derandomized even under Hypothesis's own CI profile (picked where CI is set):
    # these are fuzz targets, and HypoFuzz does not collect a derandomized test
    @settings(deadline=None, suppress_health_check=SLOW, derandomize=False)
    @given(data=st.data())
    def test(overlapcheck_properties, data):
        case = data.draw(overlapcheck_properties.strategy(target, family), label="case")
        overlapcheck_properties.check(case)

    name = f"test_{target}" + (f"_{family}" if family else "")
    test.__name__ = test.__qualname__ = name
    # one database key per test (the body is the same for all of them)
    test.hypothesis.inner_test._hypothesis_internal_add_digest = name.encode()
    why = _unavailable(target)
    return test if why is None else pytest.mark.skip(reason=why)(test)


for _target, _family in families():
    _test = property_test(_target, _family)
    globals()[_test.__name__] = _test
del _target, _family, _test

"""The catalogue of plain-PyTorch programs under ``overlapcheck watch --device cpu``:
every planted race is reported (as one of the kinds it declares, at the program's
own lines) and every fixed twin is quiet."""
import ast
import logging
import os

import pytest

from overlapcheck.watch import catalogue

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = catalogue.load(os.path.join(HERE, "programs"))
PUBLIC_BUGS = {"vLLM #36013", "vLLM #25279", "vLLM #31841", "vLLM #54269", "SGLang #26380",
               "vLLM #45100"}

CASES = [pytest.param(p, argv, racy, id=label)
         for p in PROGRAMS for label, argv, racy in p.variants()]


@pytest.fixture(autouse=True)
def quiet_log():
    logger = logging.getLogger("overlapcheck.watch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("program, argv, racy", CASES)
def test_program_verdict_on_cpu(program, argv, racy):
    from overlapcheck.watch import run_program
    out = run_program(program.path, argv, device="cpu", mode="log")
    assert out.error is None, out.error
    assert out.status == 0
    reports = out.watch.reports
    if not racy:
        assert reports == [], "\n".join(map(str, reports))
        return
    assert reports, f"{program.name}: planted race not reported"
    assert {r.kind for r in reports} <= set(program.kinds), "\n".join(map(str, reports))
    base = os.path.basename(program.path)
    for r in reports:
        # both accesses are the program's own lines, and the fix names a line of it
        assert r.current["frame"].rsplit(":", 1)[0].endswith(base), r
        assert r.previous["frame"].rsplit(":", 1)[0].endswith(base), r
        assert f"line {r.current['frame'].rsplit(':', 1)[1]} of" in r.missing_edge, r


def test_catalogue_covers_what_the_sanitizer_misses_and_the_public_bugs():
    blind = [p.name for p in PROGRAMS if not p.sanitizer]
    bugs = {p.bug for p in PROGRAMS if p.bug}
    assert len(blind) >= 6, blind
    assert len(bugs & PUBLIC_BUGS) >= 4, bugs
    assert bugs <= PUBLIC_BUGS, bugs - PUBLIC_BUGS


def test_catalogue_rewrites_every_selftest_case():
    from overlapcheck.selftest import catalogue as selftest_catalogue
    planted = {c.name for c in selftest_catalogue().values() if c.expect_race}
    rewritten = {p.selftest for p in PROGRAMS if p.selftest}
    assert rewritten == planted, planted ^ rewritten


def test_programs_use_plain_torch_only():
    for p in PROGRAMS:
        with open(p.path) as f:
            tree = ast.parse(f.read())
        modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                   for a in n.names}
        modules |= {n.module.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module}
        assert modules <= {"sys", "torch"}, (p.name, modules)

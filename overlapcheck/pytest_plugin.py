"""pytest plugin (entry point ``pytest11``): fixtures, markers, options, profiles.

* ``overlapcheck_run(config, workload, schedule=None)``: run one case with every
  checker on; on a finding, write its repro and fail the test with the finding.
* ``overlapcheck_fuzz(config, examples=50)``: fuzz a user-chosen engine config
  (workloads and schedules drawn by Hypothesis); a finding fails the test with its
  shrunk repro written.
* markers ``gpu`` (skipped without CUDA) and ``nightly`` (long runs);
* options ``--overlapcheck-device``, ``--overlapcheck-seed``, ``--overlapcheck-repro-dir``;
* Hypothesis profiles ``ci`` (derandomized; loaded when ``CI`` is set), ``dev`` and
  ``nightly`` (example database on disk); ``HYPOTHESIS_PROFILE`` picks one explicitly.

Imports of torch and the engine happen inside the fixtures, so collecting a test
suite that does not use them costs nothing. Repro names are content-addressed and
written atomically, so the plugin is safe under pytest-xdist.
"""
from __future__ import annotations

import os

import pytest

NIGHTLY_DB = ".overlapcheck/hypothesis-db"


def pytest_addoption(parser):
    g = parser.getgroup("overlapcheck")
    g.addoption("--overlapcheck-device", default="sim", choices=("sim", "cuda"),
                help="device backend for overlapcheck fixtures (default sim)")
    g.addoption("--overlapcheck-seed", type=int, default=0,
                help="seed for overlapcheck fixtures (default 0)")
    g.addoption("--overlapcheck-repro-dir", default=".overlapcheck/repros",
                help="where overlapcheck fixtures write repros of findings")


def _register_profiles():
    from hypothesis import HealthCheck, settings
    from hypothesis.database import DirectoryBasedExampleDatabase
    slow = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                              database=None, suppress_health_check=slow)
    settings.register_profile("dev", deadline=None, max_examples=100)
    settings.register_profile("nightly", deadline=None, max_examples=2000,
                              database=DirectoryBasedExampleDatabase(NIGHTLY_DB),
                              suppress_health_check=slow)
    name = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else None)
    if name:
        settings.load_profile(name)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "nightly: long runs for the nightly tier")
    _register_profiles()


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _write_repro(request, case, out, finding) -> str:
    from .repro.format import Repro, current_commit, save
    folder = request.config.getoption("--overlapcheck-repro-dir")
    path = os.path.join(folder, f"{finding.ident}.yaml")
    save(Repro(case, out.choices, finding, out.digest, steps=out.steps,
               commit=current_commit(), note=f"from {request.node.nodeid}"), path)
    return path


@pytest.fixture
def overlapcheck_run(request):
    """Run ``(config, workload, schedule=None)`` with every checker; fail on a finding."""
    device = request.config.getoption("--overlapcheck-device")
    seed = request.config.getoption("--overlapcheck-seed")

    def run(config, workload, schedule=None, checks=()):
        from .fuzz import Case, ScheduleSpec, run_case
        case = Case(config, workload, schedule or ScheduleSpec("random", seed), tuple(checks),
                    seed=seed)
        out = run_case(case, device=device)
        if out.findings:
            path = _write_repro(request, case, out, out.findings[0])
            pytest.fail(f"{out.findings[0].text}\nrepro: {path}", pytrace=False)
        return out

    return run


@pytest.fixture
def overlapcheck_fuzz(request):
    """Fuzz a user-chosen config: ``overlapcheck_fuzz(config, examples=50)``."""
    seed = request.config.getoption("--overlapcheck-seed")

    def fuzz(config, examples: int = 50, checks=()):
        from hypothesis import HealthCheck, given, settings
        from hypothesis import seed as hseed
        from .fuzz import run_case
        from .fuzz.strategies import cases
        last = {}

        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @hseed(seed)
        @given(cases(checks, config=config))
        def prop(case):
            out = run_case(case)
            if out.findings:
                last["x"] = (case, out, out.findings[0])
                raise AssertionError(out.findings[0].text)

        try:
            prop()
        except AssertionError:
            case, out, finding = last["x"]
            path = _write_repro(request, case, out, finding)
            pytest.fail(f"{finding.text}\nrepro: {path}", pytrace=False)

    return fuzz

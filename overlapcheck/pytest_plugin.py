"""pytest plugin (entry point ``pytest11``): fixtures, markers and options.

* ``overlapcheck_run(config, workload, schedule=None)``: run one case with every
  checker on; on a finding, write its repro and fail the test with the finding.
* ``overlapcheck_fuzz(config, examples=50)``: fuzz a user-chosen engine config
  (workloads and schedules drawn by Hypothesis); a finding fails the test with its
  shrunk repro written.
* ``overlapcheck_watch``: the test body runs under ``overlapcheck.watch.watch``, the
  race detector over the test's own ``torch.cuda`` code (options through the
  ``overlapcheck_watch`` marker: ``device``, ``mode``);
* markers ``gpu`` (skipped without CUDA) and ``nightly`` (long runs);
* options ``--overlapcheck-device``, ``--overlapcheck-seed``, ``--overlapcheck-repro-dir``;
  ``--overlapcheck-fault NAME`` (the fuzz properties, ``overlapcheck/fuzz/properties.py``);
  ``--overlapcheck-db DIR|redis://HOST:PORT[/N]``: the example database of the
  ``overlapcheck_fuzz`` fixture and, through a settings profile built on the current
  one (``overlapcheck-db``, loaded at session start only when the option is given), of
  every Hypothesis test and HypoFuzz; a Redis server is shared by a fleet,
  multiplexed with a local folder (``overlapcheck/fuzz/db.py``).

The plugin is installed wherever overlapcheck is, so it costs nothing where it is not
used: it imports neither Hypothesis nor torch nor the engine until a fixture runs, and
it loads no Hypothesis profile of its own. Its profiles (``overlapcheck.profiles``:
``overlapcheck-ci``, ``-dev``, ``-nightly``) are registered only when
``--hypothesis-profile`` names one of them. Repro names are content-addressed and
written atomically, so the plugin is safe under pytest-xdist.
"""
from __future__ import annotations

import os

import pytest

from .watch.fixture import MARKER_HELP as _WATCH_MARKER
from .watch.fixture import overlapcheck_watch  # noqa: F401 - a fixture of this plugin


def pytest_addoption(parser):
    from .device import DEVICES
    g = parser.getgroup("overlapcheck")
    g.addoption("--overlapcheck-device", default="sim", choices=tuple(DEVICES),
                help="device backend for overlapcheck fixtures (default sim)")
    g.addoption("--overlapcheck-seed", type=int, default=0,
                help="seed for overlapcheck fixtures (default 0)")
    g.addoption("--overlapcheck-repro-dir", default=".overlapcheck/repros",
                help="where overlapcheck fixtures write repros of findings")
    g.addoption("--overlapcheck-fault", action="append", default=[], metavar="NAME",
                help="turn a bug-zoo fault on in the fuzz properties (repeatable)")
    g.addoption("--overlapcheck-db", action="append", default=[],
                metavar="DIR|redis://HOST:PORT[/N]",
                help="Hypothesis example database for overlapcheck_fuzz and every Hypothesis "
                     "test: a folder and/or a Redis server shared by a fleet")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "nightly: long runs for the nightly tier")
    config.addinivalue_line("markers", _WATCH_MARKER)
    from .profiles import PREFIX, register
    try:
        wanted = config.getoption("--hypothesis-profile")
    except ValueError:      # Hypothesis' own plugin is not active
        wanted = None
    if wanted and str(wanted).startswith(PREFIX):
        register()          # before Hypothesis' plugin loads the profile


_DB = pytest.StashKey()    # the database --overlapcheck-db opened


def pytest_sessionstart(session):
    specs = session.config.getoption("--overlapcheck-db", default=None)
    if specs:
        session.config.stash[_DB] = _load_db_profile(specs)


def _load_db_profile(specs):
    """Open the database ``--overlapcheck-db`` names and load a profile that is the
    current one with that database (pytest's one-line usage error when it cannot)."""
    import sys
    from hypothesis import settings
    from .fuzz.db import SharedDatabaseError, open_database, split_specs
    try:
        db = open_database(*split_specs(specs),
                           say=lambda line: print(f"overlapcheck: {line}", file=sys.__stderr__,
                                                  flush=True))
    except (ValueError, SharedDatabaseError) as e:
        raise pytest.UsageError(f"--overlapcheck-db: {e}") from None
    settings.register_profile("overlapcheck-db", parent=settings.default, database=db)
    settings.load_profile("overlapcheck-db")
    return db


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
    from .device import device_info
    from .repro.format import Repro, current_commit, save
    folder = request.config.getoption("--overlapcheck-repro-dir")
    device = request.config.getoption("--overlapcheck-device")
    path = os.path.join(folder, f"{finding.ident}.yaml")
    choices = out.choices if device_info(device).replayable else None
    save(Repro(case, choices, finding, out.digest, device=device, steps=out.steps,
               commit=current_commit(), note=f"from {request.node.nodeid}"), path)
    return path


@pytest.fixture
def overlapcheck_run(request):
    """Run ``(config, workload, schedule=None)`` with every checker; fail on a finding."""
    device = request.config.getoption("--overlapcheck-device")
    seed = request.config.getoption("--overlapcheck-seed")

    def run(config, workload, schedule=None, checks=()):
        from .run import Case, ScheduleSpec, execute
        case = Case(config, workload, schedule or ScheduleSpec("random", seed), tuple(checks))
        out = execute(case, device=device)
        if out.findings:
            path = _write_repro(request, case, out, out.findings[0])
            pytest.fail(f"{out.findings[0].text}\nrepro: {path}", pytrace=False)
        return out

    return run


@pytest.fixture
def overlapcheck_fuzz(request):
    """Fuzz a user-chosen config: ``overlapcheck_fuzz(config, examples=50)``."""
    device = request.config.getoption("--overlapcheck-device")
    seed = request.config.getoption("--overlapcheck-seed")

    def fuzz(config, examples: int = 50, checks=()):
        from hypothesis import HealthCheck, given, settings
        from hypothesis import seed as hseed
        from .run import execute
        from .fuzz.campaign import fixed_constants, no_mutations
        from .fuzz.strategies import cases
        last = {}

        @settings(max_examples=examples, deadline=None,
                  database=request.config.stash.get(_DB, None),
                  suppress_health_check=list(HealthCheck))
        @hseed(seed)
        @given(cases(checks, config=config))
        def prop(case):
            out = execute(case, device=device)
            if out.findings:
                last["x"] = (case, out, out.findings[0])
                raise AssertionError(out.findings[0].text)

        # one database key per test (the body is the same for every test)
        prop.hypothesis.inner_test._hypothesis_internal_add_digest = request.node.nodeid.encode()
        try:
            with fixed_constants(), no_mutations():
                prop()
        except AssertionError:
            case, out, finding = last["x"]
            path = _write_repro(request, case, out, finding)
            pytest.fail(f"{finding.text}\nrepro: {path}", pytrace=False)

    return fuzz

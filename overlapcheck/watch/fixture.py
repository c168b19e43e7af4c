"""The ``overlapcheck_watch`` pytest fixture: a test body run under ``watch``.

    def test_overlap_step(overlapcheck_watch):
        engine.step()          # a race fails the test at the racy line

    @pytest.mark.overlapcheck_watch(device="cpu", mode="log")
    def test_on_the_cpu_shim(overlapcheck_watch):
        engine.step()          # every race is collected; the test fails at teardown

Options come from the ``overlapcheck_watch`` marker (``device``: auto, cpu or cuda;
``mode``: raise or log); the default is ``device="auto"``, ``mode="raise"``. The
fixture yields the active ``Watch`` (its ``reports`` so far). torch is imported when
the fixture runs, not when the module is loaded.
"""
from __future__ import annotations

import pytest

MARKER = "overlapcheck_watch"
MARKER_HELP = (f"{MARKER}(device='auto', mode='raise'): options of the {MARKER} fixture")


@pytest.fixture
def overlapcheck_watch(request):
    """Run the test body under ``overlapcheck.watch.watch``; see the module docstring."""
    from .session import watch

    marker = request.node.get_closest_marker(MARKER)
    options = {"device": "auto", "mode": "raise"}
    if marker is not None:
        options.update(marker.kwargs)
    with watch(**options) as w:
        yield w
    if options["mode"] == "log" and w.reports:
        n = len(w.reports)
        pytest.fail(f"overlapcheck watch found {n} race{'s' if n != 1 else ''}:\n"
                    + "\n".join(map(str, w.reports)), pytrace=False)


def pytest_configure(config):
    """Register the marker when this module is loaded as a plugin (``-p``)."""
    config.addinivalue_line("markers", MARKER_HELP)

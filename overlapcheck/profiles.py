"""Hypothesis settings profiles for overlapcheck runs, all named ``overlapcheck-*`` so
that they never shadow a suite's own profiles; registering them loads none.

* ``overlapcheck-ci``: derandomized, no deadline, no example database (pull requests);
* ``overlapcheck-dev``: 100 examples, no deadline;
* ``overlapcheck-nightly``: 2,000 examples, the example database on disk.

``register()`` registers them (the pytest plugin does so only when
``--hypothesis-profile`` names one of them).
"""
from __future__ import annotations

PREFIX = "overlapcheck-"
NIGHTLY_DB = ".overlapcheck/hypothesis-db"
NAMES = (PREFIX + "ci", PREFIX + "dev", PREFIX + "nightly")


def register() -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.database import DirectoryBasedExampleDatabase
    slow = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile(PREFIX + "ci", derandomize=True, deadline=None, print_blob=True,
                              database=None, suppress_health_check=slow)
    settings.register_profile(PREFIX + "dev", deadline=None, max_examples=100)
    settings.register_profile(PREFIX + "nightly", deadline=None, max_examples=2000,
                              database=DirectoryBasedExampleDatabase(NIGHTLY_DB),
                              suppress_health_check=slow)

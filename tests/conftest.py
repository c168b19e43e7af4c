"""The overlapcheck pytest plugin (installed as an entry point) registers the
markers and Hypothesis profiles; this makes it active when the package is used from
a source checkout without installing, too."""
import importlib.metadata

import pytest

_installed = any(ep.value == "overlapcheck.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["overlapcheck.pytest_plugin"]


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op CPU thread for a module: the small ops of the models cost ~20x more
    on 2 threads here, and the models don't need them. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _no_local_constants() -> None:
    """Hypothesis mixes constants of every local module imported so far into its draws,
    so a derandomized test would draw differently depending on which of the project's
    modules earlier tests happened to import in its xdist worker, and on which test
    files were collected. The tests draw from the strategies alone: the pin a campaign
    holds while it draws (``campaign.fixed_constants``) holds for the whole session."""
    from overlapcheck.fuzz.campaign import fixed_constants
    fixed_constants().__enter__()      # never left: the session ends with it


_no_local_constants()

"""The overlapcheck pytest plugin (installed as an entry point) registers the
markers and Hypothesis profiles; this makes it active when the package is used from
a source checkout without installing, too."""
import importlib.metadata

_installed = any(ep.value == "overlapcheck.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["overlapcheck.pytest_plugin"]

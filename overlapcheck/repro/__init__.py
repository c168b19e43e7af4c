"""Repro files: dump, safe load with validation, exact replay, trace export."""
from .format import Repro, ReproError, load, loads, save

# replaying runs the engine (torch): imported on first use, so that loading and
# validating repros (and the command line's usage errors) stay fast
_LAZY = ("DIVERGED", "FIXED", "REPRODUCED", "emit_pytest", "replay")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        mod = importlib.import_module(".replay", __name__)
        # the submodule import bound the package's ``replay`` to the module: rebind
        # every lazy name to what the package exports
        globals().update({n: getattr(mod, n) for n in _LAZY})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["Repro", "ReproError", "load", "loads", "save", "replay", "emit_pytest",
           "REPRODUCED", "FIXED", "DIVERGED"]

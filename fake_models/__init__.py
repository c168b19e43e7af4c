"""Deterministic fake models for overlapcheck's reference engine."""
from .oracle import OracleModel

__all__ = ["OracleModel", "make_model"]


def make_model(name: str, **kw):
    """A model by name (``oracle``; the tiny transformer comes later)."""
    if name == "oracle":
        return OracleModel(**kw)
    raise ValueError(f"unknown model {name!r} (choose from oracle)")

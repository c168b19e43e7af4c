"""Small text helpers for violation messages."""
from __future__ import annotations

from typing import Iterable


def span(values: Iterable[int], limit: int = 12) -> str:
    """Sorted ints as ranges: ``[1, 2, 3, 7]`` -> ``"1-3,7"`` (long lists abbreviated)."""
    vals = sorted(set(values))
    parts, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        parts.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    if len(parts) > limit:
        return ",".join(parts[:limit]) + f",... ({len(vals)} in all)"
    return ",".join(parts)

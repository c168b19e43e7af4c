"""Reversible attribute patches.

``watch`` gives some ``torch`` and ``torch.Tensor`` attributes a watched meaning for
the duration of the context. Every change goes through one ``Patcher``, which
remembers what was there (or that nothing was, for a method inherited from a C base
class) and puts it back, in reverse order, on ``restore``.
"""
from __future__ import annotations

from typing import Any, List, Tuple

_ABSENT = object()


class Patcher:
    def __init__(self) -> None:
        self._saved: List[Tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` by ``value``; returns what ``owner.name`` resolved to
        before (inherited attributes included), for the replacement to call."""
        before = getattr(owner, name)
        own = owner.__dict__.get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
        self._saved.append((owner, name, own))
        setattr(owner, name, value)
        return before

    def restore(self) -> None:
        """Undo every ``set``, last first. Safe to call twice."""
        while self._saved:
            owner, name, own = self._saved.pop()
            if own is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, own)

    def __len__(self) -> int:
        return len(self._saved)

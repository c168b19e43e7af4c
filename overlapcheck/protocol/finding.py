"""A finding: a violated invariant, named by (checker, site). Plain data, no torch, so
that repro files load and validate without the engine."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Collection, Tuple

ENGINE_EXCEPTION = "engine-exception"
# an engine exception's site of the first form: (type, "file.py:line")
_LINE_SITE = re.compile(r"(.+\.py):\d+")


def same_bug(recorded: Tuple[str, ...], key: Tuple[str, ...]) -> bool:
    """Does a finding of ``key`` stand for the recorded one? Equal keys do; an engine
    exception named the first way, by the file and *line* of its frame, is the same
    exception type raised in a function of that file (sites now name the function,
    which an edit elsewhere in the file does not move); and lifecycle's
    ``stop-not-cut`` and parity's ``length`` recorded before their sites named how the
    request ended stand for each ending."""
    if recorded == key:
        return True
    if recorded in (("lifecycle", "stop-not-cut"), ("parity", "length")) and key[:2] == recorded:
        return True     # recorded before the site named how the request ended
    if (len(recorded) != 3 or len(key) != 3 or recorded[0] != ENGINE_EXCEPTION
            or key[0] != ENGINE_EXCEPTION or recorded[1] != key[1]):
        return False
    m = _LINE_SITE.fullmatch(recorded[2])
    return m is not None and key[2].startswith(m.group(1) + ":")


def is_known(key: Tuple[str, ...], known: Collection[Tuple[str, ...]]) -> bool:
    """``key`` is one of ``known``, or the same bug as one of them (``same_bug``)."""
    return key in known or (key[0] == ENGINE_EXCEPTION and any(same_bug(k, key) for k in known))


@dataclass(frozen=True)
class Finding:
    checker: str
    site: Tuple[str, ...]
    step: int
    text: str
    data: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> Tuple[str, ...]:
        return (self.checker,) + tuple(self.site)

    @property
    def ident(self) -> str:
        """A short stable id of the bug (checker and site)."""
        h = hashlib.sha256(json.dumps(list(self.key)).encode()).hexdigest()[:10]
        return f"{self.checker}-{h}"

    def to_dict(self) -> dict:
        return {"checker": self.checker, "site": list(self.site), "step": self.step,
                "text": self.text, "data": self.data}

    @staticmethod
    def from_dict(d: dict) -> "Finding":
        return Finding(str(d["checker"]), tuple(map(str, d["site"])), int(d["step"]),
                       str(d["text"]), dict(d.get("data") or {}))

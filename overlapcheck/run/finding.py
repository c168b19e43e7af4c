"""A finding: a violated invariant, named by (checker, site). Plain data, no torch, so
that repro files load and validate without the engine."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Tuple

ENGINE_EXCEPTION = "engine-exception"


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

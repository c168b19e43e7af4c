"""What a run returns: per-request records and a summary, derived from them."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class RequestResult:
    rid: int
    tokens: Tuple[int, ...]
    finish_reason: str
    accept_lens: Tuple[int, ...]
    retractions: int


@dataclass(frozen=True)
class Summary:
    steps: int
    batches: int
    tokens: int
    verifies: int
    mean_accept_length: float
    finished: int
    aborts: int
    retractions: int
    host_syncs: int
    declared_syncs: int
    races: int


@dataclass(frozen=True)
class RunResult:
    requests: Dict[int, RequestResult]
    summary: Summary

    def to_json(self) -> dict:
        return {"requests": [_fields(self.requests[rid]) for rid in sorted(self.requests)],
                "summary": _fields(self.summary)}

    def text(self) -> str:
        """Per request its finish, tokens and accept lengths, then the summary (what
        ``overlapcheck run`` prints)."""
        lines = [f"request {rid}: {r.finish_reason}, {len(r.tokens)} tokens "
                 f"[{' '.join(map(str, r.tokens))}], accept lengths "
                 f"[{' '.join(map(str, r.accept_lens))}]"
                 + (f", retracted {r.retractions}x" if r.retractions else "")
                 for rid, r in sorted(self.requests.items())]
        s = self.summary
        lines.append(f"summary: steps {s.steps}, batches {s.batches}, tokens {s.tokens}, "
                     f"verifies {s.verifies}, mean accept length {s.mean_accept_length}, "
                     f"finished {s.finished}, aborts {s.aborts}, retractions {s.retractions}, "
                     f"host syncs {s.host_syncs} (declared {s.declared_syncs}), races {s.races}")
        return "\n".join(lines)


_ATOMS = (int, str, float, bool, type(None))


def _fields(record) -> dict:
    """``asdict(record)`` of a flat record: its fields in order, each an atom or a tuple
    of atoms (``asdict`` would rebuild each tuple value by value, the same values); any
    other record goes through ``asdict``. The digest of every run reads this (in a
    campaign ``asdict`` was about 0.5% of the CPU)."""
    d = dict(record.__dict__)
    for v in d.values():
        t = type(v)
        if t is tuple:
            for x in v:
                if type(x) not in _ATOMS:
                    return asdict(record)
        elif t not in _ATOMS:
            return asdict(record)
    return d


def summarize(requests: Dict[int, RequestResult], steps: int, batches: int, syncs: int,
              declared: int, races: int) -> Summary:
    accs = [a for r in requests.values() for a in r.accept_lens]
    return Summary(
        steps=steps, batches=batches,
        tokens=sum(len(r.tokens) for r in requests.values()),
        verifies=len(accs),
        mean_accept_length=round(sum(accs) / len(accs), 4) if accs else 0.0,
        finished=sum(r.finish_reason not in ("abort",) for r in requests.values()),
        aborts=sum(r.finish_reason == "abort" for r in requests.values()),
        retractions=sum(r.retractions for r in requests.values()),
        host_syncs=syncs, declared_syncs=declared, races=races)

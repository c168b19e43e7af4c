"""The leak report of a run log: the kv-accounting checker replayed over the logged
events, and the pool occupancy per step.

``analyze(log)`` returns a ``LeakReport``: each leak with its request, purpose,
allocating step, slots, pages, the step at which it became certain and why; the
other kv-accounting violations; and the timeline (step, free, owned, pending, total,
cached). With the prefix cache (docs/design.md §4.13) cached slots are not a leak; a
prefix lock kept past its request's end, or a cached slot still locked at idle, is
(purpose ``prefix-lock``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

from overlapcheck.protocol import events as E

from .kv_accounting import KVAccounting
from .runlog import Log
from .text import span

BAR = 50


@dataclass
class LeakReport:
    leaks: List[dict]
    other: List[str]
    timeline: List[Tuple[int, int, int, int, int, int]] = field(default_factory=list)
    status: str = "?"

    def to_json(self) -> dict:
        return {"leaks": self.leaks, "leaked_slots": sum(len(x["slots"]) for x in self.leaks),
                "other_violations": self.other, "status": self.status,
                "timeline": [{"step": s, "free": f, "owned": o, "pending": p, "total": t,
                              "cached": c} for s, f, o, p, t, c in self.timeline]}

    def text(self, rows: int = 40) -> str:
        out = []
        if not self.leaks:
            out.append("no leaks")
        else:
            n = sum(len(x["slots"]) for x in self.leaks)
            out.append(f"{len(self.leaks)} leak(s), {n} slot(s):")
            for x in self.leaks:
                if x["purpose"] == "prefix-lock":
                    who = (f"request {x['rid']}: lock on" if x["rid"] >= 0
                           else "no live request:")
                    out.append(f"  {who} {len(x['slots'])} cached slot(s) never released, "
                               f"certain at step {x['certain_step']} ({x['cause']}); slots "
                               f"{span(x['slots'])}, pages {span(x['pages'])}")
                    continue
                out.append(f"  request {x['rid']}: {len(x['slots'])} {x['purpose']} slot(s) "
                           f"allocated at step {x['alloc_step']}, certain at step "
                           f"{x['certain_step']} ({x['cause']}); slots {span(x['slots'])}, "
                           f"pages {span(x['pages'])}")
        for o in self.other:
            out.append(f"  also: {o}")
        out += self._timeline(rows)
        return "\n".join(out)

    def _timeline(self, rows: int) -> List[str]:
        if not self.timeline:
            return ["(no steps logged)"]
        every = max(1, -(-len(self.timeline) // rows))
        cache = any(r[5] for r in self.timeline)
        cached_key = "'=' cached, " if cache else ""
        out = [f"pool occupancy ('#' owned, '+' pending-free, {cached_key}'.' free; "
               f"one row per {every} step(s)):"]
        for i in range(0, len(self.timeline), every):
            s, free, owned, pend, total, cached = max(self.timeline[i:i + every],
                                                      key=lambda r: r[2] + r[3])
            o = round(BAR * owned / total) if total else 0
            p = round(BAR * pend / total) if total else 0
            c = round(BAR * cached / total) if total else 0
            out.append(f"  step {s:6d} |{'#' * o}{'+' * p}{'=' * c}{'.' * max(0, BAR - o - p - c)}| "
                       f"owned {owned} pending {pend} free {free}"
                       + (f" cached {cached}" if cache else ""))
        return out


def analyze(log: Log) -> LeakReport:
    chk = KVAccounting()
    found, timeline = [], []
    for ev in log.events:
        found += chk.feed(ev)
        if isinstance(ev, E.StepEnd):
            s = ev.snapshot
            timeline.append((ev.iteration, s.free, s.owned, s.pending, s.total, s.cached))
    found += chk.finish()
    leaks = [dict(v.details) for v in found if v.details.get("kind") == "leak"]
    other = [str(v).replace("\n", ";") for v in found if v.details.get("kind") != "leak"]
    status = (log.end or {}).get("status", "incomplete")
    return LeakReport(leaks, other, timeline, status)


def plot(report: LeakReport, path: str) -> None:
    """Occupancy over steps as a PNG (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r[0] for r in report.timeline]
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.stackplot(steps, [r[2] for r in report.timeline], [r[3] for r in report.timeline],
                 [r[5] for r in report.timeline], labels=["owned", "pending-free", "cached"])
    for x in report.leaks:
        ax.axvline(x["certain_step"], color="red", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("KV slots")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

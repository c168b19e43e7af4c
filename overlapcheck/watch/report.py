"""Race reports of ``watch``: both accesses at the user's lines, and the missing edge.

A ``WatchReport`` wraps the detector's ``RaceReport`` with what a user of plain
PyTorch needs: which tensor (its shape and where it was allocated), which streams
by the names the user's code gives them, and the synchronization that would order
the two accesses, phrased as a line to add ("add `copy_done.synchronize()` before
line 25 of step.py"). The names come from the frame that issued the later access:
its local variables, its module's globals and the attributes of its ``self``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..race import HOST, RaceReport
from ..race import report as R

_VERB = {True: "writes", False: "reads"}
CHECKER = "watch"


def _stream_handle(v) -> Optional[int]:
    if getattr(type(v), "wait_stream", None) is None:
        return None
    h = getattr(v, "cuda_stream", None)
    return h if isinstance(h, int) else None


def _event_handle(v) -> Optional[int]:
    t = type(v)
    if getattr(t, "synchronize", None) is None or getattr(t, "record", None) is None:
        return None
    h = getattr(v, "cuda_event", None)
    return h if isinstance(h, int) and h else None


def names_in_frame(frame) -> Dict[Tuple[str, int], str]:
    """``("stream" | "event", handle) -> variable name`` for the streams and events
    the user's frame can see."""
    out: Dict[Tuple[str, int], str] = {}
    if frame is None:
        return out

    def look(name: str, v) -> None:
        if isinstance(v, (int, float, str, bytes, type(None))):
            return
        h = _stream_handle(v)
        if h is not None:
            out.setdefault(("stream", h), name)
            return
        h = _event_handle(v)
        if h is not None:
            out.setdefault(("event", h), name)

    local = frame.f_locals
    for scope in (local, frame.f_globals):
        for k, v in list(scope.items()):
            look(k, v)
    obj = local.get("self")
    if obj is not None and hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            look(f"self.{k}", v)
    return out


@dataclass
class WatchReport:
    """One race: two accesses to the same memory that nothing orders."""

    race: RaceReport
    memory: str                # which tensor
    rows: str                  # which part of it both accesses touch
    current: Dict[str, object]
    previous: Dict[str, object]
    missing_edge: str
    count: int = 1
    notes: List[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.race.kind

    @property
    def key(self) -> tuple:
        """Identity for deduplication: the kind and the two lines."""
        return (self.kind, self.current["frame"], self.previous["frame"])

    def finding(self):
        """This race as a finding of checker ``watch`` with site (kind, the two lines):
        the id, deduplication and JSON form every other finding has, so a CI job can
        track watch races beside fuzz findings (docs/design.md §9.2)."""
        from ..protocol.finding import Finding
        return Finding(CHECKER, self.key, 0, str(self), self.to_json())

    @property
    def ident(self) -> str:
        from ..protocol.finding import Finding
        return Finding(CHECKER, self.key, 0, "").ident

    def __str__(self) -> str:
        lines = [f"race ({self.kind}) on {self.memory} ({self.rows}) [{self.ident}]:"]
        for tag, a in (("now: ", self.current), ("prev:", self.previous)):
            lines.append(f"  {tag} {a['context']} {_VERB[bool(a['write'])]} it in "
                         f"'{a['op']}' at {a['frame']}")
            stack = list(a["stack"])[1:]
            if stack:
                lines.append("        called from " + " <- ".join(stack))
        lines.append(f"  missing edge: {self.missing_edge}")
        if self.count > 1:
            lines.append(f"  (seen {self.count} times)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"id": self.ident, "kind": self.kind, "memory": self.memory, "rows": self.rows,
                "current": dict(self.current, stack=list(self.current["stack"])),
                "previous": dict(self.previous, stack=list(self.previous["stack"])),
                "missing_edge": self.missing_edge, "count": self.count}


def _line(site: str) -> str:
    return site.rsplit(":", 1)[-1] if ":" in site else "?"


def _file(site: str) -> str:
    return site.rsplit(":", 1)[0] if ":" in site else site


class Explainer:
    """Builds ``WatchReport`` objects from detector reports, with the tracker's
    knowledge of streams, events and memory."""

    def __init__(self, tracker):
        self.tr = tracker

    def _stream(self, ctx: int, names) -> Tuple[str, str, str]:
        """How the report names context ``ctx`` (at length and briefly), and how code
        would name it."""
        if ctx == HOST:
            return "the host", "the host", "the host"
        h = self.tr.handle_of(ctx)
        var = names.get(("stream", h))
        desc = self.tr.stream_name(ctx)
        if var:
            return f"stream `{var}` ({desc})", f"`{var}`", var
        if h == 0:
            return "the default stream", "the default stream", "torch.cuda.default_stream()"
        return f"the {desc}", f"the {desc}", f"<the {desc}>"

    def _covering_event(self, prev, names) -> Optional[str]:
        """The name of an event whose latest record comes after the previous access on
        its stream (waiting for it orders that access)."""
        for (h, _gen), snap in self.tr.det.events.items():
            var = names.get(("event", h))
            if var and self.tr.event_id(h) == (h, _gen) and (
                    prev.ctx < len(snap) and snap[prev.ctx] >= prev.epoch):
                return var
        return None

    def explain(self, rep: RaceReport, unit, frame) -> WatchReport:
        names = names_in_frame(frame)
        cur, prev = rep.current, rep.previous
        cur_desc, _, cur_code = self._stream(cur.ctx, names)
        prev_desc, prev_short, prev_code = self._stream(prev.ctx, names)
        where = f"line {_line(cur.op.frame)} of {_file(cur.op.frame)}"
        after = f"line {_line(prev.op.frame)}"
        event = self._covering_event(prev, names)
        if cur.ctx == HOST:
            if event:
                fix = (f"add `{event}.synchronize()` before {where} (`{event}` is recorded "
                       f"after {prev_short}'s access at {after})")
            else:
                fix = (f"add `{prev_code}.synchronize()` before {where}, or record an event "
                       f"on {prev_short} after {after} and synchronize it there")
        elif prev.ctx == HOST:
            fix = f"make the host's access at {after} happen before {where} is enqueued"
        elif event:
            fix = (f"add `{cur_code}.wait_event({event})` before {where} (`{event}` is "
                   f"recorded after {prev_short}'s access at {after}), or "
                   f"`{cur_code}.wait_stream({prev_code})`")
        else:
            fix = f"add `{cur_code}.wait_stream({prev_code})` before {where}"
        memory = unit.describe()
        if rep.kind == R.REUSE:
            freed = unit.prev_free_site or "?"
            memory += (f"; the same block belonged to the {unit.prev_describe or 'tensor'} "
                       f"freed at {freed}")
            fix = (f"the previous owner was freed at {freed} while {prev_short} could still "
                   f"use it: call `.record_stream({prev_code})` on it before that line, or "
                   + fix)

        def acc(a, desc, code) -> Dict[str, object]:
            stack = self.tr.frames.format(getattr(a.op, "stack", ())) or (a.op.frame,)
            return {"context": desc, "stream": None if a.ctx == HOST else code,
                    "op": a.op.name, "frame": a.op.frame, "stack": stack,
                    "write": a.write, "copy": a.op.is_copy}

        return WatchReport(rep, memory, unit.row_text(rep.rows),
                           acc(cur, cur_desc, cur_code), acc(prev, prev_desc, prev_code), fix)

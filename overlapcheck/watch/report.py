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
_SHOWN = 4  # kinds of tensors a report lists when one race was seen on several


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

    for name, v in _visible(frame):
        look(name, v)
    return out


def _visible(frame):
    """``(name, value)`` of what ``frame`` can see: its locals, its module's globals and
    the attributes of its ``self``."""
    local = frame.f_locals
    for scope in (local, frame.f_globals):
        yield from list(scope.items())
    obj = local.get("self")
    if obj is not None and hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            yield f"self.{k}", v


def holder(frame, view) -> Optional[Tuple[str, object]]:
    """``(name, tensor)``: a variable of ``frame`` holding the whole of the storage that
    ``view`` looks at — the tensor as the user's code knows it (a [5, 2] view of a flat
    allocation, not the allocation) — or None."""
    if frame is None or view is None:
        return None
    import torch  # a report exists only inside a watch, where torch is loaded
    storage = view.untyped_storage()
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    for name, v in _visible(frame):
        if (isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_meta
                and v.storage_offset() == 0 and v.is_contiguous()
                and v.numel() * v.element_size() == nbytes
                and v.untyped_storage().data_ptr() == ptr):
            return name, v
    return None


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
    tensor: tuple = ()          # which tensor: its memory and owner, as the tracker knows them
    variable: Optional[str] = None  # the name the later access's frame holds it by
    # the distinct tensors this race was seen on: description -> how many
    memories: Dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._tensors = {self.tensor}
        self.memories = self.memories or {self.memory: 1}

    @property
    def tensors(self) -> int:
        """On how many distinct tensors the race was seen."""
        return len(self._tensors)

    def seen(self) -> str:
        """How often, and on which tensors, the race was seen ("seen 3 times, on 2
        tensors: ...")."""
        text = f"seen {self.count} time{'s' if self.count != 1 else ''}"
        if self.tensors == 1:
            return text
        kinds = list(self.memories.items())
        shown = ", ".join(f"{n} x {m}" for m, n in kinds[:_SHOWN])
        more = f", {len(kinds) - _SHOWN} more kinds" if len(kinds) > _SHOWN else ""
        return f"{text}, on {self.tensors} tensors: {shown}{more}"

    def merge(self, other: "WatchReport") -> None:
        """``other`` is this race (the same kind and lines) seen again, maybe on another
        tensor."""
        self.count += 1
        if other.tensor not in self._tensors:
            self._tensors.add(other.tensor)
            self.memories[other.memory] = self.memories.get(other.memory, 0) + 1

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
        on = self.memory if self.variable is None else f"`{self.variable}`, {self.memory}"
        if self.tensors > 1:
            on = f"{self.tensors} tensors, the first {on}"
        lines = [f"race ({self.kind}) on {on} ({self.rows}) [{self.ident}]:"]
        for tag, a in (("now: ", self.current), ("prev:", self.previous)):
            lines.append(f"  {tag} {a['context']} {_VERB[bool(a['write'])]} it in "
                         f"'{a['op']}' at {a['frame']}")
            stack = list(a["stack"])[1:]
            if stack:
                lines.append("        called from " + " <- ".join(stack))
        lines.append(f"  missing edge: {self.missing_edge}")
        if self.count > 1:
            lines.append(f"  ({self.seen()})")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"id": self.ident, "kind": self.kind, "memory": self.memory,
                "variable": self.variable, "rows": self.rows,
                "current": dict(self.current, stack=list(self.current["stack"])),
                "previous": dict(self.previous, stack=list(self.previous["stack"])),
                "missing_edge": self.missing_edge, "count": self.count,
                "tensors": self.tensors,
                "memories": [{"memory": m, "tensors": n} for m, n in self.memories.items()]}


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
        code = self.tr.stream_code.get(h)
        return f"the {desc}", f"the {desc}", code or f"<the {desc}>"

    def _covering_event(self, prev, names) -> Optional[str]:
        """The name of an event whose latest record comes after the previous access on
        its stream (waiting for it orders that access)."""
        for (h, _gen), snap in self.tr.det.events.items():
            var = names.get(("event", h))
            if var and self.tr.event_id(h) == (h, _gen) and (
                    prev.ctx < len(snap) and snap[prev.ctx] >= prev.epoch):
                return var
        return None

    def explain(self, rep: RaceReport, unit, frame, view=None) -> WatchReport:
        """``frame``: the user's frame of the later access; ``view``: the tensor it used."""
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
        held = holder(frame, view)
        variable = None
        if held is not None:
            variable, t = held
            shape, nbytes = tuple(t.shape), t.numel() * t.element_size()
            memory, rows = unit.describe(shape), unit.row_text(rep.rows, shape, nbytes)
        else:
            memory, rows = unit.describe(), unit.row_text(rep.rows)
        if rep.kind == R.REUSE:
            freed = unit.prev_free_site or "?"
            memory += (f"; the same block belonged to the {unit.prev_describe or 'tensor'} "
                       f"freed at {freed}")
            why = f"the previous owner was freed at {freed} while {prev_short} could still use it: "
            if unit.device and prev.ctx != HOST:
                # where the stream used it the tensor is in scope (the free may be a
                # caller's line, where it is not)
                why += (f"call `.record_stream({prev_code})` on it after line "
                        f"{_line(prev.op.frame)} of {_file(prev.op.frame)}, where {prev_short} "
                        f"uses it, or ")
            fix = why + fix

        notes = []
        if getattr(prev.op, "after_wait", False):
            notes.append(f"the host waited inside '{prev.op.name}' at {after} only until it "
                         f"knew the size of the result: the kernels that access this memory "
                         f"are queued on {prev_short} after that wait")

        def acc(a, desc, code) -> Dict[str, object]:
            stack = self.tr.frames.format(getattr(a.op, "stack", ())) or (a.op.frame,)
            return {"context": desc, "stream": None if a.ctx == HOST else code,
                    "op": a.op.name, "frame": a.op.frame, "stack": stack,
                    "write": a.write, "copy": a.op.is_copy,
                    "after_wait": getattr(a.op, "after_wait", False)}

        return WatchReport(rep, memory, rows,
                           acc(cur, cur_desc, cur_code), acc(prev, prev_desc, prev_code), fix,
                           notes=notes, tensor=(unit.mem, unit.serial), variable=variable)

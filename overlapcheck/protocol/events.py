"""The observation API every target speaks: typed events and per-step snapshots.

A target calls ONE optional observer, ``observer(event)``, with these frozen events.
Every event carries ``iteration`` (the host step) and ``batch`` (the batch it
concerns: the one being built, launched or processed; -1 when none). Checkers consume
them and never reach into the engine. A target may add events of its own (subclasses
of ``Event`` in its package); checkers that do not know them ignore them.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from .canary import canary_fields
from .types import BatchId, RequestId, RequestSpec, Step

@dataclass(frozen=True)
class Event:
    iteration: Step
    batch: BatchId


@dataclass(frozen=True)
class Arrived(Event):
    """A request arrived; ``spec`` is its prompt, limits and stop ids."""

    rid: RequestId
    spec: Optional[RequestSpec] = None


@dataclass(frozen=True)
class Scheduled(Event):
    """A batch was built: ``kind`` prefill/decode; ``rids`` in batch order."""

    kind: str
    rids: Tuple[RequestId, ...]


@dataclass(frozen=True)
class Allocated(Event):
    """``rid`` got KV ``slots`` (page aligned) for ``purpose``; ``row``: its request row."""

    rid: RequestId
    purpose: str
    slots: Tuple[int, ...]
    row: int


@dataclass(frozen=True)
class Freed(Event):
    """``rid``'s slots left it: ``pending`` until batch ``until`` is processed, else free
    now. ``reason``: finish, abort or retract."""

    rid: RequestId
    slots: Tuple[int, ...]
    reason: str
    pending: bool
    until: Optional[BatchId]


@dataclass(frozen=True)
class PendingReleased(Event):
    """Pending-free slots went back to the free list after ``batch`` was processed."""

    slots: Tuple[int, ...]


@dataclass(frozen=True)
class PrefixLocked(Event):
    """Prefix cache (docs/design.md §4.13): admitted request ``rid`` reuses the cached
    ``slots`` of its matched prefix (positions 0..len-1) and holds one lock on them."""

    rid: RequestId
    slots: Tuple[int, ...]


@dataclass(frozen=True)
class PrefixReleased(Event):
    """``rid`` released its lock on the cached ``slots`` of its matched prefix; ``until``:
    the newest batch that may still read them (they are not evicted before it is
    processed), or None."""

    rid: RequestId
    slots: Tuple[int, ...]
    until: Optional[BatchId]


@dataclass(frozen=True)
class Cached(Event):
    """Finished request ``rid``'s ``slots`` went to the prefix cache: the tree owns them."""

    rid: RequestId
    slots: Tuple[int, ...]


@dataclass(frozen=True)
class Evicted(Event):
    """Unlocked cached ``slots`` left the prefix cache: ``pending`` until batch ``until``
    (the newest that may read them) is processed, else free now."""

    slots: Tuple[int, ...]
    pending: bool
    until: Optional[BatchId]


@dataclass(frozen=True)
class RowAssigned(Event):
    rid: RequestId
    row: int


@dataclass(frozen=True)
class RowReleased(Event):
    rid: RequestId
    row: int


@dataclass(frozen=True)
class Launched(Event):
    """A batch's device work was enqueued (``ops``: launch names in issue order)."""

    kind: str
    ops: Tuple[str, ...]


@dataclass(frozen=True)
class Prefilled(Event):
    """A prefill result was processed: ``token`` is the first output token (or -1 when
    the chunk did not sample); ``dropped``: the request had left the batch's state."""

    rid: RequestId
    token: int
    dropped: bool


@dataclass(frozen=True)
class Verified(Event):
    """A decode result of ``rid`` was processed. ``index``: the request's own verify
    count (0-based) when kept; ``accept_len`` as the device computed it; ``tokens``:
    the tokens appended (cut at a stop token or the length limit); ``dropped``: the
    result rode a batch after the request finished, aborted or was retracted."""

    rid: RequestId
    index: int
    accept_len: int
    tokens: Tuple[int, ...]
    dropped: bool


@dataclass(frozen=True)
class Finished(Event):
    rid: RequestId
    reason: str
    tokens: Tuple[int, ...]


@dataclass(frozen=True)
class Aborted(Event):
    rid: RequestId
    tokens: Tuple[int, ...]


@dataclass(frozen=True)
class Retracted(Event):
    rid: RequestId
    committed: int


@dataclass(frozen=True)
class Canary(Event):
    """What a forward of ``batch`` found in the KV slots it read for ``rid``, copied back
    with the batch's results (no extra sync): ``read_len`` positions 0..read_len-1 were
    read; ``bad`` of them held a slot tagged with another (request, position); the
    first such is ``slot`` at ``position``, holding ``found`` = (token, position,
    request); ``digest`` = ``digest.token_digest`` of the tokens found. Emitted right after
    the entry's ``Prefilled``/``Verified``."""

    rid: RequestId
    read_len: int
    bad: int
    slot: int
    position: int
    found: Tuple[int, ...]
    digest: int
    # with the KV backup, a decode's check of the host pool (``engine/backup_check.py``):
    # (span start, span end, mismatching positions, first one, and the (token, position,
    # request) the host pool held there); empty otherwise
    backup: Tuple[int, ...] = ()
    # with a draft kind that keeps tagged KV (EAGLE, standalone), the same check of the
    # draft KV's kept rows (``canary.draft_canary``): (read length, mismatching rows,
    # first slot, its position, (token, position, request) found there, token digest,
    # token shift); empty otherwise
    draft: Tuple[int, ...] = ()


@dataclass(frozen=True)
class VerifiedBatch(Event):
    """Consecutive decode results of one batch, with their canary records, in one event
    (docs/design.md §5.4): exactly the ``Verified`` events, each followed by its
    ``Canary`` when ``records`` is not empty, that ``events()`` gives, in that order.
    The engine sends it only to an observer with ``batched = True`` (the monitor, whose
    checkers may take the whole run in one handler, ``on_VerifiedBatch``); any other
    observer gets the per-request events. Columns, one item per entry: ``rids``,
    ``index``, ``accept_len``, ``tokens``, ``dropped`` as in ``Verified``; ``records``:
    the canary records (``protocol/canary.py``'s columns) or empty; ``backup``: the records
    carry the KV backup's check."""

    rids: Tuple[RequestId, ...]
    index: Tuple[int, ...]
    accept_len: Tuple[int, ...]
    tokens: Tuple[Tuple[int, ...], ...]
    dropped: Tuple[bool, ...]
    records: Tuple[Sequence[int], ...] = ()
    backup: bool = False
    draft: bool = False      # the records carry the draft KV's check

    def verified(self, i: int) -> Verified:
        """Entry ``i``'s ``Verified`` event."""
        return Verified(self.iteration, self.batch, self.rids[i], self.index[i],
                        self.accept_len[i], self.tokens[i], self.dropped[i])

    def canary(self, i: int) -> Canary:
        """Entry ``i``'s ``Canary`` event (``records`` not empty)."""
        return Canary(self.iteration, self.batch, self.rids[i],
                      *canary_fields(self.records[i], self.backup, self.draft))

    def position(self, i: int, canary: bool = False) -> int:
        """Where entry ``i``'s ``Verified`` (or, ``canary``, its ``Canary``) is in
        ``events()``: a handler of the run tags each violation with it."""
        return 2 * i + canary if self.records else i

    def events(self) -> list:
        """The per-request events this one stands for, in the order the engine would
        have sent them (built once: every checker that expands it shares them)."""
        out = self.__dict__.get("_events")
        if out is None:
            out = []
            for i in range(len(self.rids)):
                out.append(self.verified(i))
                if self.records:
                    out.append(self.canary(i))
            self.__dict__["_events"] = out
        return out


@dataclass(frozen=True)
class RaceFound(Event):
    """The runtime's race detector reported ``report`` (a ``RaceReport``) during this
    step; emitted before the step's ``StepEnd``."""

    report: object


@dataclass(frozen=True)
class Stalled(Event):
    """The run cannot go on: ``kind`` "wait" (a host wait that can never complete,
    ``detail`` names it) or "steps" (the engine's step bound ran out)."""

    kind: str
    detail: str


@dataclass(frozen=True)
class RankBatch(Event):
    """Tensor parallel: ``rank``'s scheduling decision this step, emitted for every rank
    (rank 0 first) before any rank processes a result. ``batch`` is the batch the rank
    launched (-1, ``kind`` "none" and no ``rids`` when it launched none); ``overlap``:
    whether the rank keeps it in flight while processing the previous result."""

    rank: int
    kind: str
    rids: Tuple[RequestId, ...]
    overlap: bool


@dataclass(frozen=True)
class HostQueue(Event):
    """The forward thread's handoffs (docs/design.md §4.14): ``thread`` (scheduler or
    forward) did ``op`` (put or get) on ``queue`` (input: batches to launch; output:
    launched batches' results); ``seq`` numbers the queue's items, a get taking the
    item of the put with the same number. ``batch``: the batch the item carries."""

    thread: str
    queue: str
    op: str
    seq: int


@dataclass(frozen=True)
class HostAccess(Event):
    """With the forward thread, ``thread`` read or wrote (``write``) ``field`` of a host
    object both threads can reach: ``obj`` is ("request", rid) or ("batch", bid)."""

    thread: str
    obj: Tuple[str, int]
    field: str
    write: bool


@dataclass(frozen=True)
class RunEnd(Event):
    """The workload is done; ``result`` is the ``RunResult`` the run returns."""

    result: object


class LazyTuple(Sequence):
    """A snapshot field computed when first read: it reads and compares as the tuple
    ``make()`` returns (pickled as that tuple). The engine hands out fields whose
    size is the pool's or the run's this way, so that a step costs what changed in
    it (docs/design.md §5.1); where the state they describe changes later, the engine
    computes them before the change (``memory.KVPool.view``)."""

    __slots__ = ("_make", "_value", "_len", "__weakref__")

    def __init__(self, make: Callable[[], tuple], size: Optional[int] = None):
        # ``size``: ``len(make())`` when the maker knows it cheaply (read before the
        # tuple is: a checker that only counts never builds it)
        self._make, self._value, self._len = make, None, size

    def get(self) -> tuple:
        v = self._value
        if v is None:
            v = self._value = tuple(self._make())
            self._make = None
        return v

    def __len__(self) -> int:
        if self._value is None and self._len is not None:
            return self._len
        return len(self.get())

    def __getitem__(self, i):
        return self.get()[i]

    def __iter__(self):
        return iter(self.get())

    def __contains__(self, x) -> bool:
        return x in self.get()

    def __eq__(self, other) -> bool:
        if isinstance(other, LazyTuple):
            other = other.get()
        return self.get() == other

    def __hash__(self) -> int:
        return hash(self.get())

    def __add__(self, other):
        return self.get() + tuple(other)

    def __repr__(self) -> str:
        return repr(self.get())

    def __reduce__(self):
        return tuple, (self.get(),)


@dataclass(frozen=True)
class ReqState:
    rid: RequestId
    state: str
    row: Optional[int]
    committed: int
    allocated: int
    output_len: int
    inflight: Tuple[BatchId, ...]
    # slots of ``allocated`` that are the prefix cache's (its matched prefix, §4.13)
    shared: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Host-side state at the end of a step; every count is in KV slots.
    ``ledger``: (slot, rid, purpose, allocating step) for owned and pending slots;
    ``requests``: every request so far, by id. ``live``: the requests whose state may
    have changed since the previous snapshot — every request but those already
    *settled* then (ended, and in no unprocessed batch: their state never changes
    again) and those *parked* then (waiting in the queue holding nothing, reported so
    once: nothing changes them until they leave the queue) — by id; None where the
    target does not say (read ``requests``). The
    reference engine computes ``ledger``, ``pending_slots``, ``requests``,
    ``host_ledger``, ``cache_ledger``, ``cache_nodes`` and ``page_conflicts`` when first read (``LazyTuple``), so that a checker that reads the
    per-step delta pays for the delta only."""

    total: int
    free: int
    owned: int
    pending: int
    ledger: Tuple[Tuple[int, RequestId, str, Step], ...]
    pending_slots: Tuple[int, ...]
    requests: Tuple[ReqState, ...]
    inflight: Tuple[BatchId, ...]
    rows_free: int
    idle: bool
    syncs: int
    declared_syncs: int
    page_size: int = 1
    row_width: int = 0
    rows_total: int = 0
    # the KV backup's host pool (kv_backup; all zero without it), counted like the device's
    host_total: int = 0
    host_free: int = 0
    host_pending: int = 0
    host_ledger: Tuple[Tuple[int, RequestId, str, Step], ...] = ()
    # live runtime allocations by buffer name, now and before the engine's first step
    # (the steady set); empty where the runtime does not count them
    buffers: Tuple[Tuple[str, int], ...] = ()
    steady_buffers: Tuple[Tuple[str, int], ...] = ()
    live: Optional[Tuple[ReqState, ...]] = None
    # the prefix cache (docs/design.md §4.13; zero and empty without it): slots the tree
    # holds, and per cached slot (slot, the request that wrote it, the tree's lock count)
    cached: int = 0
    cache_ledger: Tuple[Tuple[int, RequestId, int], ...] = ()
    # integrity facts (the pool-integrity checker): request-pool rows as the pool lists
    # them (its free list in order, and (row, request) of the rows it holds); the prefix
    # cache's nodes (serial, parent's serial, positions its key covers, its pages, lock
    # count, the sum of its children's locks) and the pages the tree counts; per KV and
    # host-pool page not in exactly one place: (pool, page, the places that list it)
    rows_free_list: Tuple[int, ...] = ()
    rows_held: Tuple[Tuple[int, RequestId], ...] = ()
    cache_nodes: Tuple[Tuple[int, int, int, Tuple[int, ...], int, int], ...] = ()
    cache_pages: int = 0
    page_conflicts: Tuple[Tuple[str, int, Tuple[str, ...]], ...] = ()
    # (request, slots) the KV pool's (and the host pool's) ledger gives each request
    owned_by: Tuple[Tuple[RequestId, int], ...] = ()
    host_owned_by: Tuple[Tuple[RequestId, int], ...] = ()
    # what the configured modes did so far, by name (the config-effect checker):
    # batches launched on the forward thread, steps overlapped, rounds pre-drafted...
    ran: Tuple[Tuple[str, int], ...] = ()


@dataclass(frozen=True)
class StepEnd(Event):
    snapshot: Snapshot


Observer = Callable[[Event], None]


def _dict_init(cls) -> None:
    """Give frozen dataclass ``cls`` an ``__init__`` that stores its fields into the
    instance dict instead of calling ``object.__setattr__`` per field (what the
    generated one does to get past ``frozen``): the same parameters, defaults and
    values, at a fraction of the cost. The engine builds several events and a
    snapshot every step, in reference runs too. Classes with a ``__post_init__`` or a
    default factory keep the generated one."""
    fields = dataclasses.fields(cls)
    names = list(inspect.signature(cls.__init__).parameters)[1:]
    if hasattr(cls, "__post_init__") or names != [f.name for f in fields] or any(
            f.default_factory is not dataclasses.MISSING or not f.init for f in fields):
        return
    params, body, defaults = [], [], {}
    for f in fields:
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            defaults[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        body.append(f"    _dict_[{f.name!r}] = {f.name}")
    src = f"def __init__(self, {', '.join(params)}):\n    _dict_ = self.__dict__\n" + "\n".join(body)
    ns: dict = {}
    exec(src, defaults, ns)   # noqa: S102 - generated from the dataclass's own fields
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init


for _cls in [c for c in list(globals().values())
             if isinstance(c, type) and dataclasses.is_dataclass(c) and
             c.__dataclass_params__.frozen and c.__module__ == __name__]:
    _dict_init(_cls)

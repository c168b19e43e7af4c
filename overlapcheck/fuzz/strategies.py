"""Hypothesis strategies for fuzz cases, swarm style.

Each example first draws its *features* (aborts on or off, stop tokens, seeded
sampling, a tight pool that forces retraction, overlap, spec, tensor-parallel ranks,
the wide search, long prompts prefilled in small chunks over many batches) and then a config, a workload and a schedule under them, so different
examples stress different mixtures. A quarter of the examples search wide: up to 8
draft tokens, pages up to 16 tokens, pools from barely fitting one row to 16 rows,
each seed variant and the ring FutureMap in half of them (every combination the engine
accepts); the others keep the narrow ranges, where most bugs need the fewest steps, each
variant in a quarter of them and the ring in a third. The schedule is part of the drawn data: by default explicit stalls of
named streams over choice points (the empty list is the eager schedule), so that
shrinking minimizes the workload *and* the schedule together; sometimes a seeded
random, PCT or BUGGIFY strategy for breadth. Last of all (so that the draws above are
what they were before it existed), a third of the examples turn the radix prefix cache
on, and then about half their requests after the first start with a prefix of an
earlier request's prompt and arrive up to 24 steps later (``shared_prefixes``). After
that, in one draw: a quarter of the examples audit their launches' declared accesses
(``Case.audit``), and an eighth run every host twin against its kernel (``Case.twins``,
``device/twins.py``: the torch source a GPU runs is fuzzed on the sim too).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from hypothesis import strategies as st

try:   # Hypothesis' own unwrapping of a lazy strategy, as ``data.draw`` does at every draw
    from hypothesis.strategies._internal.lazy import unwrap_strategies as _unwrap
except ImportError:     # another Hypothesis layout: draw from the lazy strategies
    def _unwrap(s):
        return s

from ..device.sched import SEEDED as SEEDED_STRATEGIES
from ..engine import EngineConfig
from ..engine.config import MODELS, RESERVE_RULES, TREE_KINDS
from ..engine.drafts import DRAFT_KINDS
from ..protocol import AbortAt, RequestSpec, Workload
from ..protocol.types import GREEDY, SEEDED
from ..run import Case, ScheduleSpec

STREAMS = ("schedule", "forward", "copy", "backup")   # backup: with kv_backup only
VOCAB = 64
WHOLE_RUN = 10 ** 9    # a stall window no run reaches the end of


_MADE: dict = {}   # (composite, its arguments) -> the strategy, made once


def _made(composite, *args):
    """``composite(*args)``, made once per arguments: Hypothesis works out a strategy's
    properties (emptiness, labels) per strategy object, which for a composite made at
    every draw cost more than the draw. The same definition draws the same choices."""
    try:
        hit = _MADE.get((composite, args))
    except TypeError:             # unhashable arguments: a strategy of its own
        return composite(*args)
    if hit is None:
        if len(_MADE) >= 4096:
            _MADE.clear()
        hit = _MADE[(composite, args)] = _unwrap(composite(*args))
    return hit


# The strategies the composites draw from, made once: Hypothesis caches some strategy
# constructors (integers, booleans, lists) behind a lookup that costs about what the
# draw does, and makes a new object at every call of others (sampled_from, one_of),
# whose properties it then works out again (together about a third of drawing a case,
# docs/design.md §8). The same definitions draw the same choices.
_BOOL = _unwrap(st.booleans())
_THREE_IN_FOUR = _unwrap(st.sampled_from((True, True, True, False)))
_ONE_IN_FOUR = _unwrap(st.sampled_from((False, False, False, True)))
_ONE_IN_THREE = _unwrap(st.sampled_from((False, False, True)))
# how an example's launches run: plainly; audited (a quarter); every host twin checked
# against its kernel (an eighth)
_LAUNCHES = _unwrap(st.sampled_from(("plain", "plain", "audit", "audit", "twins", "plain",
                                     "plain", "plain")))
_TP = _unwrap(st.sampled_from((1, 1, 1, 2)))
_HALF = _unwrap(st.sampled_from((False, True)))
_ZERO_BUBBLE_TIGHT = _unwrap(st.sampled_from((False, True, True, True)))
_TWO_IN_FIVE = _unwrap(st.sampled_from((False, False, False, True, True)))
_PAGES = {True: _unwrap(st.sampled_from((1, 2, 4, 8, 16))),
          False: _unwrap(st.sampled_from((1, 1, 2, 4)))}
_RESERVE = _unwrap(st.sampled_from(RESERVE_RULES))
_TOKEN = _unwrap(st.integers(0, VOCAB - 1))
_STOPS = _unwrap(st.lists(_TOKEN, max_size=6))
_SEED = _unwrap(st.integers(0, 2 ** 16))
_DELAY = _unwrap(st.one_of(st.integers(0, 3), st.integers(0, 20)))
_KINDS = _unwrap(st.sampled_from(("stalls",) * len(SEEDED_STRATEGIES) + SEEDED_STRATEGIES))
_SCHEDULE_SEED = _unwrap(st.integers(0, 2 ** 32 - 1))
_STALLS = _unwrap(st.lists(st.tuples(st.sampled_from(STREAMS), st.integers(0, 400),
                                     st.one_of(st.integers(1, 60), st.integers(61, 3000))),
                           max_size=6))
_LAG = _unwrap(st.sampled_from((None, None, "forward") + STREAMS))
_EACH: dict = {}   # (what, its arguments) -> a strategy that depends on them, made once


def _each(what: str, make, *args):
    """``make(*args)``, made once per ``(what, args)``."""
    key = (what, args)
    hit = _EACH.get(key)
    if hit is None:
        if len(_EACH) >= 4096:
            _EACH.clear()
        hit = _EACH[key] = _unwrap(make(*args))
    return hit


def _ints(lo: int, hi: int):
    return _each("integers", st.integers, lo, hi)


def _prompts(lo: int, hi: int):
    return _each("prompts", lambda a, b: st.lists(_TOKEN, min_size=a, max_size=b), lo, hi)


def _max_new(limit: int):
    return _each("max_new", lambda m: st.one_of(st.integers(1, 24), st.just(m)), limit)


@dataclass(frozen=True)
class Features:
    aborts: bool
    stops: bool
    seeded: bool
    tight_pool: bool
    overlap: bool
    spec: bool
    tp: int = 1       # logical ranks: 2 in a quarter of the examples
    burst: bool = False   # arrivals close together: more requests than rows, rows reused at once
    wide: bool = False    # the wide search: k up to 8, pages up to 16, roomy pools, variants
    long: bool = False    # long prompts in small chunks: prefills of many batches each


@st.composite
def features(draw) -> Features:
    b = _BOOL
    return Features(aborts=draw(b), stops=draw(b), seeded=draw(b), tight_pool=draw(b),
                    overlap=draw(_THREE_IN_FOUR), spec=draw(_THREE_IN_FOUR), tp=draw(_TP),
                    burst=draw(b), wide=draw(_ONE_IN_FOUR), long=draw(_ONE_IN_THREE))


@st.composite
def configs(draw, feat: Features, models: Sequence[str] = ("oracle",),
            draft_kinds: Optional[Sequence[str]] = None,
            logical_ranks: bool = True) -> EngineConfig:
    wide = feat.wide
    page = draw(_PAGES[bool(wide)])
    k = draw(_ints(1, 8 if wide else 4))
    margin = 2 * (k + 1)
    ctx = draw(_ints(8, 40))
    row = -(-(margin + ctx) // page) * page
    # pools from one row and the padding page (barely fits) to 8 rows, or 16 when wide
    # (long prompts take a roomy one: in a tight pool they would run one at a time)
    tight = feat.tight_pool and not feat.long
    rows = draw(_ints(1, 2)) if tight else draw(_ints(3, 16 if wide else 8))
    pool = page + row * rows + page * draw(_ints(0, 3))
    # the seeds' variants, each in a quarter of the examples (half when wide)
    variant = _HALF if wide else _ONE_IN_FOUR
    b = _BOOL
    cfg = EngineConfig(
        page_size=page, pool_tokens=pool, row_width=row,
        max_running=draw(_ints(1, 8 if wide else 6)),
        chunk_size=draw(_ints(1, 48) if wide else _ints(1, 2) if feat.long else _ints(2, 32)),
        spec_steps=k, draft_reserve=draw(_RESERVE),
        overlap=feat.overlap, spec=feat.spec, tp=feat.tp if logical_ranks else 1,
        draft_kind=draw(_each("sampled_from", st.sampled_from, tuple(draft_kinds or DRAFT_KINDS))),
        model=draw(_made(_model, models)),
        verify_sync=draw(variant), kv_backup=draw(variant),
        # zero bubble reserves a round more than admission sets aside: in a tight pool,
        # where that presses hardest, three quarters of the examples run it
        zero_bubble=draw(_ZERO_BUBBLE_TIGHT if tight else variant),
        future_map="ring" if draw(b if wide else _ONE_IN_THREE)
        else "row")
    # tree drafts (docs/design.md §4.12), drawn last so that the draws above stay as they
    # were: in two fifths of the examples whose draft kind, model and schedule have them;
    # the row grows by the tree's margin, the pool by as much per row
    if (cfg.draft_kind in TREE_KINDS and cfg.model in MODELS and not cfg.zero_bubble
            and draw(_TWO_IN_FIVE)):
        topk = draw(_ints(2, 4 if wide else 3))
        # the tree's margin over the chain's (EngineConfig.margin), computed here: a config
        # with the new topk and the old row may not be valid (k 4, topk 3, a context of 8)
        grown = k * (topk - 1)
        extra = -(-grown // page) * page
        cfg = dataclasses.replace(cfg, topk=topk, row_width=row + extra,
                                  pool_tokens=pool + extra * rows)
    # the forward thread (docs/design.md §4.14, one rank), drawn after everything else:
    # in a quarter of the examples
    if cfg.tp == 1 and draw(_ONE_IN_FOUR):
        cfg = dataclasses.replace(cfg, forward_thread=True)
    return cfg


@st.composite
def _model(draw, models: Sequence[str]) -> str:
    """One of ``models``; the oracle is, in a quarter of its examples, the oracle whose
    draft reads the host's sequence lengths (as cheap, and sensitive to stale ones)."""
    model = draw(_each("sampled_from", st.sampled_from, tuple(models)))
    if model == "oracle" and draw(_ONE_IN_FOUR):
        return "oracle-hostlens"
    return model


@st.composite
def workloads(draw, cfg: EngineConfig, feat: Features) -> Workload:
    n = draw(_ints(2 if feat.long else 1, 8))     # long prompts: several of them
    step, reqs, aborts = 0, [], []
    max_prompt = min(16, cfg.max_context - 1)
    # long prompts: from half the context to all of it but the first output token
    lo, hi = (cfg.max_context // 2, cfg.max_context - 1) if feat.long else (1, max_prompt)
    for rid in range(n):
        step += draw(_ints(0, 1 if feat.burst else 3))
        prompt = tuple(draw(_prompts(lo, hi)))
        # up to 6 stop ids: a stop inside an accept run (and at its end) is common enough
        stop = tuple(draw(_STOPS)) if feat.stops else ()
        seeded = feat.seeded and draw(_BOOL)
        # some requests run to the context limit: the row boundary is an edge of its own
        max_new = draw(_max_new(cfg.max_context))
        reqs.append(RequestSpec(rid, step, prompt, max_new, stop,
                                draw(_SEED) if seeded else 0,
                                SEEDED if seeded else GREEDY))
        if feat.aborts and draw(_BOOL):
            # early aborts land in the admission/prefill window as often as later ones
            aborts.append(AbortAt(rid, step + draw(_DELAY)))
    return Workload(tuple(reqs), tuple(aborts))


@st.composite
def schedules(draw) -> ScheduleSpec:
    # explicit stalls in half the examples (eager is stalls with none), a seeded
    # strategy in the other half
    kind = draw(_KINDS)
    if kind != "stalls":
        return ScheduleSpec(kind, draw(_SCHEDULE_SEED))
    # (stream, first choice point, length) each: short stalls (1-60) reorder a few ops;
    # long ones (61-3000) keep a stream behind the host across steps (a late staging
    # copy, a late D2H copy), as a busy GPU does
    stalls = draw(_STALLS)
    windows = tuple((s, a, a + d) for s, a, d in stalls)
    # a stream that lags the host for the whole run (it retires only what a sync needs),
    # as a GPU's does when the host runs ahead (the forward most often: it computes):
    # the reuse windows stay open every step
    lag = draw(_LAG)
    if lag is not None:
        windows = ((lag, 0, WHOLE_RUN),) + windows
    return ScheduleSpec("stalls", 0, windows)


@st.composite
def cases(draw, checks: Sequence[str] = (), faults: Sequence[str] = (),
          models: Sequence[str] = ("oracle",), draft_kinds: Optional[Sequence[str]] = None,
          config: Optional[EngineConfig] = None, logical_ranks: bool = True) -> Case:
    """A whole fuzz case. ``config`` pins the engine configuration (the pytest
    fixture's "fuzz my config" mode); otherwise it is drawn too. ``logical_ranks``:
    whether the device runs tensor-parallel ranks in one process (the sim's host flags);
    without them every case has one rank (the draws stay the same)."""
    feat = draw(_made(features))
    cfg = config if config is not None else draw(_made(configs, feat, models, draft_kinds,
                                                       logical_ranks))
    wl, sched = draw(_made(workloads, cfg, feat)), draw(_made(schedules))
    if config is None and draw(_ONE_IN_THREE):
        cfg = replace(cfg, prefix_cache=True)
    if cfg.prefix_cache:
        wl = shared_prefixes(draw, cfg, wl)
    # drawn last of all: the access audit (docs/design.md §3.4; in a quarter of the
    # examples the runtime also infers each declared launch's accesses) or the twins'
    # check (§3.4; in an eighth, each kernel run on numpy views runs on the tensors too)
    launches = draw(_LAUNCHES)
    return Case(cfg, wl, sched, tuple(checks), tuple(faults), audit=launches == "audit",
                twins="check" if launches == "twins" else "run")


def shared_prefixes(draw, cfg: EngineConfig, wl: Workload) -> Workload:
    """With the prefix cache: about half the requests after the first start with a
    prefix of an earlier request's prompt (cut to the longest prompt the context takes)
    and arrive up to 24 steps later, when the earlier one may have finished and left its
    KV in the tree (docs/design.md §4.13)."""
    reqs = list(wl.requests)
    for i in range(1, len(reqs)):
        if not draw(_BOOL):
            continue
        donor = reqs[draw(_ints(0, i - 1))].prompt
        head = donor[:draw(_ints(1, len(donor)))]
        reqs[i] = replace(reqs[i], prompt=(head + reqs[i].prompt)[:cfg.max_context - 1],
                          arrival=reqs[i].arrival + draw(_ints(0, 24)))
    return Workload(tuple(reqs), wl.aborts)

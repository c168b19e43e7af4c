"""Hypothesis strategies for the SGLang target: a config, a workload and a schedule
drawn together, so that shrinking minimizes all three.

Swarm style: each example first draws its *features* — overlap loop or normal,
spec decode, paged KV, a tight pool (retraction under memory pressure), aborts, stop
ids, seeded sampling, long prompts (chunked prefill), bursts of arrivals — and then
the case under them, so different examples stress different mixtures. The schedule is
``stalls`` over the session's lanes (``recv``: a due message reaches the scheduler
later; ``overlap``: the last result is processed before the next launch; ``decode``:
SGLang's own retraction test knob fires in that step's decode), each lane active in
about half of the examples.

Configs come from a small palette (a few sizes each) because a scheduler is built per
distinct size tuple and kept (``build``): the palette keeps the builds few, the sizes
still span a pool that cannot hold two requests and one that holds them all.
``faults`` are switched on in every case and never drawn: nothing here knows their
names.

``config`` (``fuzz --config``) holds config fields fixed and draws the others around
them: ``worker: eagle-v2`` fuzzes SGLang's own spec worker (always spec decode, the
real tiny pair, greedy requests), the loop, spec steps, pools and workloads still
drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from hypothesis import strategies as st

from ...protocol.types import GREEDY, SEEDED, RequestSpec
from ...protocol.workload import AbortAt, Workload
from ...run import Case, ScheduleSpec
from .config import REAL_WORKERS, SglangConfig

LANES = ("recv", "overlap", "decode")
VOCAB = 32
CONTEXT = 64


@dataclass(frozen=True)
class Features:
    overlap: bool
    spec: bool
    paged: bool
    tight_pool: bool
    aborts: bool
    stops: bool
    seeded: bool
    long_prompts: bool
    burst: bool
    lanes: tuple


@st.composite
def features(draw, pins=None) -> Features:
    pins = pins or {}
    b = st.booleans()
    lanes = tuple(lane for lane in LANES if draw(b))
    real_worker = pins.get("worker", "fake") in REAL_WORKERS
    real_model = real_worker or pins.get("model") == "real"
    if "spec_steps" in pins:
        spec = pins["spec_steps"] > 0
    else:   # a real spec worker always drafts; the fake worker's drafts need the fake model
        spec = True if real_worker else (False if real_model else draw(b))
    overlap = pins["overlap"] if "overlap" in pins else draw(st.sampled_from((True, True, True, False)))
    return Features(overlap=overlap, spec=spec, paged=draw(st.sampled_from((False, False, True))),
                    tight_pool=draw(b), aborts=draw(b), stops=draw(b),
                    # the real models decode greedily (SglangTarget.check_workload)
                    seeded=False if real_model else draw(b),
                    long_prompts=draw(b), burst=draw(b), lanes=lanes)


@st.composite
def configs(draw, feat: Features, pins=None) -> SglangConfig:
    pins = pins or {}
    context = pins.get("context", CONTEXT)
    page = draw(st.sampled_from((2, 4))) if feat.paged else 1
    pool = draw(st.sampled_from((2 * context, 3 * context) if feat.tight_pool
                                else (8 * context,)))
    fields = dict(
        overlap=feat.overlap, spec_steps=draw(st.integers(1, 3)) if feat.spec else 0,
        page_size=page, pool_tokens=pool, max_running=draw(st.sampled_from((3, 8))),
        chunk_size=draw(st.sampled_from((16, 64))), context=context, vocab=VOCAB,
        # acceptance: long accept runs (a stop inside one, a run crossing the length
        # limit) need a high rate; low rates keep single-token verifies common
        agreement=draw(st.sampled_from((0, 50, 80, 95, 100))))
    if pins.get("worker", "fake") in REAL_WORKERS:
        fields.update(model="real", spec_steps=draw(st.integers(1, 4)))
    fields.update(pins)
    if "faults" in fields:
        fields["faults"] = tuple(fields["faults"])
    return SglangConfig(**fields)


@st.composite
def workloads(draw, cfg: SglangConfig, feat: Features) -> Workload:
    n = draw(st.integers(1, 8))
    step, reqs, aborts = 0, [], []
    for rid in range(n):
        step += draw(st.integers(0, 1 if feat.burst else 4))
        longest = cfg.max_prompt if feat.long_prompts else 12
        plen = draw(st.integers(1, longest))
        prompt = tuple(draw(st.lists(st.integers(0, cfg.vocab - 1), min_size=plen,
                                     max_size=plen)))
        room = cfg.context - plen
        # some requests run to the context limit (SGLang caps them there)
        max_new = draw(st.one_of(st.integers(1, min(room, 24)), st.just(room)))
        stop = tuple(draw(st.lists(st.integers(0, cfg.vocab - 1), max_size=4))) if feat.stops else ()
        seeded = feat.seeded and draw(st.booleans())
        reqs.append(RequestSpec(rid, step, prompt, max_new, stop,
                                draw(st.integers(0, 2 ** 16)) if seeded else 0,
                                SEEDED if seeded else GREEDY))
        if feat.aborts and draw(st.booleans()):
            # early aborts land in the admission / first-batch window as often as later ones
            aborts.append(AbortAt(rid, step + draw(st.one_of(st.integers(0, 3),
                                                             st.integers(0, 40)))))
    return Workload(tuple(reqs), tuple(aborts))


@st.composite
def schedules(draw, feat: Features) -> ScheduleSpec:
    if not feat.lanes:
        return ScheduleSpec("stalls", 0, ())
    lengths = st.one_of(st.integers(1, 8), st.integers(9, 120))
    stalls = draw(st.lists(st.tuples(st.sampled_from(feat.lanes), st.integers(0, 300), lengths),
                           max_size=5))
    return ScheduleSpec("stalls", 0, tuple((lane, a, a + d) for lane, a, d in stalls))


@st.composite
def cases(draw, checks: Sequence[str] = (), faults: Sequence[str] = (),
          config: Optional[dict] = None) -> Case:
    """A whole SGLang case; ``faults`` are switched on, ``checks`` run (empty: all),
    ``config``'s fields held fixed."""
    feat = draw(features(config))
    cfg = draw(configs(feat, config))
    return Case(cfg, draw(workloads(cfg, feat)), draw(schedules(feat)), tuple(checks),
                tuple(faults), "sglang")

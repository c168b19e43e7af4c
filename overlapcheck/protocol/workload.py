"""Workloads are data: arrivals (prompt, max_new_tokens, stop ids, seed, sampling,
arrival step) and aborts at steps. Generated from a seed (the ``workload``
sub-stream) or loaded from YAML (``yaml.safe_load``, then validated: bad input is a
``WorkloadError`` with a one-line message).

``cfg`` is any target's config: workloads are validated against its ``max_context``
(the longest prompt + output a request may reach); ``generate`` reads its
``prefix_cache`` too where it has one.

YAML form::

    requests:
      - {id: 0, arrival: 0, prompt: [3, 1, 4], max_new_tokens: 16,
         stop: [7], seed: 5, sampling: greedy}
    aborts:
      - {id: 0, step: 6}
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

from .. import seeds
from .types import GREEDY, SAMPLING, SEEDED, RequestSpec


class WorkloadError(ValueError):
    """A workload that does not fit the schema or the engine; one line."""


@dataclass(frozen=True)
class AbortAt:
    rid: int
    step: int


@dataclass(frozen=True)
class Workload:
    requests: Tuple[RequestSpec, ...]
    aborts: Tuple[AbortAt, ...] = ()


def generate(seed: int, n: int, cfg, vocab: int = 64,
             abort_rate: float = 0.12, max_prompt: int = 24, max_new: int = 40) -> Workload:
    """``n`` requests with mixed arrivals, stop tokens, sampling modes and aborts. With
    the prefix cache on (``cfg.prefix_cache``), some requests then share a prefix with an
    earlier one (``share_prefixes``)."""
    rng = seeds.stream(seed, "workload")
    reqs, aborts, step = [], [], 0
    for rid in range(n):
        step += rng.choice((0, 0, 1, 2, 3))
        plen = rng.randint(1, min(max_prompt, cfg.max_context - 1))
        prompt = tuple(rng.randrange(vocab) for _ in range(plen))
        stop = tuple(sorted(rng.sample(range(vocab), rng.randint(1, 2)))) if rng.random() < 0.5 else ()
        sampling = SEEDED if rng.random() < 0.25 else GREEDY
        reqs.append(RequestSpec(rid, step, prompt, rng.randint(1, max_new), stop,
                                rng.randrange(2 ** 31), sampling))
        if rng.random() < abort_rate:
            aborts.append(AbortAt(rid, step + rng.randint(0, 30)))
    if getattr(cfg, "prefix_cache", False):
        reqs = share_prefixes(seed, reqs, min(max_prompt, cfg.max_context - 1))
    return Workload(tuple(reqs), tuple(aborts))


def share_prefixes(seed: int, reqs, max_prompt: int, rate: float = 0.5):
    """Half the requests after the first start with a prefix of an earlier request's
    prompt (cut to ``max_prompt``) and arrive up to 20 steps later, when the earlier one
    may have finished and left its KV in the prefix cache. Drawn from a sub-stream of its
    own, after the other draws, so the rest of the workload is what it was without it."""
    rng = seeds.stream(seed, "workload-prefix")
    out = list(reqs)
    for i in range(1, len(out)):
        if rng.random() >= rate:
            continue
        j = rng.randrange(i)
        donor = out[j].prompt
        head = donor[:rng.randint(1, len(donor))]
        out[i] = replace(out[i], prompt=(head + out[i].prompt)[:max_prompt],
                         arrival=out[i].arrival + rng.randint(0, 20))
    return out


_REQ_FIELDS = {"id", "arrival", "prompt", "max_new_tokens", "stop", "seed", "sampling"}
_ABORT_FIELDS = {"id", "step"}


def _int(v, where: str, minimum: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise WorkloadError(f"{where}: expected an integer, got {v!r}")
    if v < minimum:
        raise WorkloadError(f"{where}: must be >= {minimum}, got {v}")
    return v


def _ints(v, where: str) -> Tuple[int, ...]:
    if not isinstance(v, list):
        raise WorkloadError(f"{where}: expected a list of integers, got {v!r}")
    return tuple(_int(x, f"{where}[{i}]") for i, x in enumerate(v))


def _fields(item, allowed, where: str) -> dict:
    if not isinstance(item, dict):
        raise WorkloadError(f"{where}: expected a mapping, got {type(item).__name__}")
    unknown = sorted(set(map(str, item)) - allowed)
    if unknown:
        raise WorkloadError(f"{where}: unknown field {unknown[0]!r}")
    return item


def parse(doc, cfg) -> Workload:
    """Validate a loaded YAML document against the schema and ``cfg``."""
    doc = _fields(doc, {"requests", "aborts"}, "workload")
    items = doc.get("requests")
    if not isinstance(items, list) or not items:
        raise WorkloadError("workload: 'requests' must be a non-empty list")
    reqs, ids = [], set()
    for i, item in enumerate(items):
        w = f"requests[{i}]"
        item = _fields(item, _REQ_FIELDS, w)
        for key in ("id", "prompt", "max_new_tokens"):
            if key not in item:
                raise WorkloadError(f"{w}: missing field {key!r}")
        rid = _int(item["id"], f"{w}.id")
        if rid in ids:
            raise WorkloadError(f"{w}.id: duplicate request id {rid}")
        ids.add(rid)
        prompt = _ints(item["prompt"], f"{w}.prompt")
        if not prompt:
            raise WorkloadError(f"{w}.prompt: must hold at least one token")
        if len(prompt) >= cfg.max_context:
            # a target's config has a max_context; only the reference engine's a row width
            width = getattr(cfg, "row_width", None)
            raise WorkloadError(f"{w}.prompt: {len(prompt)} tokens is longer than the row width "
                                f"allows ({cfg.max_context - 1}"
                                + (f" at row width {width})" if width is not None else ")"))
        sampling = item.get("sampling", GREEDY)
        if sampling not in SAMPLING:
            raise WorkloadError(f"{w}.sampling: must be one of {', '.join(SAMPLING)}, got {sampling!r}")
        reqs.append(RequestSpec(rid, _int(item.get("arrival", 0), f"{w}.arrival"), prompt,
                                _int(item["max_new_tokens"], f"{w}.max_new_tokens", 1),
                                _ints(item.get("stop", []), f"{w}.stop"),
                                _int(item.get("seed", 0), f"{w}.seed"), sampling))
    aborts = []
    for i, item in enumerate(doc.get("aborts") or []):
        w = f"aborts[{i}]"
        item = _fields(item, _ABORT_FIELDS, w)
        if "id" not in item or "step" not in item:
            raise WorkloadError(f"{w}: needs 'id' and 'step'")
        rid = _int(item["id"], f"{w}.id")
        if rid not in ids:
            raise WorkloadError(f"{w}.id: no request with id {rid}")
        aborts.append(AbortAt(rid, _int(item["step"], f"{w}.step")))
    return Workload(tuple(reqs), tuple(aborts))


def load(path: str, cfg) -> Workload:
    """Load and validate a YAML workload file."""
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise WorkloadError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise WorkloadError(f"{path}: not valid YAML{at}") from None
    try:
        return parse(doc, cfg)
    except WorkloadError as e:
        raise WorkloadError(f"{path}: {e}") from None


def dump(w: Workload) -> dict:
    """The YAML-ready form of ``w`` (``parse(dump(w))`` gives ``w`` back)."""
    return {"requests": [{"id": r.rid, "arrival": r.arrival, "prompt": list(r.prompt),
                          "max_new_tokens": r.max_new_tokens, "stop": list(r.stop_ids),
                          "seed": r.seed, "sampling": r.sampling} for r in w.requests],
            "aborts": [{"id": a.rid, "step": a.step} for a in w.aborts]}

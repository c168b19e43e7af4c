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

import os
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
# The largest values a workload may hold. Steps: an engine steps through every idle step
# up to an arrival (a few thousand a second, checked), so a later one would only idle;
# ids, seeds and tokens: what the device's int64 buffers (and ids' int32 uses) hold.
MAX_STEP = 1_000_000
MAX_ID = 2 ** 31 - 1
MAX_VALUE = 2 ** 63 - 1
MAX_BYTES = 256 << 20    # a workload file (100k requests take about 10 MiB)


def _int(v, where: str, minimum: int = 0, maximum: int = MAX_VALUE) -> int:
    if type(v) is int and minimum <= v <= maximum:     # the common case, at once
        return v
    if not isinstance(v, int) or isinstance(v, bool):
        raise WorkloadError(f"{where}: expected an integer, got {_short(v)}")
    if v < minimum:
        raise WorkloadError(f"{where}: must be >= {minimum}, got {v}")
    if v > maximum:
        raise WorkloadError(f"{where}: must be <= {maximum}, got {_short(v)}")
    return v


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _ints(v, where: str) -> Tuple[int, ...]:
    if not isinstance(v, list):
        raise WorkloadError(f"{where}: expected a list of integers, got {_short(v)}")
    if not v or (set(map(type, v)) == {int} and min(v) >= 0 and max(v) <= MAX_VALUE):
        return tuple(v)           # a workload's prompts: checked whole, in C
    return tuple(_int(x, f"{where}[{i}]") for i, x in enumerate(v))


def _fields(item, allowed, where: str) -> dict:
    if not isinstance(item, dict):
        raise WorkloadError(f"{where}: expected a mapping, got {type(item).__name__}")
    if item.keys() <= allowed:
        return item
    unknown = sorted(set(map(str, item)) - allowed)
    if unknown:
        raise WorkloadError(f"{where}: unknown field {unknown[0]!r}")
    return item


def _well_formed(item, ids, limit: int):
    """The ``RequestSpec`` of a request entry that is good in every field, or None (then
    ``parse`` checks it field by field and says what is wrong): a 100k-request workload
    is checked in about a second."""
    if type(item) is not dict or not item.keys() <= _REQ_FIELDS:
        return None
    rid, prompt, new = item.get("id"), item.get("prompt"), item.get("max_new_tokens")
    stop, seed = item.get("stop", []), item.get("seed", 0)
    arrival, sampling = item.get("arrival", 0), item.get("sampling", GREEDY)
    if not (type(rid) is int and 0 <= rid <= MAX_ID and rid not in ids
            and type(new) is int and 1 <= new <= MAX_VALUE
            and type(seed) is int and 0 <= seed <= MAX_VALUE
            and type(arrival) is int and 0 <= arrival <= MAX_STEP
            and type(prompt) is list and 0 < len(prompt) < limit
            and type(stop) is list and type(sampling) is str and sampling in SAMPLING):
        return None
    for v in (prompt, stop):
        if v and not (set(map(type, v)) == {int} and min(v) >= 0 and max(v) <= MAX_VALUE):
            return None
    return RequestSpec(rid, arrival, tuple(prompt), new, tuple(stop), seed, sampling)


def parse(doc, cfg) -> Workload:
    """Validate a loaded YAML document against the schema and ``cfg``."""
    doc = _fields(doc, {"requests", "aborts"}, "workload")
    items = doc.get("requests")
    if not isinstance(items, list) or not items:
        raise WorkloadError("workload: 'requests' must be a non-empty list")
    reqs, ids = [], set()
    limit = cfg.max_context
    for i, item in enumerate(items):
        spec = _well_formed(item, ids, limit)
        if spec is not None:        # the common case, checked without naming each field
            ids.add(spec.rid)
            reqs.append(spec)
            continue
        w = f"requests[{i}]"
        item = _fields(item, _REQ_FIELDS, w)
        for key in ("id", "prompt", "max_new_tokens"):
            if key not in item:
                raise WorkloadError(f"{w}: missing field {key!r}")
        rid = _int(item["id"], f"{w}.id", maximum=MAX_ID)
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
        arrival = _int(item.get("arrival", 0), f"{w}.arrival", maximum=MAX_STEP)
        reqs.append(RequestSpec(rid, arrival, prompt,
                                _int(item["max_new_tokens"], f"{w}.max_new_tokens", 1),
                                _ints(item.get("stop", []), f"{w}.stop"),
                                _int(item.get("seed", 0), f"{w}.seed"), sampling))
    aborts = []
    if not isinstance(doc.get("aborts") or [], list):
        raise WorkloadError("workload: 'aborts' must be a list")
    for i, item in enumerate(doc.get("aborts") or []):
        w = f"aborts[{i}]"
        item = _fields(item, _ABORT_FIELDS, w)
        if "id" not in item or "step" not in item:
            raise WorkloadError(f"{w}: needs 'id' and 'step'")
        rid = _int(item["id"], f"{w}.id", maximum=MAX_ID)
        if rid not in ids:
            raise WorkloadError(f"{w}.id: no request with id {rid}")
        aborts.append(AbortAt(rid, _int(item["step"], f"{w}.step", maximum=MAX_STEP)))
    return Workload(tuple(reqs), tuple(aborts))


def check_vocab(w: Workload, vocab, model: str) -> None:
    """``WorkloadError`` when a prompt token of ``w`` lies outside the model's vocabulary
    (``vocab`` tokens; None: not known, nothing checked): the model would index past its
    embedding, a failure of the input, not of the engine. Stop ids outside it are
    allowed (they never match)."""
    if vocab is None:
        return
    for i, r in enumerate(w.requests):
        bad = next((t for t in r.prompt if t >= vocab), None)
        if bad is not None:
            raise WorkloadError(f"requests[{i}].prompt: token {bad} is outside model {model}'s "
                                f"vocabulary (0..{vocab - 1})")


def load(path: str, cfg) -> Workload:
    """Load and validate a YAML workload file (UTF-8, at most ``MAX_BYTES``). A file that
    is JSON (which YAML includes) is read as JSON, the fastest way to hold a large
    workload (100k requests: about a second); YAML is read by ``plainyaml`` (about ten
    times as fast as PyYAML's safe loader on such a file, with its result)."""
    import json

    import yaml

    from .. import plainyaml
    try:
        if os.path.exists(path) and not os.path.isfile(path):   # a folder, a pipe: never read
            raise WorkloadError(f"{path}: not a regular file")
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise WorkloadError(f"{path}: {size} bytes is larger than a workload file may be "
                                f"({MAX_BYTES >> 20} MiB)")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        doc = _json(text, json)
        if doc is _NOT_JSON:
            doc = plainyaml.load(text)           # safe: plain data only
    except WorkloadError:
        raise
    except OSError as e:
        raise WorkloadError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not UTF-8 text (a workload is a YAML file)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise WorkloadError(f"{path}: not valid YAML{at}") from None
    except (ValueError, TypeError, RecursionError) as e:   # odd scalars, deep nesting
        raise WorkloadError(f"{path}: not valid YAML ({type(e).__name__})") from None
    try:
        return parse(doc, cfg)
    except WorkloadError as e:
        raise WorkloadError(f"{path}: {e}") from None


_NOT_JSON = object()


def _json(text: str, json):
    """The JSON document ``text`` holds, or ``_NOT_JSON`` (then it is read as YAML)."""
    if text.lstrip()[:1] not in ("{", "["):
        return _NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def dump(w: Workload) -> dict:
    """The YAML-ready form of ``w`` (``parse(dump(w))`` gives ``w`` back)."""
    return {"requests": [{"id": r.rid, "arrival": r.arrival, "prompt": list(r.prompt),
                          "max_new_tokens": r.max_new_tokens, "stop": list(r.stop_ids),
                          "seed": r.seed, "sampling": r.sampling} for r in w.requests],
            "aborts": [{"id": a.rid, "step": a.step} for a in w.aborts]}

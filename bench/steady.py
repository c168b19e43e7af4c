"""The timing method the GPU benches share (docs/design.md §8.1): when a rate has settled,
which order interleaved runs take, and how a figure is reported (the median with its
min-max spread). Plain Python, no clock of its own: callers pass rates or a run
function, so tests drive it with a fake timer.

* ``balanced_order``: round r runs the modes forward when r is even, backward when odd
  (ABBA for two modes), so a drift over the session falls on every mode alike.
* ``warm_up``: rounds of every mode until each mode's rate agrees with its rate of the
  round before (capped); ``rounds``: the measured rounds in balanced order. A round
  runs its modes one by one, or (``joint``) through one call that runs them together
  (the GPU bench's interleaved windows); ``together``: every measured round through one
  call, so their windows can take turns too; ``take_turns``: the order in which such
  runs take their windows.
* ``spread``/``paired_ratio``: a figure as {median, min, max}; a ratio of two modes
  from the rounds they shared (each round's ratio, then their median and range).
  ``window_paired_ratio``: the same where each round's windows of the two modes ran
  back to back (interleaved): a round's ratio is the median of its windows' ratios.
* ``by_position``: each round's rate from its windows, the host's stalls left out: every
  round times the same steps, so a window slower than the same window of the other
  rounds was slowed by the host, not the engine.
"""
from __future__ import annotations

import statistics


def agree(a: float, b: float, tol: float) -> bool:
    """Two rates within ``tol`` (relative to the larger) of each other."""
    hi = max(abs(a), abs(b))
    return hi == 0 or abs(a - b) <= tol * hi


def balanced_order(modes, r: int) -> list:
    """The order of round ``r``: forward on even rounds, backward on odd ones."""
    modes = list(modes)
    return modes if r % 2 == 0 else modes[::-1]


def one_by_one(run):
    """A round function (``rounds``, ``warm_up``) that runs ``run(mode)`` for each mode
    of the round's order in turn."""
    def round_(order) -> dict:
        return {m: run(m) for m in order}
    return round_


def rounds(modes, n: int, run, joint: bool = False) -> dict:
    """``n`` rounds of ``run(mode)`` (a dict with "tokens_per_s") in balanced order, or,
    ``joint``, of ``run(order)`` (a round of every mode at once: {mode: result}):
    {mode: [result of round 0, round 1, ...]}."""
    run_round = run if joint else one_by_one(run)
    out = {m: [] for m in modes}
    for r in range(n):
        got = run_round(balanced_order(modes, r))
        for m in modes:
            out[m].append(got[m])
    return out


def together(modes, n: int, run) -> dict:
    """``n`` rounds run at once: ``run(orders)`` gets every round's order (balanced, as
    ``rounds`` would run them) and returns one {mode: result} per round, in that order;
    {mode: [result of round 0, round 1, ...]}, as ``rounds``. A slow period of the host
    then falls on a window of every round alike, not on one round's runs (docs/design.md
    §8.1)."""
    got = run([balanced_order(modes, r) for r in range(n)])
    if len(got) != n:
        raise ValueError(f"{n} rounds asked for, {len(got)} run")
    return {m: [g[m] for g in got] for m in modes}


def take_turns(orders, make, windows: int) -> list:
    """Rounds whose runs take turns window by window (docs/design.md §8.1): a run
    ``make(mode)`` (with ``window()``, the next window, and ``figures()``) per mode of
    every round in ``orders``, all alive at once; window ``w`` of every round in turn
    (the rounds backward on odd windows), within a round of every mode in its order
    (backward on odd windows), so a round's pairs run back to back and a slow period of
    the host falls on every mode and round alike. [{mode: figures}, one per round]."""
    runs = [{m: make(m) for m in order} for order in orders]
    for w in range(windows):
        for k in balanced_order(range(len(orders)), w):
            for m in balanced_order(orders[k], w):
                runs[k][m].window()
    return [{m: r[m].figures() for m in order} for r, order in zip(runs, orders)]


def warm_up(modes, run, tol: float = 0.03, cap: int = 4, key: str = "tokens_per_s",
            joint: bool = False) -> dict:
    """Rounds of ``run(mode)`` (balanced order; ``joint``: of ``run(order)``, as in
    ``rounds``) until every mode's ``key`` agrees with its previous round's within
    ``tol``, at least two rounds, at most ``cap``:
    {"rounds", "settled", "rates": {mode: [...]}}."""
    run_round = run if joint else one_by_one(run)
    rates = {m: [] for m in modes}
    settled, r = False, 0
    while r < max(2, cap):
        got = run_round(balanced_order(modes, r))
        for m in modes:
            rates[m].append(got[m][key])
        r += 1
        settled = r >= 2 and all(agree(v[-2], v[-1], tol) for v in rates.values())
        if settled:
            break
    return {"rounds": r, "settled": settled, "rates": {m: [round(x, 2) for x in v] for m, v in rates.items()}}


def spread(values) -> dict:
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired_ratio(a, b):
    """The ratio of two modes from the rounds they shared: each round's a/b, then
    {median, min, max}; None when a round's b is 0 or there is none."""
    pairs = [x / y for x, y in zip(a, b) if y > 0]
    return spread(pairs) if pairs and len(pairs) == min(len(a), len(b)) else None


def window_paired_ratio(a, b):
    """The ratio of two modes from interleaved rounds: ``a`` and ``b`` hold each round's
    window rates (one list per round, windows paired by position, each pair run back to
    back). A round's ratio is the median of its pairs' ratios, so a slow period of the
    host that falls on one window of a pair moves that pair only; then {median, min,
    max} over the rounds. None when a round has no pair or a window's b is 0."""
    per_round = []
    for wa, wb in zip(a, b):
        pairs = [x / y for x, y in zip(wa, wb) if y > 0]
        if not pairs or len(pairs) != min(len(wa), len(wb)):
            return None
        per_round.append(statistics.median(pairs))
    return spread(per_round) if per_round and len(per_round) == min(len(a), len(b)) else None


def by_position(windows, tokens=None) -> list:
    """Each round's rate with the host's stalls left out (docs/design.md §8.1).
    ``windows``: one list of window rates per round, every round timing the same steps
    of the same workload window by window; ``tokens``: each window's tokens (the same in
    every round; None: equal). The engine does the same work at a position in every
    round, so whatever it costs there, a stall of its own included, is in every round's
    window; what one round's window alone shows is the host's. Per position, the median
    over the rounds; a round's rate is the range's rate with every window at its
    position's median, times the median over the round's windows of its rate over that
    median (its typical speed against the others'). [one rate per round]."""
    if not windows or any(len(w) != len(windows[0]) for w in windows) or not windows[0]:
        raise ValueError("every round needs the same windows, at least one")
    n = len(windows[0])
    tokens = list(tokens) if tokens is not None else [1.0] * n
    if len(tokens) != n or min(tokens) <= 0 or min(min(w) for w in windows) <= 0:
        raise ValueError("one positive token count and rate per window")
    pos = [statistics.median(w[i] for w in windows) for i in range(n)]
    base = sum(tokens) / sum(t / p for t, p in zip(tokens, pos))
    return [base * statistics.median(x / p for x, p in zip(w, pos)) for w in windows]


def fmt_spread(s, spec: str = ".1f", width: int = 0) -> str:
    """'median [min-max]'; '-' for None."""
    if s is None:
        return "-".rjust(width)
    return f"{format(s['median'], spec)} [{format(s['min'], spec)}-{format(s['max'], spec)}]".rjust(width)


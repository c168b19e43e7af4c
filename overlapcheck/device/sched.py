"""Schedule strategies of the simulated device.

At every host runtime call (a *choice point*) the sim asks its strategy, one decision
at a time, whether to retire the head of a ready stream or to stop. A decision with
``n`` options is an int in ``[0, n)``:

* free decision (at a choice point): 0 stops, ``k >= 1`` retires ``ready[k-1]``;
* forced decision (inside a synchronization, which must make progress): ``k`` retires
  ``ready[k]``.

Every decision with more than one option is recorded; ``Replay`` feeds a recorded list
back, so a run replays exactly from its choices. ``Draw`` takes decisions from a
callback (Hypothesis' data, so that shrinking minimizes the schedule too).
"""
from __future__ import annotations

import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple


class Diverged(Exception):
    """A replayed run no longer follows its recorded choices."""


class Strategy:
    name = "?"
    seeded = False     # built from a seeded ``random.Random``
    # the sim may start the next choice point early (``early_point``): only where a
    # strategy says so
    early = False

    def new_point(self) -> None:
        """Called once at the start of each choice point."""

    def choose(self, n: int, ready: Sequence[str], forced: bool) -> int:
        raise NotImplementedError

    def early_point(self, stream: str) -> bool:
        """Start the next choice point now (``new_point``), ahead of the host call that
        makes it, and say whether its first decision, with only the head of ``stream``
        ready, retires it (decision 1). The sim calls it when the host queues work
        while nothing else is queued, and then runs that work at once (``SimRuntime``,
        direct execution). Only where ``early``: nothing but the sim's own calls may
        change the strategy's state until that point."""
        raise NotImplementedError

    def eager(self) -> bool:
        """True when, until the next choice point, every decision would take the first
        ready stream (``choose`` returns 1, or 0 when forced): the sim then takes those
        decisions without asking (the same decisions, recorded the same way)."""
        return False

    def describe(self) -> dict:
        return {"strategy": self.name}


class Eager(Strategy):
    """Retire everything ready at every choice point: every closure runs at once."""

    name = "eager"

    def choose(self, n, ready, forced):
        return 0 if forced else 1

    @property
    def early(self) -> bool:
        """Only with this class's own points and choices (not a subclass's)."""
        cls = type(self)
        return (cls.new_point is Strategy.new_point and cls.choose is Eager.choose
                and cls.eager is Eager.eager)

    def early_point(self, stream):
        return True

    def eager(self) -> bool:
        return True


class Random(Strategy):
    """Stop with a per-run probability, else retire a uniformly chosen ready head."""

    name = "random"
    seeded = True

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.p_stop = rng.uniform(0.2, 0.8)

    def choose(self, n, ready, forced):
        if forced:
            return self.rng.randrange(n)
        if self.rng.random() < self.p_stop:
            return 0
        return 1 + self.rng.randrange(n - 1)

    def describe(self):
        return {"strategy": self.name, "p_stop": round(self.p_stop, 4)}


class PCT(Strategy):
    """Probabilistic concurrency testing, adapted to streams: run the highest-priority
    ready stream; at ``depth`` random change points the running stream drops to the
    lowest priority."""

    name = "pct"
    seeded = True

    def __init__(self, rng: random.Random, depth: int = 3, horizon: int = 200):
        self.rng = rng
        self.prio: Dict[str, float] = {}
        self.p_stop = rng.uniform(0.1, 0.6)
        self.changes = set(rng.sample(range(horizon), depth))
        self.count = 0
        self.low = 0.0

    def _prio(self, s: str) -> float:
        p = self.prio.get(s)
        if p is None:
            p = self.prio[s] = 1.0 + self.rng.random()
        return p

    def choose(self, n, ready, forced):
        self.count += 1
        if not forced and self.rng.random() < self.p_stop:
            return 0
        # the first ready stream of the highest priority (``_prio`` of each in order,
        # inlined: an unseen stream draws its priority here)
        prio, best, top = self.prio, 0, None
        for i, s in enumerate(ready):
            p = prio.get(s)
            if p is None:
                p = prio[s] = 1.0 + self.rng.random()
            if top is None or p > top:
                best, top = i, p
        if self.count in self.changes:
            self.low -= 1.0
            self.prio[ready[best]] = self.low
        return best if forced else best + 1

    def describe(self):
        return {"strategy": self.name, "p_stop": round(self.p_stop, 4),
                "change_points": sorted(self.changes)}


class Buggify(Strategy):
    """Eager, perturbed BUGGIFY-style: each stream is a perturbation site, activated
    for the run with probability ``p_active`` and, when active, fired at each choice
    point with probability ``p_fire``; a fired site stalls its stream for that point.
    Both probabilities are drawn per run (swarm style)."""

    name = "buggify"
    seeded = True

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.p_active = rng.uniform(0.2, 0.8)
        self.p_fire = rng.uniform(0.2, 0.95)
        self.active: Dict[str, bool] = {}
        self.stalled: Dict[str, bool] = {}

    def new_point(self):
        self.stalled = {}

    def _stalled(self, s: str) -> bool:
        st = self.stalled.get(s)
        if st is None:
            act = self.active.get(s)
            if act is None:
                act = self.active[s] = self.rng.random() < self.p_active
            st = self.stalled[s] = act and self.rng.random() < self.p_fire
        return st

    def choose(self, n, ready, forced):
        for i, s in enumerate(ready):
            if not self._stalled(s):
                return i if forced else i + 1
        return 0

    def describe(self):
        return {"strategy": self.name, "p_active": round(self.p_active, 4),
                "p_fire": round(self.p_fire, 4)}


class Stalls(Strategy):
    """Eager, except that listed streams are stalled over listed choice points:
    ``stalls`` holds ``(stream name, first point, end point)`` triples. Compact and
    easy to shrink (drop a stall, shorten it): the fuzzer draws these from
    Hypothesis, and an empty list is the eager schedule."""

    name = "stalls"

    def __init__(self, stalls: Sequence[Tuple[str, int, int]] = ()):
        self.stalls = [(str(s), int(a), int(b)) for s, a, b in stalls]
        self.point = -1
        self.stalled: frozenset = frozenset()
        # the stalled set changes only where a window starts or ends
        self._edges = sorted({x for _, a, b in self.stalls for x in (a, b)}, reverse=True)

    def new_point(self):
        self.point += 1
        edges = self._edges
        if edges and edges[-1] <= self.point:
            self.new_point_edges()

    def new_point_edges(self):
        """At a point where a window starts or ends: the stalled set changes."""
        p = self.point
        edges = self._edges
        while edges and edges[-1] <= p:
            edges.pop()
        self.stalled = frozenset(s for s, a, b in self.stalls if a <= p < b)

    def choose(self, n, ready, forced):
        for i, s in enumerate(ready):
            if s not in self.stalled:
                return i if forced else i + 1
        return 0

    def eager(self) -> bool:
        return not self.stalled

    @property
    def early(self) -> bool:
        """Only with this class's own points and choices (a subclass may stall streams
        from outside, between points)."""
        cls = type(self)
        return (cls.new_point is Stalls.new_point and cls.choose is Stalls.choose
                and cls.eager is Stalls.eager)

    def early_point(self, stream):
        self.point += 1           # ``new_point``, inlined
        edges = self._edges
        if edges and edges[-1] <= self.point:
            self.new_point_edges()
        return stream not in self.stalled

    def describe(self):
        return {"strategy": self.name, "stalls": [list(x) for x in self.stalls]}


class Replay(Strategy):
    """Feed back recorded choices; raise ``Diverged`` when they no longer fit."""

    name = "replay"

    def __init__(self, choices: Sequence[int]):
        self.choices = list(choices)
        self.pos = 0

    def choose(self, n, ready, forced):
        if self.pos >= len(self.choices):
            raise Diverged(f"the run asks for decision {self.pos + 1}, "
                           f"but only {len(self.choices)} were recorded")
        c = self.choices[self.pos]
        if not 0 <= c < n:
            raise Diverged(f"recorded decision {self.pos + 1} is {c}, "
                           f"but the run offers {n} options there")
        self.pos += 1
        return c

    @property
    def exhausted(self) -> bool:
        return self.pos == len(self.choices)


class Draw(Strategy):
    """Take each decision from ``draw(n) -> int in [0, n)``."""

    name = "draw"

    def __init__(self, draw: Callable[[int], int]):
        self.draw = draw

    def choose(self, n, ready, forced):
        return self.draw(n)


class Script(Strategy):
    """Follow ``prefix``, then always take option 0; remember every decision's
    option count. The building block of exhaustive schedule enumeration."""

    name = "script"

    def __init__(self, prefix: Sequence[int]):
        self.prefix = list(prefix)
        self.taken: List[int] = []
        self.options: List[int] = []

    def choose(self, n, ready, forced):
        i = len(self.taken)
        c = self.prefix[i] if i < len(self.prefix) else 0
        self.taken.append(c)
        self.options.append(n)
        return c


# name -> class of the named strategies a run or a case can ask for (the rest — stalls,
# replay, draw, script — are built from data, not from a name)
NAMED: Dict[str, type] = {"eager": Eager, "random": Random, "pct": PCT, "buggify": Buggify}
STRATEGIES = tuple(NAMED)
SEEDED = tuple(n for n, c in NAMED.items() if c.seeded)   # those that draw from their rng


def make_strategy(name: str, rng: Optional[random.Random] = None) -> Strategy:
    cls = NAMED.get(name)
    if cls is None:
        raise ValueError(f"unknown schedule strategy {name!r} (choose from {', '.join(STRATEGIES)})")
    if not cls.seeded:
        return cls()
    if rng is None:
        raise ValueError(f"strategy {name!r} needs a seeded rng")
    return cls(rng)

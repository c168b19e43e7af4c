"""One seed drives everything through named sub-streams.

``derive(seed, "schedule")`` gives the seed of the ``schedule`` sub-stream; names
nest (``derive(seed, "workload", "req", 3)``). There is no global RNG anywhere:
every random choice takes a ``random.Random`` made by ``stream(seed, ...)``.
"""
from __future__ import annotations

import hashlib
import random



def derive(seed: int, *names: object) -> int:
    text = ":".join([str(int(seed))] + [str(n) for n in names])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def stream(seed: int, *names: object) -> random.Random:
    return random.Random(derive(seed, *names))

"""toy-budget: no decode step gives more tokens than the toy's budget (``ToyStep``, an
event only the toy target emits)."""
from __future__ import annotations

from invariants.base import Checker, Violation


class ToyBudget(Checker):
    name = "toy-budget"
    targets = ("toy",)

    def on_ToyStep(self, ev):
        if ev.tokens <= ev.budget:
            return []
        return [Violation(self.name, ev.iteration, f"batch {ev.batch} decoded over budget",
                          f"at most {ev.budget} tokens", f"{ev.tokens} tokens", ("over-budget",))]

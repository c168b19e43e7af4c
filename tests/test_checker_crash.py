"""A checker that raises (values read too early can be anything) is a finding that
names it; the run and the other checkers go on."""
from invariants.base import Checker
from overlapcheck.protocol import events as E
from overlapcheck.run import Monitor


class Boom(Checker):
    name = "lifecycle"

    def on_Arrived(self, ev):
        raise IndexError("list index out of range")


class Counting(Checker):
    name = "metrics"

    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_Arrived(self, ev):
        self.seen += 1
        return []


def test_a_crashing_checker_is_a_finding_and_the_others_go_on():
    other = Counting()
    s = Monitor([Boom(), other])
    for rid in (1, 2):
        s(E.Arrived(0, -1, rid, None))
    found = s.findings()
    assert len(found) == 1 and found[0].checker == "lifecycle"
    assert found[0].site == ("checker-crashed", "Arrived", "IndexError")
    assert "crashed on event Arrived: IndexError" in found[0].text
    assert other.seen == 2 and s.checkers == [other]

"""A campaign draws every example afresh (``campaign.no_mutations``): Hypothesis's
runner follows each generated example with copies of it that share its features,
config and schedule; a campaign turns that step off while it draws and gives it back
after. The control: the same strategy under plain Hypothesis runs the step."""
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hseed
from hypothesis.internal.conjecture.engine import ConjectureRunner

from overlapcheck.fuzz.campaign import Campaign, Options, case_strategy, no_mutations


def _spy(monkeypatch) -> list:
    """Count the runner's mutation step, still doing what it does."""
    calls, real = [], ConjectureRunner.generate_mutations_from

    def counted(runner, data):
        calls.append(runner.call_count)
        return real(runner, data)
    monkeypatch.setattr(ConjectureRunner, "generate_mutations_from", counted)
    return calls


def _plain(strategy, n: int) -> int:
    ran = []

    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @hseed(4)
    @given(strategy)
    def prop(case):
        ran.append(case)
    prop()
    return len(ran)


def test_a_campaign_runs_no_copies_and_gives_the_step_back(monkeypatch):
    calls = _spy(monkeypatch)
    spy = ConjectureRunner.generate_mutations_from
    c = Campaign(Options(seconds=None, examples=30, seed=4)).run()
    assert c.stats.examples == 30 and calls == []
    assert ConjectureRunner.generate_mutations_from is spy
    # the control: plain Hypothesis copies the campaign's own cases
    assert _plain(case_strategy(Options()), 30) == 30 and calls


def test_the_step_is_given_back_when_the_draws_raise(monkeypatch):
    _spy(monkeypatch)
    spy = ConjectureRunner.generate_mutations_from
    try:
        with no_mutations():
            assert ConjectureRunner.generate_mutations_from is not spy
            raise KeyError("a test that failed")
    except KeyError:
        pass
    assert ConjectureRunner.generate_mutations_from is spy

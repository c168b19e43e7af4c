"""The shared example database: Redis multiplexed with a local folder. Campaigns sharing
one server replay each other's failing examples; a server that goes away mid-campaign
leaves the campaign on its local folder, said once, nothing lost; an address that does
not answer is one line and exit 2."""
import subprocess
import sys

from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from fleet_redis import free_port, redis_server  # noqa: F401 - a fixture
from overlapcheck.fuzz.campaign import Campaign, Options, database_key
from overlapcheck.fuzz.db import FallbackDatabase, open_database, split_specs

LEAK = dict(faults=("retract-inferred-free",), checks=("kv-accounting",), shrink_seconds=5)
LEAK_ID = "kv-accounting-7cf0d53c40"


def _ids(summary) -> set:
    return {f["id"] for f in summary["findings"]}


def test_a_failing_example_one_campaign_found_is_replayed_first_by_another(tmp_path,
                                                                           redis_server):
    # B alone (seed 1) finds no leak in 40 examples; A (seed 7) finds it in 3
    alone = Campaign(Options(seconds=None, examples=5, seed=1, **LEAK)).run().summary()
    assert LEAK_ID not in _ids(alone)
    a = Campaign(Options(seconds=None, examples=10, seed=7, db=str(tmp_path / "a"),
                         shared_db=redis_server.url, **LEAK)).run().summary()
    assert LEAK_ID in _ids(a) and a["replayed"] == 0
    lines = []
    b = Campaign(Options(seconds=None, examples=5, seed=1, db=str(tmp_path / "b"),
                         shared_db=redis_server.url, progress=lines.append, **LEAK)).run()
    s = b.summary()
    found = {f["id"]: f for f in s["findings"]}
    # found among the saved examples, replayed before any example was generated
    assert 1 <= found[LEAK_ID]["examples_before"] <= s["replayed"]
    assert lines[0].startswith("database: ") and "replayed before generating" in lines[0]


# metrics findings at the first example, a parity finding some examples later (the 7th
# today; the budget leaves room for the case strategy's draws to move, and for how many
# examples the first Hypothesis run draws after its first failure, which stops 10 s after
# that failure; seed 3's came with the first once campaigns drew every example afresh,
# seed 2's once the prefix cache's draws were added)
TWO_RUNS = dict(faults=("lagged-verify-counted", "seq-lens-cpu-stale"), seed=2, examples=40,
                seconds=None)


def _saved(folder: str, opts: Options) -> dict:
    db, key = DirectoryBasedExampleDatabase(folder), database_key(opts)
    return {k: set(db.fetch(k)) for k in (key, key + b".secondary")}


def test_redis_killed_mid_campaign_goes_on_locally_says_so_once_loses_nothing(tmp_path,
                                                                             redis_server):
    lines, killed_at = [], []

    def kill_at_first_finding(found):
        if not killed_at:
            redis_server.kill()
            killed_at.append(found.examples_before)

    # seed 5: a finding after the first one's example (the access audit's draw moved
    # seed 2's findings into one example)
    runs = {**TWO_RUNS, "seed": 5}
    opts = Options(db=str(tmp_path / "local"), shared_db=redis_server.url, progress=lines.append,
                   on_finding=kill_at_first_finding, out=str(tmp_path / "out"), **runs)
    got = Campaign(opts).run().summary()
    control_opts = Options(db=str(tmp_path / "control"), **runs)
    control = Campaign(control_opts).run().summary()
    said = [line for line in lines if "shared example database" in line]
    assert len(said) == 1, lines
    assert f"{redis_server.url} lost" in said[0] and "going on with the local database" in said[0]
    # a finding of an example run after the kill is there, as without Redis
    assert _ids(got) == _ids(control)
    assert any(f["examples_before"] > killed_at[0] for f in got["findings"]), got["findings"]
    assert {f["id"]: f["examples_before"] for f in got["findings"]} == {
        f["id"]: f["examples_before"] for f in control["findings"]}
    # the local folder holds every example the control's folder does
    assert _saved(str(tmp_path / "local"), opts) == _saved(str(tmp_path / "control"), control_opts)
    assert all(_saved(str(tmp_path / "local"), opts).values())


def test_an_unreachable_redis_address_is_one_line_exit_2(capsys):
    from overlapcheck.cli import main
    url = f"redis://127.0.0.1:{free_port()}/0"
    for argv, says in (([url], "cannot reach the Redis server"), (["redis://"], "not a Redis"),
                       (["ftp://x/y"], "neither a folder"), ([url, url], "two shared")):
        assert main(["fuzz", "--examples", "1", *[x for a in argv for x in ("--db", a)]]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err, (argv, err)


def test_fallback_database_says_once_and_serves_nothing_after_an_error():
    class Flaky(InMemoryExampleDatabase):
        down = False

        def _up(self):
            if self.down:
                raise ConnectionError("connection refused")

        def save(self, key, value):
            self._up()
            super().save(key, value)

        def fetch(self, key):
            self._up()
            return super().fetch(key)

    inner, said = Flaky(), []
    db = FallbackDatabase(inner, "redis://x", said.append, (ConnectionError,))
    db.save(b"k", b"v")
    assert list(db.fetch(b"k")) == [b"v"] and db.lost is None
    inner.down = True
    db.save(b"k", b"w")
    db.save(b"k", b"x")
    assert list(db.fetch(b"k")) == [] and said == [
        "shared example database redis://x lost (ConnectionError: connection refused); "
        "going on with the local database"]


def test_database_specs(tmp_path, redis_server):
    assert split_specs(None) == (None, None)
    assert split_specs(["d", redis_server.url]) == ("d", redis_server.url)
    assert open_database(None, None) is None
    assert isinstance(open_database(str(tmp_path), None), DirectoryBasedExampleDatabase)
    shared = open_database(str(tmp_path), redis_server.url)
    shared.save(b"key", b"value")
    assert list(DirectoryBasedExampleDatabase(str(tmp_path)).fetch(b"key")) == [b"value"]
    assert list(open_database(str(tmp_path / "other"), redis_server.url).fetch(b"key")) == [b"value"]


def test_the_plugin_option_makes_every_test_use_the_shared_database(tmp_path, redis_server):
    (tmp_path / "test_user.py").write_text(
        "from hypothesis import given, settings, strategies as st\n"
        "from hypothesis.database import MultiplexedDatabase\n\n"
        "@given(st.integers())\n"
        "def test_uses_it(x):\n"
        "    assert isinstance(settings.default.database, MultiplexedDatabase)\n")
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    ok = subprocess.run(run + ["--overlapcheck-db", redis_server.url, "--overlapcheck-db",
                               str(tmp_path / "db")], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(run + ["--overlapcheck-db", f"redis://127.0.0.1:{free_port()}/0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 4 and "cannot reach the Redis server" in bad.stderr, bad.stderr

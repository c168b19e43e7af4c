"""targets.logs: a real engine's log lines, warnings and stderr writes go to the file
the environment names for the duration of a block, and nothing changes without it."""
import logging
import sys
import warnings

from overlapcheck.targets import logs


def test_routed_sends_the_engines_output_to_the_file_and_restores(tmp_path, monkeypatch, capsys):
    pattern = str(tmp_path / "engine-logs" / "eng-{pid}.log")
    monkeypatch.setenv(logs.ENV_VAR, pattern)
    root_before = list(logging.getLogger().handlers)
    with logs.routed():
        logging.getLogger("some.engine").warning("engine says hello")
        logging.getLogger("transformers").warning("transformers says hello")
        warnings.warn("an engine warning")
        print("a progress bar", file=sys.stderr)
    logging.getLogger("some.engine").warning("after the block")
    text = open(logs.path(), encoding="utf-8").read()
    for line in ("engine says hello", "transformers says hello", "an engine warning",
                 "a progress bar"):
        assert line in text, line
    assert "after the block" not in text
    assert logging.getLogger().handlers == root_before
    err = capsys.readouterr().err
    assert "engine says hello" not in err and "a progress bar" not in err


def test_without_a_path_nothing_changes(monkeypatch, capsys):
    monkeypatch.delenv(logs.ENV_VAR, raising=False)
    with logs.routed():
        print("still on the terminal", file=sys.stderr)
    assert "still on the terminal" in capsys.readouterr().err


def test_route_to_names_the_out_folder_unless_the_environment_does(tmp_path, monkeypatch):
    monkeypatch.setenv(logs.ENV_VAR, "")     # unset, and restored after the test
    pattern = logs.route_to(str(tmp_path), "sglang")
    assert pattern.endswith("engine-logs/sglang-{pid}.log") and str(tmp_path) in pattern
    monkeypatch.setenv(logs.ENV_VAR, "/elsewhere/x.log")
    assert logs.route_to(str(tmp_path), "sglang") == "/elsewhere/x.log"

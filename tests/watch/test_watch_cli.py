"""``overlapcheck watch -- python script.py``: exit statuses, the script's argv, bad
input as one line with status 2, and no torch import for ``--help`` or bad input."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "watch" / "programs"
RACY = str(PROGRAMS / "vllm_36013_accepted_tokens_read_before_d2h.py")


def watch(*argv, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "overlapcheck", "watch", *argv],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("argv, message", [
    ([], "no program to run"),
    (["--"], "no program to run"),
    (["--", "python"], "no program to run"),
    (["--", "python", "/no/such/script.py"], "no such script: /no/such/script.py"),
    (["--device", "tpu", "--", "python", RACY], "unknown device 'tpu'"),
    (["--mode", "panic", "--", "python", RACY], "unknown mode 'panic'"),
    (["--", "python", "-c", "pass"], "only `python script.py` or `python -m module`"),
])
def test_bad_input_is_one_line_and_status_2(argv, message):
    p = watch(*argv)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
    assert lines[0].startswith("overlapcheck watch: error:")


def test_a_race_gives_status_1_and_the_report(tmp_path):
    out = tmp_path / "r.json"
    p = watch("--device", "cpu", "--json", str(out), "--", "python", RACY)
    assert p.returncode == 1, p.stderr
    assert "race (host-read-before-copy)" in p.stderr
    assert "add `num_accepted_tokens_event.synchronize()` before line" in p.stderr
    assert "overlapcheck watch (cpu): 1 race" in p.stderr.strip().splitlines()[-1]
    data = json.loads(out.read_text())
    assert [r["kind"] for r in data["races"]] == ["host-read-before-copy"]


def test_the_twin_exits_0():
    p = watch("--device", "cpu", "--", sys.executable, RACY, "--fixed")
    assert p.returncode == 0, p.stderr
    assert "no race" in p.stderr


def test_raise_mode_stops_the_program_at_the_race():
    p = watch("--device", "cpu", "--mode", "raise", "--", "python", RACY)
    assert p.returncode == 1
    assert "RaceFound" in p.stderr and "vllm_36013_accepted_tokens_read_before_d2h.py" in p.stderr


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_the_script_keeps_its_argv_and_its_exit_status(tmp_path):
    script = _script(tmp_path, """
        import sys, torch
        open(sys.argv[0] + ".argv", "w").write(" ".join(sys.argv[1:]))
        torch.zeros(2, device="cuda").tolist()
        sys.exit(3)
    """)
    p = watch("--device", "cpu", "--", "python", script, "a", "--b", "c d")
    assert p.returncode == 3, p.stderr
    assert pathlib.Path(script + ".argv").read_text() == "a --b c d"


def test_a_crash_keeps_its_traceback_with_the_race_as_a_note(tmp_path):
    script = _script(tmp_path, """
        import torch
        pinned = torch.empty(4, pin_memory=True)
        pinned.copy_(torch.ones(4, device="cuda"), non_blocking=True)
        pinned.tolist()
        raise ValueError("the program's own error")
    """)
    p = watch("--device", "cpu", "--", "python", script)
    assert p.returncode == 1
    err = p.stderr
    assert "Traceback (most recent call last)" in err
    assert "ValueError: the program's own error" in err
    assert "overlapcheck watch found 1 race before this exception" in err
    assert "runpy" not in err.split("Traceback (most recent call last)")[1].split("ValueError")[0]


def test_a_module_runs_with_dash_m(tmp_path):
    (tmp_path / "engine_mod.py").write_text(textwrap.dedent("""
        import torch
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.ones(2, device="cuda")
        x.add_(1)
    """))
    p = watch("--device", "cpu", "--", "python", "-m", "engine_mod", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "race (stream-stream)" in p.stderr


PROBE = """
import sys
from overlapcheck.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


@pytest.mark.parametrize("argv", [["watch", "--help"], ["watch"],
                                  ["watch", "--device", "tpu", "--", "python", "x.py"],
                                  ["watch", "--", "python", "/no/such.py"]])
def test_help_and_bad_input_do_not_import_torch(argv):
    p = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.stdout.strip().splitlines()[-1] == "NO-TORCH", p.stderr


def test_the_command_alone_as_a_module():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = [sys.executable, "-m", "overlapcheck.watch"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no program" in p.stderr
    p = subprocess.run(run + ["--device", "cpu", "--", "python", RACY], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 1 and "race (host-read-before-copy)" in p.stderr


LAUNCHER = """\
import sys
from overlapcheck.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


def test_stacks_end_at_the_program_not_at_the_launcher(tmp_path):
    """Run as an installed console script runs it (a launcher file outside
    site-packages): the launcher's frame is not the program's."""
    launcher = tmp_path / "bin" / "overlapcheck"
    launcher.parent.mkdir()
    launcher.write_text(LAUNCHER)
    script = _script(tmp_path, """
        import torch

        def step(x):
            x.add_(1)

        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(a):
            x = torch.zeros(4, device="cuda")
        with torch.cuda.stream(b):
            step(x)
    """)
    out = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(launcher), "watch", "--device", "cpu", "--json",
                        str(out), "--", "python", script], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 1, p.stderr
    (race,) = json.loads(out.read_text())["races"]
    assert race["current"]["stack"] == ["prog.py:5 in step", "prog.py:11 in <module>"]
    assert race["previous"]["stack"] == ["prog.py:9 in <module>"]
    assert "overlapcheck:" not in p.stderr, p.stderr


def test_the_summary_counts_the_tensors_a_race_was_seen_on(tmp_path):
    script = _script(tmp_path, """
        import torch
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(a):
            bufs = [torch.zeros(4, device="cuda") for _ in range(10)]
        for t in bufs:
            with torch.cuda.stream(b):
                t.add_(1)
    """)
    p = watch("--device", "cpu", "--", "python", script)
    assert p.returncode == 1, p.stderr
    *_, seen, last = p.stderr.strip().splitlines()
    assert seen.startswith("overlapcheck watch: race [watch-")
    assert seen.endswith("] seen 10 times, on 10 tensors: 10 x device tensor float32[4] "
                         "allocated at prog.py:5")
    assert last.startswith("overlapcheck watch (cpu): 1 race (10 occurrences, on 10 tensors) in")


def test_the_summary_line_counts_in_words(tmp_path):
    script = _script(tmp_path, """
        import torch
        torch.zeros(2, device="cuda")
    """)
    p = watch("--device", "cpu", "--", "python", script)
    assert p.returncode == 0, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last == "overlapcheck watch (cpu): no race in 1 op on 1 stream"

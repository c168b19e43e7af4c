"""The command line answers --help and usage errors without importing torch (which
takes seconds): the engine and runtime load on first use."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = """
import sys
from overlapcheck.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


def _imports_torch(argv) -> bool:
    p = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True,
                       text=True, cwd=ROOT)
    return p.stdout.strip().splitlines()[-1] == "TORCH"


def test_help_and_usage_errors_do_not_import_torch():
    for argv in (["--help"], ["fuzz", "--help"], ["fuzz", "--fault", "nope"],
                 ["run", "--tp", "0"], ["replay", "/no/such/repro.yaml"], ["faults"]):
        assert not _imports_torch(argv), argv


def test_the_probe_sees_torch_when_a_command_needs_it():
    assert _imports_torch(["run", "--requests", "1"])

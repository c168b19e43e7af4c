"""bench/gpu_linear.py's input handling (its timings need a GPU: run it there)."""
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import gpu_linear  # noqa: E402


def test_tiles_expand_every_listed_value():
    tiles = gpu_linear.parse_tiles("kn/km:16:16/64:128:4:3, km:64:32:256:8:4:1/4")
    assert tiles == [(16, 128, 4, 3, False, 16, 1), (64, 128, 4, 3, False, 16, 1),
                     (16, 128, 4, 3, True, 16, 1), (64, 128, 4, 3, True, 16, 1),
                     (32, 256, 8, 4, True, 64, 1), (32, 256, 8, 4, True, 64, 4)]


@pytest.mark.parametrize("text,what", [("kn:16:16:64:4", "is not layout"),
                                       ("kn:16:16:x:4:3", "non-integer"),
                                       ("nk:16:16:64:4:3", "layout 'nk'"),
                                       ("km:16:0:64:4:3", "below 1"),
                                       ("km:16:16:64:4:3:0", "below 1"),
                                       ("km:16:16:64:4:3:2:1", "is not layout")])
def test_bad_tiles_are_named(text, what):
    with pytest.raises(ValueError, match=what):
        gpu_linear.parse_tiles(text)


def test_cli_rejects_bad_input_with_exit_2_before_touching_a_device():
    for args, what in ((["--sweep", "--tiles", "kn:16:16:64"], "--tiles"),
                       (["--rows", "1,0"], "--rows"), (["--models", "gpt-9"], "--models")):
        p = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_linear.py"), *args],
                           capture_output=True, text=True)
        assert p.returncode == 2, (args, p.stderr)
        assert what in p.stderr.strip().splitlines()[-1]


def test_shapes_are_the_models_matmuls():
    by = {s[0]: s for s in gpu_linear.shapes("llama-1b")}
    assert by["qkv"][1:3] == (2048, 2048 + 2 * 8 * 64)
    assert by["down"][1:3] == (8192, 2048) and by["head"][2] == 128256

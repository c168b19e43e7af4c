"""``overlapcheck run``: determinism across processes, text and JSON output, bad input."""
import json
import subprocess
import sys

import pytest
import yaml

from overlapcheck.cli import main

RUN = [sys.executable, "-m", "overlapcheck", "run"]


def test_json_is_byte_identical_across_processes(capsys):
    outs = [subprocess.run(RUN + ["--seed", "7", "--requests", "16", "--json"],
                           capture_output=True, text=True, check=True).stdout for _ in range(2)]
    assert outs[0] == outs[1]
    assert main(["run", "--seed", "7", "--requests", "16", "--json"]) == 0
    assert capsys.readouterr().out == outs[0]
    doc = json.loads(outs[0])
    assert len(doc["requests"]) == 16 and doc["races"] == []
    s = doc["summary"]
    assert s["tokens"] == sum(len(r["tokens"]) for r in doc["requests"])
    assert s["host_syncs"] == s["declared_syncs"]


def test_text_output_and_workload_file(tmp_path, capsys):
    wl = {"requests": [{"id": 0, "arrival": 0, "prompt": [1, 2, 3], "max_new_tokens": 5},
                       {"id": 1, "arrival": 2, "prompt": [4], "max_new_tokens": 9, "stop": [3],
                        "seed": 4, "sampling": "seeded"}],
          "aborts": [{"id": 1, "step": 40}]}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(wl))
    for flags in ([], ["--no-overlap"], ["--no-spec", "--page-size", "4"]):
        assert main(["run", "--workload", str(path)] + flags) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith("request 0: length, 5 tokens")
        assert out[-1].startswith("summary: steps")


BAD = [
    ({"requests": [{"id": 0, "prompt": [1], "max_new_tokens": 2, "colour": 1}]}, "unknown field 'colour'"),
    ({"requests": [{"id": 0, "prompt": [1], "max_new_tokens": -2}]}, "max_new_tokens: must be >= 1"),
    ({"requests": [{"id": 0, "prompt": [1], "max_new_tokens": 2, "arrival": -1}]}, "arrival: must be >= 0"),
    ({"requests": [{"id": 0, "prompt": list(range(200)), "max_new_tokens": 2}]}, "longer than the row width"),
    ({"requests": [{"id": 0, "prompt": [1], "max_new_tokens": 2}], "aborts": [{"id": 3, "step": 1}]},
     "no request with id 3"),
    ({"requests": []}, "non-empty list"),
    ("just a string", "expected a mapping"),
]


@pytest.mark.parametrize("doc, msg", BAD)
def test_bad_workload_is_one_line_exit_2(tmp_path, capsys, doc, msg):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", "--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, msg", [
    (["--workload", "/nonexistent.yaml"], "cannot read"),
    (["--requests", "0"], "--requests"),
    (["--schedule", "chaos"], "unknown schedule"),
    (["--page-size", "3"], "multiple of page_size"),
])
def test_bad_arguments_exit_2(capsys, argv, msg):
    assert main(["run"] + argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err


def test_invalid_yaml_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("requests: [1, 2\n")
    assert main(["run", "--workload", str(path)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["run", "--cuda-graphs"], "--cuda-graphs needs a GPU device"),
    (["fuzz", "--cuda-graphs", "--examples", "1"], "--cuda-graphs needs the reference engine on a GPU"),
])
def test_cuda_graphs_off_a_gpu_is_a_usage_error(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err

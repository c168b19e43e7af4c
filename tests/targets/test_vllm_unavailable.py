"""What the vLLM target says without vLLM, or with another version (one line naming
the install command; exit 2 on the command line), and what it checks before any run:
its config, its workloads, its run options. None of this needs vLLM, and importing
the target package never imports it."""
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest

from overlapcheck.protocol import RequestSpec, Workload, WorkloadError
from overlapcheck.protocol.target import TargetUnavailable
from overlapcheck.run import Case, CaseError
from overlapcheck.targets.vllm import VllmTarget, VllmTargetConfig

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)


def _fake_version(value):
    real = importlib.metadata.version

    def version(name):
        if name != "vllm":
            return real(name)
        if value is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return value
    return version


@pytest.mark.parametrize("value", [None, "0.32.1"])
def test_missing_or_other_version(monkeypatch, value):
    monkeypatch.setattr(importlib.metadata, "version", _fake_version(value))
    with pytest.raises(TargetUnavailable) as e:
        VllmTarget().version()
    msg = str(e.value)
    assert "\n" not in msg and "install-cpu.sh" in msg and "0.33.0" in msg


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_open_without_vllm():
    with pytest.raises(TargetUnavailable, match="install-cpu.sh"):
        VllmTarget().open(VllmTargetConfig(), None, None)


def _cli(args, tmp_path, version=None):
    """Run ``overlapcheck ARGS``; ``version``: a vllm of that version is what the
    interpreter finds first (a bare dist-info, enough for the version check)."""
    env = dict(os.environ)
    if version is not None:
        info = tmp_path / f"vllm-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "overlapcheck", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("command", [["fuzz", "--target", "vllm", "--time", "1"],
                                     ["run", "--target", "vllm"]])
def test_cli_other_version_is_one_line_exit_2(tmp_path, command):
    out = _cli(command, tmp_path, version="0.32.1")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "found 0.32.1" in lines[0]
    assert "bash overlapcheck/targets/vllm/install-cpu.sh" in lines[0]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_cli_missing_vllm_is_one_line_exit_2(tmp_path):
    out = _cli(["fuzz", "--target", "vllm", "--time", "1"], tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "not installed" in lines[0] and "install-cpu.sh" in lines[0]


def test_cli_unknown_target_is_one_line_exit_2(tmp_path):
    out = _cli(["fuzz", "--target", "vlm"], tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown target 'vlm'" in lines[0] and "vllm" in lines[0]


def test_import_does_not_import_vllm():
    code = ("import sys; import overlapcheck.targets.vllm as t; "
            "import overlapcheck.targets.vllm.strategies; t.VllmTarget().default_config(); "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("bad", [
    {"scheduler": "eager"}, {"batch_queue": 4}, {"num_blocks": 3}, {"spec_tokens": -1},
    {"faults": ("no-such-fault",)}, {"max_num_batched_tokens": 4}, {"block_size": "4"},
])
def test_bad_config_is_one_line(bad):
    with pytest.raises(ValueError) as e:
        VllmTargetConfig(**bad)
    assert "\n" not in str(e.value) and str(e.value).startswith("vllm config:")


def test_config_round_trip_and_unknown_field():
    cfg = VllmTargetConfig(faults=("free-ignores-fence",), defer_block_free=True)
    t = VllmTarget()
    assert t.config_from_dict(t.config_to_dict(cfg)) == cfg
    with pytest.raises(ValueError, match="unknown field 'pages'"):
        t.config_from_dict({"pages": 3})
    ref = t.reference_config(cfg)
    assert (ref.scheduler, ref.batch_queue, ref.faults) == ("sync", 1, ())


def _request(prompt, max_new, stop=()):
    return Workload((RequestSpec(0, 0, tuple(prompt), max_new, tuple(stop), 0, "greedy"),))


def test_workloads_are_checked_against_the_config():
    t, cfg = VllmTarget(), VllmTargetConfig(max_model_len=20, spec_tokens=3, vocab=16)
    assert cfg.max_context == 16
    t.check_workload(_request([1, 2], 14, [15]), cfg)
    for bad, why in (((range(2), 15), "exceeds the 16 tokens"),
                     (([1, 16], 2), "token ids must lie in 0..15"),
                     (([1], 2, [16]), "token ids must lie in 0..15")):
        with pytest.raises(WorkloadError, match=why):
            t.check_workload(_request(*bad), cfg)


def test_a_case_that_does_not_fit_is_refused_before_any_run():
    doc = {"target": "vllm", "config": {"max_model_len": 20, "spec_tokens": 3},
           "workload": {"requests": [{"id": 0, "prompt": [1, 2], "max_new_tokens": 15}]}}
    with pytest.raises(CaseError, match="exceeds the 16 tokens") as e:
        Case.from_dict(doc)
    assert "\n" not in str(e.value)
    doc["workload"]["requests"][0]["prompt"] = list(range(16))
    with pytest.raises(CaseError, match="16 tokens is longer"):
        Case.from_dict(doc)


@pytest.mark.parametrize("seed", range(5))
def test_generated_workloads_fit(seed):
    t = VllmTarget()
    for cfg in (VllmTargetConfig(), VllmTargetConfig(max_model_len=8, spec_tokens=4, vocab=5,
                                                     num_blocks=4, max_num_batched_tokens=256)):
        w = t.generate(seed, 12, cfg)
        t.check_workload(w, cfg)
        assert len(w.requests) == 12 and w == t.generate(seed, 12, cfg)


@pytest.mark.parametrize("options, why", [({"device": "cuda"}, "GPU backend"),
                                          ({"model": "oracle"}, "no model"),
                                          ({"runtime": object()}, "unknown run option 'runtime'"),
                                          ({"device": "tpu"}, "unknown device")])
def test_run_options_it_cannot_honour(options, why):
    with pytest.raises(ValueError, match=why) as e:
        VllmTarget().open(VllmTargetConfig(), None, None, **options)
    assert "\n" not in str(e.value)

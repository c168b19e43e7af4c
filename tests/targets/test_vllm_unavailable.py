"""Without vLLM, or with another version, the vLLM target says so in one line naming
the install command; importing the target package never imports vLLM."""
import importlib.metadata
import subprocess
import sys

import pytest

from overlapcheck.targets.base import TargetUnavailable
from overlapcheck.targets.vllm import VllmTarget, VllmTargetConfig


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
    with pytest.raises(TargetUnavailable):
        VllmTarget().open(VllmTargetConfig(), None)


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

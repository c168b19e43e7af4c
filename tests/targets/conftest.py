"""Fixtures shared by the engine targets' tests."""
import importlib.util

import pytest


@pytest.fixture(scope="module")
def sglang():
    """Skip where SGLang 0.5.23 is not installed. SGLang is not imported here: the
    target imports it itself, with its environment set first (``env.stubbed``: Triton
    kernels must be defined as interpreted functions for the real workers' twins)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed (bash overlapcheck/targets/sglang/install-cpu.sh)")
    from overlapcheck.protocol.target import TargetUnavailable
    from overlapcheck.targets.sglang import SglangTarget
    try:
        SglangTarget().version()
    except TargetUnavailable as e:
        pytest.skip(str(e))

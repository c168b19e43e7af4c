"""``plainyaml.load`` gives ``yaml.safe_load``'s result, or raises its error type, on every
document: plain data written by PyYAML in both styles, scalars of every implicit form,
and the constructs it hands to ``safe_load`` whole (anchors, merge keys, tags, several
documents); a large workload loads from JSON or YAML alike."""
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapcheck import plainyaml
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol.workload import dump, generate, load

_SCALARS = st.one_of(st.integers(-10 ** 20, 10 ** 20), st.booleans(), st.none(),
                     st.floats(allow_nan=False), st.text(max_size=12),
                     st.sampled_from(["010", "0x1F", "1_000", "+5", "-0", "1:30", "1e5", ".inf",
                                      "yes", "No", "~", "null", "2001-12-14", "=", "<<", "0o7"]))
_DATA = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 99)), inner, max_size=4)),
    max_leaves=20)


def _both(text):
    def run(f):
        try:
            return "ok", f(text)
        except yaml.YAMLError as e:
            return "error", type(e).__name__
    return run(yaml.safe_load), run(plainyaml.load)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_DATA, st.sampled_from([None, False, True]))
def test_what_pyyaml_writes_reads_back_as_safe_load_reads_it(data, flow):
    text = yaml.safe_dump(data, default_flow_style=flow)
    want, got = _both(text)
    assert got == want


@pytest.mark.parametrize("text", [
    "", "a: 1", "- 010\n- 0x1F\n- 1_000\n- +5\n- -0\n- 1:30\n- 1.5\n- .inf\n- ~\n- yes\n- '7'",
    "- 2001-12-14\n- !!str 5\n- ! 5", "a: &x [1]\nb: *x", "<<: {a: 1}\nb: 2", "{a: 1, a: 2}",
    "[1, [2, {3: 4}]]", "---\na: 1\n---\nb: 2", "? [1]\n: 2", "=", "x: =", "!!set {a, b}",
    "a: [1, 2", "- !!python/object:os.system [ls]", "\"\\x41\"", "a: !!binary aGk="])
def test_hand_made_documents(text):
    want, got = _both(text)
    assert got == want


def test_a_large_workload_reads_the_same_from_json_and_yaml(tmp_path):
    cfg = EngineConfig()
    wl = generate(3, 2000, cfg)
    doc = dump(wl)
    (tmp_path / "w.json").write_text(json.dumps(doc))
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(doc))
    assert load(str(tmp_path / "w.json"), cfg) == load(str(tmp_path / "w.yaml"), cfg) == wl

"""An engine exception's finding is named by its type and the file and function of its
frame, not the line: an edit elsewhere in the file keeps the bug's id. Repros and known
keys written the first way (file:line) still stand for the same bug."""
import os

from overlapcheck.protocol.finding import ENGINE_EXCEPTION
from overlapcheck.protocol.finding import is_known, same_bug
from overlapcheck.repro import load, replay
from overlapcheck.run.driver import _exception_finding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def boom(where: str):
    if where == "top":
        raise IndexError("index 44 is out of bounds")
    filler = [where] * 3      # lines between the two raises: a later edit moved it
    del filler
    raise IndexError("index 45 is out of bounds")


def other():
    raise IndexError("index 44 is out of bounds")


def _finding(fn, *args):
    try:
        fn(*args)
    except IndexError as e:
        return _exception_finding(e, 7)
    raise AssertionError("no exception")


def test_the_site_names_the_function_and_the_text_the_line():
    top, bottom = _finding(boom, "top"), _finding(boom, "bottom")
    assert top.key == bottom.key == (ENGINE_EXCEPTION, "IndexError", "test_finding_sites.py:boom")
    assert top.ident == bottom.ident
    assert "(at test_finding_sites.py:" in top.text and ", in boom)" in top.text
    assert top.text != bottom.text                            # the lines differ
    assert _finding(other).key != top.key                     # another function: another bug


def test_a_site_of_the_first_form_is_the_same_bug_in_the_same_file_only():
    new = (ENGINE_EXCEPTION, "IndexError", "oracle.py:OracleModel.raw_hash")
    assert same_bug((ENGINE_EXCEPTION, "IndexError", "oracle.py:97"), new)
    assert same_bug(new, new)
    assert not same_bug((ENGINE_EXCEPTION, "KeyError", "oracle.py:97"), new)
    assert not same_bug((ENGINE_EXCEPTION, "IndexError", "worker.py:97"), new)
    assert not same_bug((ENGINE_EXCEPTION, "IndexError", "oracle.py:OracleModel.other"), new)
    assert not same_bug(("parity", "IndexError", "oracle.py:97"), ("parity", "IndexError",
                                                                    "oracle.py:f"))
    known = frozenset({(ENGINE_EXCEPTION, "IndexError", "oracle.py:97"), ("metrics", "x")})
    assert is_known(new, known) and is_known(("metrics", "x"), known)
    assert not is_known((ENGINE_EXCEPTION, "IndexError", "worker.py:f"), known)


def test_a_repro_written_with_a_line_site_still_reproduces():
    r = load(os.path.join(ROOT, "tests", "data", "repros_v1",
                          "no-copy-done-wait--engine-exception-c453152e63.yaml"))
    assert r.finding.site == ("IndexError", "oracle.py:97")
    res = replay(r)
    assert res.verdict == "reproduced", res.detail
    assert res.outcome.findings and any(
        f.key[:2] == (ENGINE_EXCEPTION, "IndexError") and f.key[2].startswith("oracle.py:")
        and not f.key[2][len("oracle.py:"):].isdigit() for f in res.outcome.findings)

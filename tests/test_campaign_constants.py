"""A campaign's cases follow its seed alone, not what else the process imported:
Hypothesis mixes integer literals of the loaded local modules into a share of its
draws, and the campaign pins that pool empty (``campaign.fixed_constants``). The same
campaign run with a module of unusual literals imported first draws the same cases;
with the pin taken away it does not (the planted control that shows the test can
fail)."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    extra, unpinned = sys.argv[1] == "1", sys.argv[2] == "1"
    sys.path.insert(0, sys.argv[3])
    if extra:
        import literals_here       # a local module: Hypothesis reads its literals
    from overlapcheck.fuzz import campaign as C
    if unpinned:                   # the control: Hypothesis's own behaviour
        C.fixed_constants.__enter__ = lambda self: self
        C.fixed_constants.__exit__ = lambda self, *exc: False
    sys.path.insert(0, sys.argv[4])
    import fingerprint
    rows = fingerprint.record(C.Options(seconds=None, examples=60, seed=5, out=None))
    print(json.dumps([r[0] for r in rows]))
""")


def _cases(tmp_path, extra: bool, unpinned: bool = False) -> list:
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(int(extra)), str(int(unpinned)),
                        str(tmp_path), os.path.join(ROOT, "bench")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_imported_literals_do_not_move_a_campaigns_cases(tmp_path):
    # what Hypothesis collects: integers of magnitude 100 and up, floats, short strings
    (tmp_path / "literals_here.py").write_text(
        "X = [101, 137, 150, 199, 250, 333, 512, 777, 999, 4242, 65535, 0.37, 0.61, 1.5]\n")
    plain = _cases(tmp_path, extra=False)
    assert len(plain) == 60
    assert _cases(tmp_path, extra=True) == plain
    # the control: without the pin the same import changes what is drawn
    assert _cases(tmp_path, extra=True, unpinned=True) != _cases(tmp_path, extra=False,
                                                                   unpinned=True)

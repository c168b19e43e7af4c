"""The pytest plugin costs nothing where it is not used: collecting a suite imports no
Hypothesis through it, it leaves a suite's own Hypothesis profile alone (even with
``CI`` set), and its own profiles are prefixed and registered only on request."""
import importlib.metadata
import os
import subprocess
import sys
import textwrap

ENV = dict(os.environ, CI="true")
# the plugin through its entry point where the package is installed, else by name
_INSTALLED = any(ep.value == "overlapcheck.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
PLUGIN = [] if _INSTALLED else ["-p", "overlapcheck.pytest_plugin"]


def _suite(tmp_path, conftest: str, test: str):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(conftest))
    (tmp_path / "test_user.py").write_text(textwrap.dedent(test))


def _pytest(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *PLUGIN, *args, str(tmp_path)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)


def test_collecting_with_the_plugin_imports_no_hypothesis(tmp_path):
    _suite(tmp_path, "", """
        import sys

        def test_no_hypothesis():
            assert "hypothesis" not in sys.modules
            assert "torch" not in sys.modules
    """)
    # Hypothesis' own plugin is switched off: only ours could import it
    r = _pytest(tmp_path, "-p", "no:hypothesispytest")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_suite_keeps_its_own_profile_under_ci(tmp_path):
    _suite(tmp_path, """
        from hypothesis import settings
        settings.register_profile("mine", max_examples=7)
        settings.load_profile("mine")
    """, """
        from hypothesis import settings

        def test_profile():
            assert settings.get_current_profile_name() == "mine"
            assert settings.default.max_examples == 7
    """)
    r = _pytest(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_our_profiles_are_prefixed_and_loaded_only_on_request(tmp_path):
    _suite(tmp_path, "", """
        from hypothesis import settings

        def test_profile():
            assert settings.get_current_profile_name() == "overlapcheck-ci"
            assert settings.default.derandomize and settings.default.database is None
    """)
    r = _pytest(tmp_path, "--hypothesis-profile", "overlapcheck-ci")
    assert r.returncode == 0, r.stdout + r.stderr
    from overlapcheck.profiles import NAMES
    assert all(n.startswith("overlapcheck-") for n in NAMES)

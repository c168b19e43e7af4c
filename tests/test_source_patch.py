"""The one source-patch mechanism (overlapcheck/faults/patch.py), on a small package
written for the test: a function or method recompiled from its own source with exact
edits (each matching once), in its module's namespace with extra names on top, with
zero-argument super() working; installed wherever the package holds it (by any name)
and put back; bound to one instance; refusing what it cannot patch faithfully."""
import importlib
import sys
import textwrap
import traceback

import pytest

from overlapcheck.faults.patch import (FunctionPatch, PatchMismatch, install_all, recompiled,
                                       replaced, uninstall)

BASE = '''
SCALE = 2


def double(x):
    return x * SCALE


class Base:
    def size(self):
        return 1


class Pool(Base):
    def size(self):
        return super().size() + 10

    def __secret(self):
        return "hidden"

    def peek(self):
        return self.__secret()


def boom():
    raise ValueError("in the engine")


def deco(fn):
    fn.marked = True
    return fn


class Kept(Base):
    @deco
    def size(self, extra=0):
        return super().size() + extra
'''

USER = '''
from .base import double as _double, Pool


def use(x):
    return _double(x)
'''


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    root = tmp_path / "ocpkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "base.py").write_text(textwrap.dedent(BASE))
    (root / "user.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    base = importlib.import_module("ocpkg.base")
    user = importlib.import_module("ocpkg.user")
    yield base, user
    for n in [n for n in sys.modules if n == "ocpkg" or n.startswith("ocpkg.")]:
        del sys.modules[n]


def test_a_function_is_recompiled_with_its_edit_and_installed_where_held(pkg):
    base, user = pkg
    orig = base.double
    patch = recompiled("ocpkg.base:double", [("x * SCALE", "x * SCALE + BONUS")], "fault t",
                       extra={"BONUS": 1})
    with replaced([patch], "ocpkg."):
        assert base.double(3) == 7 and user.use(3) == 7       # the alias _double too
        base.SCALE = 3                                         # the module's live names
        assert base.double(3) == 10
    assert base.double is orig and user._double is orig and user.use(3) == 9


def test_a_method_keeps_super_and_private_names(pkg):
    base, _ = pkg
    size = recompiled("ocpkg.base:Pool.size", [("+ 10", "+ 20")], "fault t")
    peek = recompiled("ocpkg.base:Pool.peek", [("__secret()", "__secret() + '!'")], "fault t")
    with replaced([size, peek]):
        assert base.Pool().size() == 21 and base.Pool().peek() == "hidden!"
    assert base.Pool().size() == 11


def test_a_traceback_names_the_patch_and_the_engines_line(pkg):
    base, _ = pkg
    patch = recompiled("ocpkg.base:boom", [('"in the engine"', '"pre-fix"')], "fault t")
    with replaced([patch]):
        with pytest.raises(ValueError, match="pre-fix") as e:
            base.boom()
    frame = traceback.extract_tb(e.value.__traceback__)[-1]
    assert frame.filename == "<overlapcheck fault t>"
    assert frame.lineno == base.boom.__code__.co_firstlineno + 1


@pytest.mark.parametrize("edit,times", [(("x * 3", "x"), 0), (("return", "return"), 1)])
def test_an_edit_must_match_exactly_once(pkg, edit, times):
    if times == 1:
        recompiled("ocpkg.base:double", [edit], "fault t")       # once: fine
        edit = ("s", "S")                                         # "self"... many times
        target = "ocpkg.base:Pool.size"
        with pytest.raises(PatchMismatch, match=r"fault t: its edit matches [2-9] times in "
                                                r"ocpkg.base:Pool.size \(expected once: not "
                                                r"Engine 1.0\?\)"):
            recompiled(target, [edit], "fault t", engine="Engine 1.0")
        return
    with pytest.raises(PatchMismatch, match="its edit matches 0 times"):
        recompiled("ocpkg.base:double", [edit], "fault t")


def test_a_decorated_method_keeps_its_decorator_super_and_new_defaults(pkg):
    base, _ = pkg
    p = recompiled("ocpkg.base:Kept.size", [("extra=0", "extra=5")], "fault t")
    with replaced([p]):
        assert base.Kept.size.marked and base.Kept().size() == 6
    assert base.Kept().size() == 1


def test_what_has_no_source_is_refused(pkg):
    with pytest.raises(PatchMismatch, match="fault t: ocpkg.base:SCALE has no source to edit"):
        recompiled("ocpkg.base:SCALE", [], "fault t")


def test_a_function_patch_binds_one_instance_or_installs_everywhere(pkg):
    base, user = pkg
    p = FunctionPatch("ocpkg.base:Pool.size", (("\n        return super().size() + 10\n",
                                               "\n        return super().size() + 30\n"),))
    one, other = base.Pool(), base.Pool()
    p.bind(one)
    assert one.size() == 31 and other.size() == 11
    p.unbind(one)
    assert one.size() == 11
    q = FunctionPatch("ocpkg.base:double", (("x * SCALE", "-x"),))
    saved = q.install()
    assert user.use(2) == -2
    uninstall(saved)
    assert user.use(2) == 4


def test_an_install_that_fails_midway_puts_back_what_it_did(pkg):
    base, _ = pkg
    orig = base.double
    good = recompiled("ocpkg.base:double", [("x * SCALE", "x")], "fault t")

    class Frozen:
        __slots__ = ()
    with pytest.raises(AttributeError):
        install_all([good, (Frozen(), "x", None, 1)])
    assert base.double is orig

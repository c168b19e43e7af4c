"""docs/design.md describes the code as it is: a table of contents that lists its
sections in order, sections numbered in order, and every file path and every dotted
``module.function`` / ``Class.member`` name it writes in backticks exists.

What counts as a name: a backticked token holding a ``/`` or ending in a file suffix
is a path (relative to the repository root or to one of its packages; ``*`` globs);
a dotted token whose first part is a project module or package, or a class defined in
the project, is a name, resolved over the source (no import): a module, then a class,
function or assignment in it, then a member of that class (method, attribute, field).
A token starting with one of the variables the document uses for instances (``rt.``,
``cfg.``, ``model.`` ...) or with an outside library (``torch.``) names no code of
ours and is skipped, as are a path into a pinned engine's own source (``vllm/...``,
``sglang/...``), a rate (``checked/s``), commands, flags and single words."""
import ast
import glob
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
DOC = os.path.join(ROOT, "docs", "design.md")
PACKAGES = ("overlapcheck", "invariants", "fake_models", "bench", "ci", "tests")
SUFFIXES = (".py", ".md", ".yml", ".yaml", ".txt", ".sh", ".json", ".toml")
# first parts that name an instance or an outside library, not our code
NOT_OURS = {"rt", "s", "e", "t", "buf", "cfg", "model", "head", "self", "torch", "nn", "tl",
            "np", "triton", "req", "sp", "hypothesis", "dev", "batch", "session", "target",
            "out", "ev", "case", "spec", "x", "os", "sys", "vllm", "sglang", "transformers"}
# the pinned engines whose source a document cites by path
ENGINES = {"vllm", "sglang"}


def _text(doc: str = DOC) -> str:
    return open(doc, encoding="utf-8").read()


# the module map and the targets' guide name files and functions too
OTHER_DOCS = [os.path.join(ROOT, "docs", d) for d in ("structure.md", "targets.md")]


def _tokens(text: str):
    # code spans outside fenced blocks
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"`([^`\n]+)`", text):
        yield m.group(1).strip()


class Index:
    """Modules, their top-level names and each class's members, from the source."""

    def __init__(self):
        self.modules = {}          # dotted module -> set of top-level names
        self.classes = {}          # class name -> set of members (over every class so named)
        self.module_classes = {}   # (module, class) -> members
        for top in PACKAGES:
            for folder, _, files in os.walk(os.path.join(ROOT, top)):
                for f in files:
                    if f.endswith(".py"):
                        self._add(os.path.join(folder, f))

    def _add(self, path: str) -> None:
        rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
        if rel[-1] == "__init__":
            rel = rel[:-1]
        mod = ".".join(rel)
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except SyntaxError:
            return
        names = set()
        body = list(tree.body)
        for node in list(body):     # what a module defines under try/except or if, too
            if isinstance(node, ast.Try):
                body += node.body + [n for h in node.handlers for n in h.body] + node.orelse
            elif isinstance(node, ast.If):
                body += node.body + node.orelse
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                for t in node.targets:
                    if isinstance(t, ast.Tuple):
                        names.update(e.id for e in t.elts if isinstance(e, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            if isinstance(node, ast.ClassDef):
                members = self._members(node)
                self.classes.setdefault(node.name, set()).update(members)
                self.module_classes[(mod, node.name)] = members
        self.modules[mod] = names

    @staticmethod
    def _members(cls: ast.ClassDef) -> set:
        out = set()
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out.add(t.id)
                    elif isinstance(t, ast.Attribute):
                        out.add(t.attr)
            elif isinstance(node, ast.AnnAssign):
                t = node.target
                out.add(t.id if isinstance(t, ast.Name) else getattr(t, "attr", ""))
        return out

    def module_names(self) -> set:
        """Every module's dotted path and each of its suffixes (``run.driver``)."""
        out = set()
        for m in self.modules:
            parts = m.split(".")
            out.update(".".join(parts[i:]) for i in range(len(parts)))
        return out

    def resolves(self, name: str) -> bool:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):      # the longest module path (or its tail)
            head = ".".join(parts[:i])
            for m in self.modules:
                if (m == head or m.endswith("." + head)) and self._in_module(m, parts[i:]):
                    return True
        return len(parts) == 2 and parts[1] in self.classes.get(parts[0], ())

    def _in_module(self, mod: str, rest) -> bool:
        """``rest``: nothing, a name defined in ``mod``, or a class of it and a member."""
        if not rest:
            return True
        if len(rest) > 2 or rest[0] not in self.modules[mod]:
            return False
        return len(rest) == 1 or rest[1] in self.module_classes.get((mod, rest[0]), ())


INDEX = Index()


def _kind(token: str):
    """("path", p), ("name", n) or None for a token that names nothing of ours."""
    if " " in token or token.startswith("-") or token.startswith("<"):
        return None
    t = token.split("(")[0].split("[")[0].rstrip(":,")
    t, _, test = t.partition("::")          # a pytest node id: its file, then its test
    if test and not _defines(t, test):
        return ("path", f"{t}::{test}")
    if "/" in t or t.endswith(SUFFIXES):
        if t.startswith(("http", "/", "~")) or "{" in t or t.startswith("."):
            return None
        if t.split("/")[0] in ENGINES or t.endswith("/s"):
            return None             # the engine's own source; a rate
        if "/" not in t and t.endswith(".json"):
            return None             # a file a command writes (summary.json)
        return ("path", t)
    if re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", t):
        first = t.split(".")[0]
        if first in NOT_OURS:
            return None
        if first in INDEX.classes or first in INDEX.module_names() or first in PACKAGES:
            return ("name", t)
    return None


def _defines(path: str, name: str) -> bool:
    full = os.path.join(ROOT, path)
    return os.path.exists(full) and f"def {name}(" in open(full, encoding="utf-8").read()


def _path_exists(p: str) -> bool:
    """Relative to the root or a package; else, a path given after its folder (a module
    the text is about, ``drafts_round.py``, ``vllm/checkers/``) anywhere in the project."""
    p = p.rstrip("/")
    bases = ("", "docs/") + tuple(f"{top}/" for top in PACKAGES)
    if any(glob.glob(os.path.join(ROOT, base + p)) for base in bases):
        return True
    return any(glob.glob(os.path.join(ROOT, top, "**", p), recursive=True) for top in PACKAGES)


@pytest.mark.parametrize("doc", [DOC] + OTHER_DOCS, ids=os.path.basename)
def test_every_path_named_exists(doc):
    missing = sorted({t[1] for t in (_kind(x) for x in _tokens(_text(doc)))
                      if t and t[0] == "path" and not _path_exists(t[1])})
    assert missing == [], missing


@pytest.mark.parametrize("doc", [DOC] + OTHER_DOCS, ids=os.path.basename)
def test_every_dotted_name_exists(doc):
    missing = sorted({t[1] for t in (_kind(x) for x in _tokens(_text(doc)))
                      if t and t[0] == "name" and not INDEX.resolves(t[1])})
    assert missing == [], missing


def _headings(text: str):
    for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)\.? (.*)$", text, flags=re.M):
        yield m.group(1), m.group(2).strip()


def test_sections_are_in_order():
    nums = [tuple(int(x) for x in n.split(".")) for n, _ in _headings(_text())]
    assert nums == sorted(nums) and len(set(nums)) == len(nums), nums


def test_the_contents_list_every_section():
    text = _text()
    contents = text[text.index("## Contents"):]
    contents = contents[:contents.index("\n## ", 3)]
    for num, title in _headings(text):
        assert f"{num} " in contents or f"{num}. " in contents, (num, title)


@pytest.mark.parametrize("token,kind", [
    ("overlapcheck/protocol/events.py", "path"), ("run.driver.execute", "name"),
    ("Engine._scheduler_step", "name"), ("rt.launch(s, fn)", None), ("--fault", None),
    ("engine/events.py", "path"), ("protocol.finding.same_bug", "name")])
def test_token_kinds(token, kind):
    got = _kind(token)
    assert (got[0] if got else None) == kind


def test_a_missing_name_is_caught():
    assert not INDEX.resolves("run.driver.run_case") and not INDEX.resolves("Engine.no_such")
    assert INDEX.resolves("protocol.finding.same_bug") and INDEX.resolves("Canary.backup")
    assert not _path_exists("engine/events.py") and _path_exists("protocol/events.py")

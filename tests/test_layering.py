"""The seams the design promises, checked over the source: the engine imports no
checker, fuzzer, repro, run driver or command line; the fake models import no engine;
no two packages import each other; only the device runtime knows backend names; every
fault's documented site holds its guard; the device registry's flags match the
runtimes'."""
import ast
import collections
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
PACKAGES = ("overlapcheck", "invariants", "fake_models")


def _modules():
    for top in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                    if rel[-1] == "__init__":
                        rel = rel[:-1]
                    yield ".".join(rel), path, f == "__init__.py"


def _imports(mod: str, path: str, is_pkg: bool):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            if n.level:
                base = mod.split(".")
                base = base[:len(base) - n.level + (1 if is_pkg else 0)]
                name = ".".join(base + ([n.module] if n.module else []))
            else:
                name = n.module or ""
            yield name, [a.name for a in n.names]
        elif isinstance(n, ast.Import):
            for a in n.names:
                yield a.name, []


def _case_strategy_modules():
    """The modules targets name as their fuzz case strategy: the fuzzer imports them and
    the target never does (``targets/base.py``), so they count as the fuzzer's."""
    import importlib
    from overlapcheck.targets import TARGETS
    out = set()
    for path in TARGETS.values():
        module, cls = path.split(":")
        named = getattr(importlib.import_module(module), cls).case_strategy
        if named:
            out.add(named.split(":")[0])
    return out


CASE_STRATEGIES = _case_strategy_modules()


def _area(mod: str) -> str:
    """The package a module belongs to: ``overlapcheck.<sub>`` or a top-level one."""
    if mod in CASE_STRATEGIES:
        return "overlapcheck.fuzz"
    parts = mod.split(".")
    return ".".join(parts[:2]) if parts[0] == "overlapcheck" and len(parts) > 1 else parts[0]


def import_graph():
    """(module -> modules it imports) and (area -> areas it imports), project only."""
    mods, areas = {}, collections.defaultdict(set)
    known = {m for m, _, _ in _modules()}
    for mod, path, is_pkg in _modules():
        got = set()
        for name, names in _imports(mod, path, is_pkg):
            if name.split(".")[0] not in PACKAGES:
                continue
            # "from pkg import module" imports the module
            got.update(f"{name}.{x}" if f"{name}.{x}" in known else name for x in names or [""])
        got = {g.rstrip(".") for g in got}
        mods[mod] = got
        for g in got:
            if _area(g) != _area(mod):
                areas[_area(mod)].add(_area(g))
    return mods, areas


MODS, AREAS = import_graph()


def test_the_engine_imports_only_device_faults_seeds_and_itself():
    # and plainyaml, a leaf that reads YAML (workload files) and imports nothing of ours
    allowed = ("overlapcheck.engine", "overlapcheck.device", "overlapcheck.faults",
               "overlapcheck.seeds", "overlapcheck.plainyaml", "overlapcheck")
    bad = {m: sorted(g for g in got if _area(g) not in allowed)
           for m, got in MODS.items() if m.startswith("overlapcheck.engine")}
    assert not {m: g for m, g in bad.items() if g}


def test_fake_models_import_no_engine():
    bad = {m: sorted(g for g in got if g.startswith("overlapcheck.engine"))
           for m, got in MODS.items() if m.startswith("fake_models")}
    assert not {m: g for m, g in bad.items() if g}


def test_no_import_loops_between_packages():
    loops = sorted((a, b) for a in AREAS for b in AREAS[a] if a < b and a in AREAS.get(b, ()))
    # the package root (version) and the command line import subcommand modules by name
    assert loops == [], loops


# these read torch's own device strings ("cuda:0" in a user's tensor factory), which
# are not backend names: the watch shim gives them a CPU meaning
# files comparing *torch* device types (of a user's tensors, or where a model's kernels
# run), not backend names
TORCH_DEVICE_STRINGS = {os.path.join("overlapcheck", "watch", f) for f in ("shim.py", "mode.py")} | {
    os.path.join("fake_models", "hf", "kernels.py")}


def test_only_the_device_runtime_names_backends():
    pattern = re.compile(r'[!=]= "(sim|cuda)"')
    hits = []
    for folder in ("overlapcheck", "invariants", "fake_models", "bench", "ci", "tests"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            if os.path.join("overlapcheck", "device") in base:
                continue
            for f in files:
                if os.path.relpath(os.path.join(base, f), ROOT) in TORCH_DEVICE_STRINGS:
                    continue
                if f.endswith(".py"):
                    path = os.path.join(base, f)
                    for i, line in enumerate(open(path, encoding="utf-8"), 1):
                        if pattern.search(line):
                            hits.append(f"{os.path.relpath(path, ROOT)}:{i}")
    assert hits == []


def _function_source(path: str, qualname: str) -> str:
    src = open(path, encoding="utf-8").read()
    cls, _, name = qualname.rpartition(".")
    tree = ast.parse(src)
    if not cls:     # a module-level function
        for n in tree.body:
            if isinstance(n, ast.FunctionDef) and n.name == name:
                return ast.get_source_segment(src, n)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for n in node.body:
                if isinstance(n, ast.FunctionDef) and n.name == name:
                    return ast.get_source_segment(src, n)
    raise AssertionError(f"{qualname} not found in {path}")


@pytest.mark.parametrize("name", sorted(__import__("overlapcheck.faults", fromlist=["FAULTS"]).FAULTS))
def test_each_fault_site_holds_its_guard(name):
    from overlapcheck.faults import FAULTS
    path, qualname = FAULTS[name].site.split(" ", 1)
    body = _function_source(os.path.join(ROOT, "overlapcheck", path), qualname)
    assert f'.on("{name}")' in body, f"{FAULTS[name].site} does not ask for {name!r}"


def test_device_registry_flags_are_the_runtimes():
    import importlib
    from overlapcheck.device import DEVICES
    for info in DEVICES.values():
        module, cls = info.runtime.split(":")
        rt = getattr(importlib.import_module(module), cls)
        assert (rt.replayable, rt.host_flags, rt.cpu_work, rt.gpu) == (
            info.replayable, info.host_flags, info.cpu_work, info.gpu), info.name


if __name__ == "__main__":    # print the package import graph
    for area in sorted(AREAS):
        print(f"{area:24s} -> {', '.join(sorted(AREAS[area]))}")

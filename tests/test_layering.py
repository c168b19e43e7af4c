"""The seams the design promises, checked over the source (docs/design.md §2): the
protocol imports nothing of the project but the seed streams; the engine imports the
protocol and no checker, fuzzer, repro, run driver, target or command line; the shared
checkers import the protocol and no engine or target; the fake models import no
engine; a target imports no other target; no module imports itself through others
(the module import graph is acyclic) and no two packages import each other; only the
device runtime knows backend names; every guarded fault site holds its guard; the
device registry's flags match the runtimes'."""
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


def _type_checking(node) -> bool:
    """``if TYPE_CHECKING:``: imports for annotations only, never run."""
    t = node.test
    return isinstance(node, ast.If) and (getattr(t, "id", None) == "TYPE_CHECKING"
                                         or getattr(t, "attr", None) == "TYPE_CHECKING")


def _walk(tree):
    """``ast.walk`` that skips ``if TYPE_CHECKING:`` blocks (every other import counts,
    the ones inside functions too: a lazy import is a dependency all the same)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(c for c in ast.iter_child_nodes(node)
                    if not (isinstance(c, ast.If) and _type_checking(c)))


def _imports(mod: str, path: str, is_pkg: bool):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for n in _walk(tree):
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
    the target never does (``protocol/target.py``), so they count as the fuzzer's."""
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


def _offenders(prefix: str, allowed) -> dict:
    """Modules under ``prefix`` importing an area outside ``allowed``."""
    bad = {m: sorted(g for g in got if _area(g) not in allowed)
           for m, got in MODS.items() if m == prefix or m.startswith(prefix + ".")}
    return {m: g for m, g in bad.items() if g}


def test_the_protocol_imports_only_itself_the_seed_streams_and_plainyaml():
    # plainyaml: a leaf that reads YAML (workload files) and imports nothing of ours
    assert not _offenders("overlapcheck.protocol", ("overlapcheck.protocol", "overlapcheck.seeds",
                                                    "overlapcheck.plainyaml"))


def test_the_engine_imports_the_protocol_and_no_checker_driver_or_target():
    allowed = ("overlapcheck.engine", "overlapcheck.protocol", "overlapcheck.device",
               "overlapcheck.faults", "overlapcheck.seeds", "overlapcheck", "fake_models")
    assert not _offenders("overlapcheck.engine", allowed)


def test_the_checkers_import_the_protocol_and_no_engine():
    allowed = ("invariants", "overlapcheck.protocol", "overlapcheck.race")
    assert not _offenders("invariants", allowed)


def test_fake_models_import_no_engine():
    allowed = ("fake_models", "overlapcheck.protocol", "overlapcheck.seeds")
    assert not _offenders("fake_models", allowed)


def test_a_target_imports_no_other_target():
    from overlapcheck.targets import TARGETS
    homes = {}      # the package each target lives in
    for name, path in TARGETS.items():
        mod = path.split(":")[0]
        is_pkg = any(m.startswith(mod + ".") for m in MODS)
        homes[name] = mod if is_pkg else mod.rpartition(".")[0]
    bad = []
    for name, home in homes.items():
        for other, there in homes.items():
            if other == name:
                continue
            for m, got in MODS.items():
                if m == home or m.startswith(home + "."):
                    bad += [(m, g) for g in got if g == there or g.startswith(there + ".")]
    assert bad == []


def test_what_targets_share_imports_no_target():
    """The modules beside the target registry that several targets use (Triton launches,
    source edits, the tiny checkpoint, engine logs) belong to none of them: they import
    no target's package, so sharing them is not one target importing another."""
    from overlapcheck.targets import TARGETS
    packages = {p.split(":")[0] for p in TARGETS.values()
                if p.startswith("overlapcheck.targets.")}
    shared = [m for m in MODS if m.startswith("overlapcheck.targets.")
              and not any(m == p or m.startswith(p + ".") for p in packages)]
    assert "overlapcheck.targets.triton_launch" in shared
    assert "overlapcheck.targets.checkpoint" in shared
    bad = [(m, g) for m in shared for g in MODS[m]
           if any(g == p or g.startswith(p + ".") for p in packages)]
    assert bad == []


def cycles(graph) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative): each is an import loop."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_cycles_finds_a_loop_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_module_import_graph_is_acyclic():
    """No two modules import each other, directly or through others: not at module
    level, not inside a function."""
    assert cycles(MODS) == []


def test_no_import_loops_between_packages():
    loops = sorted((a, b) for a in AREAS for b in AREAS[a] if a < b and a in AREAS.get(b, ()))
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


def _guarded_faults():
    """(target, fault) of every fault whose mechanism is a guarded site, every target."""
    from overlapcheck import targets
    from overlapcheck.faults import GuardedSite
    return [(t, f) for t in targets.TARGETS for f in targets.get(t).faults().values()
            if isinstance(f.mechanism, GuardedSite)]


@pytest.mark.parametrize("target,fault", _guarded_faults(), ids=lambda x: getattr(x, "name", x))
def test_each_fault_site_holds_its_guard(target, fault):
    path, qualname = fault.mechanism.site.split(" ", 1)
    body = _function_source(os.path.join(ROOT, "overlapcheck", path), qualname)
    assert f'.on("{fault.name}")' in body, f"{fault.mechanism.site} does not ask for {fault.name!r}"


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

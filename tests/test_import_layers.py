"""The layer rule, on the import graph (grimp; imports inside functions and ``TYPE_CHECKING`` blocks included).

Layers (docs/architecture.md): the *kernel* is ``interp`` minus ``interp.apps``; the *analyzers* are ``interp.probes``,
``interp.steering``, ``interp.editing``, ``interp.dynamics`` and ``interp.models`` (top-level folders installed under
``interp``, see setup.py); the *applications* are ``interp.apps``; the *recipes* (``interp.benchmarks``) are
applications of the analyzers.

* neither the kernel nor an analyzer imports an application;
* a recipe imports an application only through the recipe interface ``interp.apps.reproduce`` (the audit's check
  interface is the kernel's ``interp.checks``);
* no cycle between interp's units (a kernel module or sub-package, an application module or package, an analyzer
  package, a recipe), and no cycle between the modules of the kernel and of the applications.

Dynamic imports (``importlib.import_module``, entry points) are not arrows: that is how the kernel reaches plug-ins
(the registries) and how the old import paths reach their new modules (``interp/_moved.py``).
"""
from __future__ import annotations

import importlib.util
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")

ROOT = Path(__file__).resolve().parents[1]
ANALYZERS = ("interp.probes", "interp.steering", "interp.editing", "interp.dynamics", "interp.models")
RECIPES = "interp.benchmarks"
APPS = "interp.apps"
#: what a recipe may import from the applications
RECIPE_INTERFACE = ("interp.apps.reproduce",)
#: module cycles tolerated (each must still be a cycle, else remove it here); none: the last one (model <-> cache
#: <-> habits <-> utils) went when the shared input checks moved to interp.validation
KNOWN_CYCLES: set[frozenset[str]] = set()


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer(module: str) -> str:
    if _under(module, APPS):
        return "apps"
    if _under(module, *ANALYZERS):
        return "analyzer"
    if _under(module, RECIPES):
        return "recipe"
    return "kernel"


def unit(module: str) -> str:
    """The node of the unit-level cycle check: ``interp.X`` for the kernel, ``interp.apps.X`` for the applications,
    the analyzer package, ``interp.benchmarks.<paper>`` for a recipe."""
    parts = module.split(".")
    if _under(module, APPS, RECIPES):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


@pytest.fixture(scope="module")
def graph():
    """The import graph of ``interp`` with the analyzer and recipe folders at their installed names."""
    from grimp.adaptors.packagefinder import ImportLibPackageFinder
    from grimp.application.config import settings

    class Finder(ImportLibPackageFinder):
        # the analyzers live in top-level folders installed as interp.<folder> (setup.py's package_dir); grimp
        # would walk only interp/, so each is found as its own package at its own folder
        def determine_package_directories(self, package_name, file_system):
            if package_name == "interp":
                return {str(ROOT / "interp")}
            spec = importlib.util.find_spec(package_name)
            assert spec is not None and spec.submodule_search_locations, f"{package_name} is not installed"
            return set(spec.submodule_search_locations)

    old = settings.PACKAGE_FINDER
    settings.configure(PACKAGE_FINDER=Finder())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return grimp.build_graph("interp", *ANALYZERS, RECIPES, cache_dir=None)
    finally:
        settings.configure(PACKAGE_FINDER=old)


def _edges(graph) -> list[tuple[str, str]]:
    return [(m, i) for m in sorted(graph.modules) for i in sorted(graph.find_modules_directly_imported_by(m))]


def _where(graph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    lines = ", ".join(str(d["line_number"]) for d in details) or "?"
    return f"{importer} -> {imported} (line {lines})"


def test_the_graph_holds_every_layer(graph):
    mods = graph.modules
    for must in ("interp.model", "interp.checks", "interp.store.harvest", "interp.apps.audit.runner",
                 "interp.apps.reproduce.runner", "interp.apps.ray_engine", "interp.probes.heads.audit_check",
                 "interp.steering.audit_check", "interp.benchmarks.heads.recipe"):
        assert must in mods, f"{must} is missing from the import graph"
    # lazy imports are arrows too: the multi-checkpoint audit imports the Ray engine inside a function
    assert "interp.apps.ray_engine" in graph.find_modules_directly_imported_by("interp.apps.audit.multi")


def test_no_kernel_or_analyzer_module_imports_an_application(graph):
    bad = [_where(graph, a, b) for a, b in _edges(graph) if layer(b) == "apps" and layer(a) in ("kernel", "analyzer")]
    assert not bad, "the kernel and the analyzers must not import the applications (use interp.checks, or a " \
                    "registry the application fills):\n  " + "\n  ".join(bad)


def test_recipes_import_applications_only_through_the_recipe_interface(graph):
    bad = [_where(graph, a, b) for a, b in _edges(graph)
           if layer(a) == "recipe" and layer(b) == "apps" and b not in RECIPE_INTERFACE]
    assert not bad, f"a recipe imports the applications only as {', '.join(RECIPE_INTERFACE)} (the audit's " \
                    "interface is interp.checks):\n  " + "\n  ".join(bad)


def _cycles(nodes: set[str], arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(arrows.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(arrows.get(w, ())))))
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


def _chain(graph, comp: list[str], node_of) -> str:
    """One closed chain through the cycle ``comp``, each arrow with a module-level import that makes it."""
    members = set(comp)
    arrows: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for a, b in _edges(graph):
        na, nb = node_of(a), node_of(b)
        if na != nb and na in members and nb in members:
            arrows[na].setdefault(nb, (a, b))
    # breadth-first from the first node back to itself
    start = comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(arrows[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    path.reverse()
                    hops = list(zip(path, path[1:] + [start]))
                    return "; ".join(_where(graph, *arrows[x][y]) for x, y in hops)
                if w not in prev and w != start:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return " <-> ".join(comp)


def _check_cycles(graph, node_of, keep) -> None:
    arrows: dict[str, set[str]] = defaultdict(set)
    nodes = set()
    for a, b in _edges(graph):
        if not (keep(a) and keep(b)):
            continue
        na, nb = node_of(a), node_of(b)
        nodes |= {na, nb}
        if na != nb:
            arrows[na].add(nb)
    comps = _cycles(nodes, arrows)
    found = {frozenset(c) for c in comps}
    stale = [sorted(k) for k in KNOWN_CYCLES if k <= nodes and k not in found]
    assert not stale, f"these known cycles are gone; remove them from KNOWN_CYCLES: {stale}"
    new = [c for c in comps if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import cycles (lazy imports included):\n  " + "\n  ".join(
        f"{' <-> '.join(c)}: {_chain(graph, c, node_of)}" for c in new)


def test_no_cycle_between_interp_units(graph):
    """Units: a kernel module or sub-package, an application, an analyzer package, a recipe. The package
    ``interp`` itself (the re-exporting facade) is left out: its modules import ``interp`` for ``interp.load``."""
    _check_cycles(graph, unit, keep=lambda m: m != "interp")


def test_no_module_cycle_in_the_kernel_applications_or_an_analyzer(graph):
    """Module by module inside the kernel, the applications (``store.harvest`` and the Ray engine, the audit and
    the reproduction framework) and each analyzer package (``steering.base`` and ``steering.refusal``, ...): a
    package's ``__init__`` re-exporting its modules is no cycle of its own."""
    def keep(m: str) -> bool:
        return layer(m) in ("kernel", "apps", "analyzer") and m != "interp"

    packages = {m for m in graph.modules if any(o.startswith(m + ".") for o in graph.modules)}

    def node(m: str) -> str:
        return m

    arrows_graph = graph

    class _NoInit:
        """The graph without arrows out of a package's __init__ into its own modules."""

        modules = arrows_graph.modules

        @staticmethod
        def find_modules_directly_imported_by(m):
            found = arrows_graph.find_modules_directly_imported_by(m)
            return {i for i in found if not (m in packages and i.startswith(m + "."))}

        @staticmethod
        def get_import_details(importer, imported):
            return arrows_graph.get_import_details(importer=importer, imported=imported)

    _check_cycles(_NoInit, node, keep)


def test_the_rule_catches_a_violation(graph):
    """The checks above would fail on an arrow from the kernel into the applications and on a cycle."""
    import copy

    g = copy.deepcopy(graph)
    g.add_import(importer="interp.store.harvest", imported="interp.apps.ray_engine", line_number=1,
                 line_contents="from interp.apps.ray_engine import run_shards")
    with pytest.raises(AssertionError, match=r"interp\.store\.harvest -> interp\.apps\.ray_engine \(line 1\)"):
        test_no_kernel_or_analyzer_module_imports_an_application(g)
    g.add_import(importer="interp.checks", imported="interp.store.harvest", line_number=2, line_contents="x")
    g.add_import(importer="interp.store.reader", imported="interp.checks", line_number=3, line_contents="y")
    with pytest.raises(AssertionError, match=r"interp\.checks <-> interp\.store"):
        test_no_cycle_between_interp_units(g)


def test_old_import_paths_alias_the_moved_modules():
    """The pre-#45 paths work for one release: same module objects, with a DeprecationWarning."""
    import importlib

    import interp.apps.audit
    import interp.apps.reproduce
    import interp.checks

    for old, new in (("interp.audit", interp.apps.audit), ("interp.reproduce", interp.apps.reproduce),
                     ("interp.audit.base", interp.checks)):
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert importlib.import_module(old) is new
    import subprocess
    import sys

    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import interp.store.ray_engine\nexcept DeprecationWarning as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "interp.store.ray_engine moved to interp.apps.ray_engine" in out.stdout


def test_the_architecture_doc_lists_every_module_of_interp():
    """docs/architecture.md's module table is complete: every ``interp/**/*.py`` has a row, and no row names a file that
    is gone (the table cannot drift from the code)."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = doc.split("## Every module of `interp/`", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(interp/[^`]+\.py)` \|", table, flags=re.M))
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "interp").rglob("*.py") if "__pycache__" not in p.parts}
    assert not on_disk - listed, f"modules missing from docs/architecture.md's table: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"docs/architecture.md lists modules that do not exist: {sorted(listed - on_disk)}"

"""Repository rules that hold for every tracked file: no folder outside the repository is named anywhere
(code, docs, tests, notebook outputs); every xfail is strict and names ``raises=AssertionError`` (a crash is a
failure, never "not reproduced"); the library never imports a recipe; the core imports no analyzer; the
docs' generated tables are up to date with the committed records."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = {".py", ".md", ".ipynb", ".toml", ".txt", ".yaml", ".yml", ".cfg", ".sh", ".json", ".html"}
#: an absolute path into a machine's own folders, or a home-relative one
OUTSIDE = re.compile(r"(?<![\w.:/-])(?:/(?:tmp|home|root|work|Users|scratch|mnt|var/folders|private)/|~/)")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the environment's
        files = [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]
    return [f for f in files if f.is_file()]


def test_no_folder_outside_the_repository_is_named():
    hits = []
    for f in tracked_files():
        if f.suffix not in TEXT or f.name == "test_repository_hygiene.py":
            continue
        for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = OUTSIDE.search(line)
            if m:
                hits.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:120]}")
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)


def _xfail_problems(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, problem) for every xfail in a module: marker calls without raises=AssertionError and
    strict=True, bare ``pytest.mark.xfail`` markers, and imperative ``pytest.xfail()`` calls."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "xfail"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "pytest":
            out.append((node.lineno, "imperative pytest.xfail() (use a strict marker)"))
        elif id(node) not in called:
            out.append((node.lineno, "bare xfail marker"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "xfail" \
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"):
            kw = {k.arg: k.value for k in node.keywords}
            raises, strict = kw.get("raises"), kw.get("strict")
            if not (isinstance(raises, ast.Name) and raises.id == "AssertionError"):
                out.append((node.lineno, "xfail without raises=AssertionError"))
            if not (isinstance(strict, ast.Constant) and strict.value is True):
                out.append((node.lineno, "xfail without strict=True"))
    return out


def test_every_xfail_is_strict_and_names_assertion_error():
    bad = []
    for f in tracked_files():
        rel = f.relative_to(ROOT)
        if f.suffix != ".py" or rel.parts[0] != "tests" or f.name == "test_repository_hygiene.py":
            continue
        bad += [f"{rel}:{line}: {why}" for line, why in _xfail_problems(ast.parse(f.read_text(encoding="utf-8")))]
    assert not bad, "\n".join(bad)


def test_the_xfail_rule_catches_each_kind():
    src = """
import pytest
@pytest.mark.xfail
def a(): pass
@pytest.mark.xfail(reason="x")
def b(): pass
@pytest.mark.xfail(raises=AssertionError, strict=True, reason="ok")
def c(): pass
def d(): pytest.xfail("no")
"""
    problems = _xfail_problems(ast.parse(src))
    assert sorted(line for line, _ in problems) == [3, 5, 5, 9]


LIBRARY = ("interp", "probes", "steering", "editing", "dynamics", "models")
ANALYZERS = ("probes", "steering", "editing", "dynamics", "models", "benchmarks")


def _imports(f: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def test_dependencies_point_one_way():
    """recipe -> method -> interp: the library never imports a recipe; the core imports no analyzer."""
    bad = []
    for top in LIBRARY:
        for f in sorted((ROOT / top).rglob("*.py")):
            for line, mod in _imports(f):
                if mod.startswith("interp.benchmarks") or mod.split(".")[0] == "benchmarks":
                    bad.append(f"{f.relative_to(ROOT)}:{line} imports the recipe {mod}")
                if top == "interp" and any(mod.startswith(f"interp.{a}") for a in ANALYZERS):
                    bad.append(f"{f.relative_to(ROOT)}:{line}: the core imports the analyzer {mod}")
    assert not bad, "\n".join(bad)


def test_generated_doc_tables_are_up_to_date():
    from interp.apps.reproduce.docs import render_files

    stale = render_files(ROOT, write=False)
    assert not stale, ("regenerate with `python scripts/render_records.py`: "
                       + ", ".join(str(f.relative_to(ROOT)) for f in stale))


#: sample lines for the pattern, with the machine folders spelled in pieces so this file names none itself
_TMP, _WORK, _HOME = "/" + "tmp/", "/" + "work/", "~" + "/"


@pytest.mark.parametrize("line, hit", [(f"see {_TMP}run1/x.json", True), (f"cd {_HOME}proj", True),
                                       ("a/tmp/b", False), ("http://host/tmp/x", False),
                                       (f"{_WORK}main/.venv/lib", True), ("benchmarks/tmp/", False)])
def test_outside_path_pattern(line, hit):
    assert bool(OUTSIDE.search(line)) is hit

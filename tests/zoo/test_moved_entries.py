"""Zoo entries that moved out of the core into their reproductions (issue #31) keep their cache keys.

The entries are declared through ``interp.zoo`` entry points in pyproject.toml; the recipe hash (name, version,
params, packages, requires) is what names a cached build, so a changed hash would retrain the entry. These are
the hashes the entries had when ``interp.zoo.builtin`` registered them (measured before the move, 2026-12-02).
Update a pin only when a recipe is changed on purpose, and say so in the commit.
"""
import pytest

from interp import zoo

PINS = {"toy-refusal": "355fc9c2e4903899",
        "planning-cfg-mtp": "10eea42704650c14", "planning-cfg-ntp": "8f5a13a3bc0c1d68",
        "planning-horizon-ntp": "71a1da573ea8ec3b", "planning-pf-long-mtp": "c32d9852739b3c50",
        "planning-pf-long-ntp": "97fb6f22d1846d9f", "planning-pf-short-mtp": "50a2919777a9ddff",
        "planning-pf-short-nodead-mtp": "6f1eee42dd62a4ce", "planning-pf-short-nodead-ntp": "8aa3deb8de485ecf",
        "planning-pf-short-ntp": "ea7073aacb5a613b"}


@pytest.mark.parametrize("name", sorted(PINS))
def test_moved_entry_keeps_its_cache_key(name):
    assert zoo.recipe_hash(name) == PINS[name]


def test_moved_entries_come_from_entry_points_not_the_core():
    from importlib.metadata import entry_points

    declared = {ep.name: ep.value for ep in entry_points(group="interp.zoo")}
    assert declared["toy-refusal"] == "interp.benchmarks.repit.toy_model:TOY_REFUSAL"
    assert declared["planning"] == "interp.benchmarks.planning.zoo:entries"
    import interp.zoo.builtin as builtin

    assert not hasattr(builtin, "TOY_REFUSAL") and not hasattr(builtin, "PLANNING")
    assert zoo.get_entry("planning-horizon-ntp").builder.__module__ == "interp.benchmarks.planning.zoo"


def test_the_core_imports_no_analyzer_or_benchmark():
    """interp/ (the core) imports nothing from the analyzer folders or benchmarks (the planning zoo entries imported
    probes.planning.tasks before they moved)."""
    import ast
    from pathlib import Path

    import interp

    bad = ("interp.probes", "interp.steering", "interp.editing", "interp.dynamics", "interp.models",
           "interp.benchmarks")
    found = []
    for f in Path(interp.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level >= 2 and mod.split(".")[0] in ("probes", "steering", "editing", "dynamics", "models",
                                                                "benchmarks"):
                    found.append((f.name, "." * node.level + mod))
                if node.level == 0 and mod.startswith(bad):
                    found.append((f.name, mod))
            elif isinstance(node, ast.Import):
                found += [(f.name, a.name) for a in node.names if a.name.startswith(bad)]
    assert not found, found

"""Zoo entries keep their cache keys wherever their builders live, and are all declared one way.

Every entry is declared through an ``interp.zoo`` entry point naming the ``entries`` function of a module called
``zoo`` (issue #45: the built-ins' builders moved to ``interp.apps.zoo``; issue #31: the planning and toy-refusal
entries moved to their reproductions). The recipe hash (name, version, params, packages, requires) is what names a
cached build, so a changed hash would retrain the entry. These are the hashes of every entry measured before the
moves (2026-12-02 and, for the built-ins and the protein family, before #45). Update a pin only when a recipe is
changed on purpose, and say so in the commit.
"""
import subprocess
import sys

import pytest

from interp import zoo

PINS = {
    "dinov2-s14": "355236ee98a61993",
    "gavel-ce-world": "0f646423e7d29ddd",
    "minilm-l6": "459b662f5a70ecb7",
    "planning-cfg-mtp": "10eea42704650c14",
    "planning-cfg-ntp": "8f5a13a3bc0c1d68",
    "planning-horizon-ntp": "71a1da573ea8ec3b",
    "planning-pf-long-mtp": "c32d9852739b3c50",
    "planning-pf-long-ntp": "97fb6f22d1846d9f",
    "planning-pf-short-mtp": "50a2919777a9ddff",
    "planning-pf-short-nodead-mtp": "6f1eee42dd62a4ce",
    "planning-pf-short-nodead-ntp": "8aa3deb8de485ecf",
    "planning-pf-short-ntp": "ea7073aacb5a613b",
    "protein-mlm-128": "de8ceace2a5ea1d6",
    "protein-mlm-32": "666e757ad5f5a359",
    "protein-mlm-64": "ed8aafaefda47af1",
    "protein-mlm-toy-16": "8309b42a0e87510c",
    "protein-mlm-toy-24": "899590d78130c095",
    "protein-mlm-toy-8": "b51b8967071f15a3",
    "smollm2-135m": "c63c1cc8d83e3720",
    "smollm2-135m-refusal": "aafc95c6955eca5d",
    "toy-grammar": "a76d7f7a5b249c59",
    "toy-refusal": "355fc9c2e4903899",
}


@pytest.mark.parametrize("name", sorted(PINS))
def test_moved_entry_keeps_its_cache_key(name):
    assert zoo.recipe_hash(name) == PINS[name]


def test_every_entry_is_declared_one_way():
    """One plug-in kind: each entry point names a ``zoo.py`` module's ``entries`` function; the built-ins too."""
    from importlib.metadata import entry_points

    declared = {ep.name: ep.value for ep in entry_points(group="interp.zoo")}
    assert {v.rsplit(":", 1)[0].rsplit(".", 1)[1] for v in declared.values()} == {"zoo"}
    assert {v.rsplit(":", 1)[1] for v in declared.values()} == {"entries"}
    assert declared["toy-grammar"] == declared["smollm2-135m"] == "interp.apps.zoo.zoo:entries"
    assert declared["toy-refusal"] == "interp.benchmarks.repit.zoo:entries"
    assert declared["planning"] == "interp.benchmarks.planning.zoo:entries"
    assert set(zoo.available()) == set(PINS)
    for name in PINS:
        module = zoo.get_entry(name).builder.__module__
        assert module.startswith(("interp.apps.zoo.", "interp.benchmarks.", "interp.models.")), (name, module)


def test_importing_the_zoo_registers_nothing_and_imports_no_builder():
    """``import interp.zoo`` (and the loading line) registers no entry and imports no application or builder;
    ``zoo:toy-grammar`` then resolves through its entry point, importing no other package's plug-in (nor the
    converters of the real models)."""
    code = ("import sys, interp, interp.zoo as z; from interp.zoo.registry import ZOO; "
            "assert not ZOO._items, sorted(ZOO._items); "
            "assert not [m for m in sys.modules if m.startswith(('interp.apps', 'interp.benchmarks'))]; "
            "assert z.get_entry('zoo:toy-grammar').name == 'toy-grammar'; "
            "bad = [m for m in sys.modules if m.startswith(('interp.benchmarks', 'interp.models', "
            "'interp.apps.zoo.real'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_plugin_must_be_an_entries_function():
    from interp.zoo.registry import _expand

    entry = zoo.get_entry("toy-grammar")
    with pytest.raises(TypeError, match="names a function returning ZooEntry objects"):
        _expand(entry, "toy-grammar")
    with pytest.raises(TypeError, match="must return an iterable of ZooEntry"):
        _expand(lambda: entry, "toy-grammar")
    assert _expand(lambda: [entry], "x") == {"toy-grammar": entry}


def test_old_builder_paths_forward_with_a_warning():
    import interp.apps.zoo.grammar as app_grammar
    import interp.data.grammar as data_grammar
    import interp.zoo.grammar as old_grammar
    import interp.zoo.real as old_real

    with pytest.warns(DeprecationWarning, match="moved to interp.data.grammar.ToyGrammar"):
        assert old_grammar.ToyGrammar is data_grammar.ToyGrammar
    with pytest.warns(DeprecationWarning, match="moved to interp.apps.zoo.grammar.evaluate"):
        assert old_grammar.evaluate is app_grammar.evaluate
    with pytest.warns(DeprecationWarning, match="interp.apps.zoo.real.mean_pool"):
        assert callable(old_real.mean_pool)
    with pytest.raises(AttributeError):
        old_real.no_such_name  # noqa: B018


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

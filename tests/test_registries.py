"""One registry rule set for zoo entries, steering methods, audit checks and backends.

Each of the four registries is an :class:`interp.registry.Registry`; the same cases run on all of them:
a duplicate name is refused, an unknown name suggests the closest ones, a broken plug-in is named with its
cause (also by the public ``get`` functions), and listing imports no plug-in. Plug-ins are declared the
way an installed package declares them: a ``*.dist-info/entry_points.txt`` on ``sys.path``.
"""
from __future__ import annotations

import sys
import textwrap
import warnings

import pytest

from interp import zoo
from interp.apps.audit import registry as audit_registry
from interp.loading import BACKEND_REGISTRY
from interp.registry import PluginError, Registry, UnknownNameError
from interp.steering import base as steering_base
from interp.zoo import registry as zoo_registry

LAZY = "interp_regtest_lazy"  # a plug-in module that must not be imported by listing
MISSING = "interp_regtest_missing"  # a plug-in module that does not exist

LAZY_SOURCE = textwrap.dedent('''
    from interp.steering import SteeringMethod
    from interp.zoo import ZooEntry

    def _build(out, params):
        raise RuntimeError("not built in these tests")

    ENTRY = ZooEntry(name="regtest-lazy", description="plug-in", source="test", architecture="none", size="0",
                     builder=_build)

    def ENTRIES():
        return (ENTRY,)

    def FAMILY():
        return [ZooEntry(name=f"regtest-fam-{i}", description="family", source="test", architecture="none",
                         size="0", builder=_build) for i in range(2)]

    class Method(SteeringMethod):
        name = "regtest_lazy"

        def fit(self, model, data, val=None):
            raise NotImplementedError

    class Check:
        name = "regtest_lazy"

        def run(self, model, data):
            return None

        def render(self, result):
            return None

    class Backend:
        def __init__(self, hf_model, tokenizer):
            self.hf_model, self.tokenizer = hf_model, tokenizer
''')


def _entry(name: str) -> zoo.ZooEntry:
    return zoo.ZooEntry(name=name, description="", source="", architecture="", size="", builder=lambda o, p: None)


def _method(name: str) -> type:
    return type(f"M_{name}", (steering_base.SteeringMethod,), {"name": name})


def _check(name: str) -> type:
    return type(f"C_{name}", (), {"name": name, "run": lambda self, m, d: None, "render": lambda self, r: None})


def _backend(name: str):
    return lambda: type(f"B_{name}", (), {})


#: (registry, entry-point group, make a valid object named n, a built-in name, a typo of it, public get)
CASES = {
    "zoo": (zoo_registry.ZOO, "interp.zoo", _entry, "minilm-l6", "minilm-l7", zoo.get_entry),
    "steering": (steering_base.METHODS, "interp.steering", _method, "diff_in_means", "diff_in_mean",
                 steering_base.get),
    "checks": (audit_registry.CHECKS, "interp.checks", _check, "heads", "head", audit_registry.get_check),
    "backends": (BACKEND_REGISTRY, "interp.backends", _backend, "torch", "torh", BACKEND_REGISTRY.get),
}
TARGETS = {"interp.zoo": "ENTRIES", "interp.steering": "Method", "interp.checks": "Check", "interp.backends": "Backend"}
NAMES = {"interp.zoo": ("regtest-lazy", "regtest-broken"), "interp.steering": ("regtest_lazy", "regtest_broken"),
         "interp.checks": ("regtest_lazy", "regtest_broken"), "interp.backends": ("regtest_lazy", "regtest_broken")}


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """An installed-looking package declaring, in every group, one working and one broken plug-in."""
    dist = tmp_path / "interp_regtest-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: interp-regtest\nVersion: 0.1\n")
    lines = []
    for group, attr in TARGETS.items():
        lazy, broken = NAMES[group]
        lines += [f"[{group}]", f"{lazy} = {LAZY}:{attr}", f"{broken} = {MISSING}:{attr}"]
        if group == "interp.zoo":
            lines.append(f"regtest-family = {LAZY}:FAMILY")  # one entry point, several entries
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / f"{LAZY}.py").write_text(LAZY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(LAZY, None)
    yield
    for reg, group, *_ in CASES.values():
        for n in (*NAMES[group], "regtest-fam-0", "regtest-fam-1"):
            reg.unregister(n)
        for memo in (reg._failed, reg._loaded):  # this package's plug-ins are gone with its folder
            for key in [k for k in memo if isinstance(k, tuple) and str(k[1]).startswith((LAZY, MISSING))]:
                del memo[key]
    sys.modules.pop(LAZY, None)


@pytest.mark.parametrize("kind", CASES)
def test_duplicate_refused(kind):
    reg, _, make, *_ = CASES[kind]
    name = f"regtest-dup-{kind}" if kind == "zoo" else f"regtest_dup_{kind}"
    first = make(name)
    try:
        assert reg.register(first, name) is first and reg.register(first, name) is first  # same object: fine
        with pytest.raises(ValueError, match=f"{name!r} is already registered"):
            reg.register(make(name), name)
        assert reg.get(name) is first
        other = make(name)
        reg.register(other, name, replace=True)
        assert reg.get(name) is other
    finally:
        reg.unregister(name)
    assert name not in reg.available()


@pytest.mark.parametrize("kind", CASES)
def test_unknown_name_suggests_closest(kind):
    reg, _, _, known, typo, public_get = CASES[kind]
    for get in (reg.get, public_get):
        with pytest.raises((KeyError, ValueError)) as info:
            get(typo)
        msg = str(info.value)
        assert f"unknown {reg.kind} {typo!r}" in msg and f"did you mean {known!r}" in msg and known in msg
    assert isinstance(info.value, reg.error)


@pytest.mark.parametrize("kind", CASES)
def test_broken_plugin_named_with_cause(kind, plugins):
    reg, group, _, _, _, public_get = CASES[kind]
    lazy, broken = NAMES[group]
    for get in (reg.get, public_get):
        with pytest.raises(PluginError) as info:
            get(broken)
        msg = str(info.value)
        assert f"plug-in {broken!r}" in msg and f"{MISSING}:{TARGETS[group]}" in msg
        assert "ModuleNotFoundError" in msg and MISSING in msg
        assert isinstance(info.value, ImportError) and isinstance(info.value, KeyError)
    # the broken one hides nothing: it stays listed, and the working plug-in of the same package loads
    assert broken in reg.available() and lazy in reg.available()
    assert reg.get(lazy).__module__ == LAZY if kind != "zoo" else reg.get(lazy).name == lazy


@pytest.mark.parametrize("kind", CASES)
def test_listing_does_not_import(kind, plugins):
    reg, group, *_ = CASES[kind]
    lazy, broken = NAMES[group]
    names = reg.available()
    assert {lazy, broken} <= set(names) and names == sorted(names)
    assert LAZY not in sys.modules and lazy in reg
    reg.get(lazy)  # getting it is what imports it
    assert LAZY in sys.modules


def test_load_all_warns_per_broken_plugin_and_public_listings(plugins, monkeypatch):
    """Where names are known only after import (zoo families) or a broken plug-in must be reported when
    listing (steering), the public listing loads the plug-ins: one warning per broken plug-in, naming it."""
    monkeypatch.setattr(zoo_registry, "_plugins_loaded", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = zoo.available()
        steering_names = steering_base.available()
        steering_base.available()  # a second listing does not warn again
    assert {"regtest-lazy", "regtest-fam-0", "regtest-fam-1", "regtest-broken", "minilm-l6"} <= set(names)
    assert "regtest-family" not in names  # a loaded family is listed by its members
    assert {"regtest_lazy", "regtest_broken", "repit"} <= set(steering_names)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert sum("'regtest-broken'" in m for m in msgs) == 1 and sum("'regtest_broken'" in m for m in msgs) == 1
    assert zoo.get_entry("zoo:regtest-fam-1").description == "family"
    with pytest.raises(KeyError, match="declares a family.*regtest-fam-0, regtest-fam-1"):
        zoo.get_entry("regtest-family")
    zoo.unregister("regtest-fam-0")  # one member forgotten: the others stay, the family is not listed by its own name
    after = zoo.available()
    assert "regtest-fam-0" not in after and "regtest-fam-1" in after and "regtest-family" not in after


def test_family_member_found_without_listing_first(plugins):
    """``get`` of a name no entry point declares loads the family plug-ins (the zoo's expand rule)."""
    with pytest.warns(RuntimeWarning, match="'regtest-broken'.*ModuleNotFoundError"):
        assert zoo_registry.ZOO.get("regtest-fam-0").name == "regtest-fam-0"


def test_plugin_clashing_with_a_registered_name_fails_by_the_duplicate_rule(plugins):
    clash = zoo.register(_entry("regtest-lazy"))
    try:
        with pytest.raises(PluginError, match="'regtest-lazy'.*already registered as a different object"):
            zoo_registry.ZOO._load("regtest-lazy", zoo_registry.ZOO.entry_points()["regtest-lazy"])
        assert zoo.get_entry("regtest-lazy") is clash
    finally:
        zoo.unregister("regtest-lazy")


def test_registry_basics_without_entry_points():
    reg: Registry[int] = Registry("widget")
    with pytest.raises(TypeError, match="non-empty string name"):
        reg.register(3)
    reg.register(3, "three")
    with pytest.raises(TypeError, match="must be a string"):
        reg.get(3)  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match=r"unknown widget 'thre' \(did you mean 'three'\?\); available: three"):
        reg.get("thre")
    assert reg.available() == ["three"] and reg.available(load=True) == ["three"] and reg.load_all() == {}


def test_zoo_cli_lists_around_a_broken_plugin(plugins, monkeypatch, tmp_path):
    """``interp zoo list`` shows every entry and says which plug-in is broken and why; ``build`` of it names
    the cause and exits 2."""
    from typer.testing import CliRunner

    from interp.zoo.cli import app

    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(zoo_registry, "_plugins_loaded", False)
    runner = CliRunner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = runner.invoke(app, ["list"])
    assert res.exit_code == 0, res.output
    assert "minilm-l6" in res.output and "regtest-fam-1" in res.output and "regtest-lazy" in res.output
    assert "broken: zoo entry plug-in 'regtest-broken'" in res.output and "ModuleNotFoundError" in res.output
    res = runner.invoke(app, ["build", "regtest-broken"])
    assert res.exit_code == 2 and "failed to load: ModuleNotFoundError" in res.output


ANALYZER_FOLDERS = ("probes", "steering", "editing", "dynamics", "models")


def test_builtins_register_one_way_the_way_plugins_do():
    """Steering methods, audit checks and recipes: every built-in is an entry point of interp's pyproject.toml, as a
    third party's would be, and importing the built-in modules registers nothing (no second, import-time way)."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    recipes = sorted(p.parent.name for p in (root / "benchmarks").glob("*/recipe.py"))
    code = textwrap.dedent(f'''
        import importlib, json
        import interp.steering, interp.steering.diff_in_means, interp.steering.ablation, interp.steering.repit
        from interp.steering.base import METHODS
        from interp.apps.audit.registry import CHECKS
        from interp.apps.reproduce.recipe import RECIPES
        for reg in (METHODS, CHECKS, RECIPES):
            for ep in reg.entry_points().values():
                importlib.import_module(ep.value.split(":")[0])
        for name in {recipes!r}:
            importlib.import_module(f"interp.benchmarks.{{name}}.recipe")
        print(json.dumps({{"registered": [sorted(r._items) for r in (METHODS, CHECKS, RECIPES)],
                          "declared": [{{n: ep.value for n, ep in r.entry_points().items()}}
                                       for r in (METHODS, CHECKS, RECIPES)]}}))
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["registered"] == [[], [], []], f"registered at import time (steering, checks, recipes): {got['registered']}"
    methods, checks, declared_recipes = got["declared"]
    assert {"diff_in_means", "directional_ablation", "repit"} <= set(methods)
    assert sorted(declared_recipes) == recipes
    # one file name per kind: every audit check module is <analyzer>/.../audit_check.py, and every such file is declared
    assert all(v.split(":")[0].endswith(".audit_check") for v in checks.values()), checks
    files = {".".join(("interp",) + p.relative_to(root).with_suffix("").parts)
             for top in ANALYZER_FOLDERS for p in (root / top).rglob("audit_check.py")}
    assert files == {v.split(":")[0] for v in checks.values()}, (files, checks)

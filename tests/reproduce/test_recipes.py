"""Every paper's recipe: the quick preset end to end (default suite, cold cache under CI), the committed full
records against their claims files, and (slow) the full preset against the verdicts the claims file expects.

Together the quick tests are ``interp reproduce all --preset quick``, one test per paper so that pytest-xdist
spreads them over the workers.
"""
from __future__ import annotations

import pytest

from interp.apps.reproduce import available_recipes, committed_record, get_recipe, judge, run_recipe
from interp.apps.reproduce.claims import VERDICTS
from interp.apps.reproduce.record import compare

PAPERS = available_recipes()


def test_every_recipe_folder_is_registered_and_every_registration_has_its_folder():
    """The registry is the recipes on disk: each ``benchmarks/<paper>/recipe.py`` declared as
    ``<paper> = interp.benchmarks.<paper>.recipe:RECIPE`` (a missing declaration means: add it to pyproject.toml and
    reinstall), and no declaration without its file."""
    from pathlib import Path

    from interp.apps.reproduce.recipe import RECIPES

    root = Path(__file__).resolve().parents[2] / "benchmarks"
    on_disk = {p.parent.name for p in root.glob("*/recipe.py")}
    declared = {n: getattr(ep, "value", "") for n, ep in RECIPES.entry_points().items()}
    assert on_disk and set(declared) == on_disk, (f"recipe files not declared: {sorted(on_disk - set(declared))}; "
                                                  f"declared without a file: {sorted(set(declared) - on_disk)}")
    assert all(v == f"interp.benchmarks.{n}.recipe:RECIPE" for n, v in declared.items()), declared
    assert set(PAPERS) == on_disk


def test_every_paper_has_a_recipe():
    for name in PAPERS:
        recipe = get_recipe(name)
        assert recipe.name == name and recipe.title and recipe.method and recipe.doc
        claims = recipe.claims()
        assert claims.claims, name
        assert set(recipe.cost) >= {"quick", "full"}, f"{name}: state the cost of both presets"


@pytest.mark.parametrize("name", PAPERS)
def test_quick_preset_runs_every_stage_and_verdict(name):
    run = run_recipe(name, "quick")
    rec = run.record
    assert rec.error is None, rec.error
    assert rec.verdicts and all(v["verdict"] in VERDICTS[:3] for v in rec.verdicts), \
        [(v["id"], v["verdict"], v["error"]) for v in rec.verdicts]
    # every metric a criterion reads was measured
    assert get_recipe(name).claims().metrics() <= set(rec.measured)


@pytest.mark.parametrize("name", PAPERS)
def test_committed_full_record_agrees_with_its_claims(name):
    recipe = get_recipe(name)
    rec = committed_record(recipe, "full")
    if rec is None:
        pytest.skip(f"{name}: no committed full record (full run: {recipe.cost.get('full')})")
    claims = recipe.claims()
    assert rec.error is None
    assert rec.preset == "full" and rec.config_key == __import__("interp.configs").configs.digest(recipe.preset("full")), \
        f"{name}: the committed full record was made with another config than the full preset"
    got = {c.id: judge(c, rec.measured).verdict for c in claims.claims}
    assert got == {v["id"]: v["verdict"] for v in rec.verdicts}, "the record's verdicts differ from the claims file's"
    expected = {c.id: c.expect["full"] for c in claims.claims if "full" in c.expect}
    assert {k: got[k] for k in expected} == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPERS)
def test_full_preset_gives_the_expected_verdicts(name):
    recipe = get_recipe(name)
    run = run_recipe(name, "full")
    assert run.record.error is None, run.record.error
    expected = {c.id: c.expect["full"] for c in recipe.claims().claims if "full" in c.expect}
    got = {v["id"]: v["verdict"] for v in run.record.verdicts}
    assert {k: got[k] for k in expected} == expected
    ref = committed_record(recipe, "full")
    if ref is not None:
        assert compare(run.record, ref, recipe.claims()) == []


def test_ray_engine_equals_local():
    pytest.importorskip("ray")
    local = run_recipe("spiked_regression", "quick", fresh=True).record
    ray_run = run_recipe("spiked_regression", "quick", engine="ray", fresh=True).record
    assert ray_run.error is None, ray_run.error
    assert ray_run.measured == local.measured and ray_run.verdicts == local.verdicts

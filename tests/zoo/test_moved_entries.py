"""Zoo entries that moved out of the core into their reproductions (issue #31) keep their cache keys.

The entries are declared through ``interp.zoo`` entry points in pyproject.toml; the recipe hash (name, version,
params, packages, requires) is what names a cached build, so a changed hash would retrain the entry. These are
the hashes the entries had when ``interp.zoo.builtin`` registered them (measured before the move, 2026-12-02).
Update a pin only when a recipe is changed on purpose, and say so in the commit.
"""
import pytest

from interp import zoo

PINS = {"toy-refusal": "355fc9c2e4903899"}


@pytest.mark.parametrize("name", sorted(PINS))
def test_moved_entry_keeps_its_cache_key(name):
    assert zoo.recipe_hash(name) == PINS[name]


def test_moved_entries_come_from_entry_points_not_the_core():
    from importlib.metadata import entry_points

    declared = {ep.name: ep.value for ep in entry_points(group="interp.zoo")}
    assert declared["toy-refusal"] == "interp.benchmarks.repit.toy_model:TOY_REFUSAL"
    import interp.zoo.builtin as builtin

    assert not hasattr(builtin, "TOY_REFUSAL")

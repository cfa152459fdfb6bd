"""``interp zoo list | build | info``."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from interp import zoo
from interp.apps.zoo.cli import app

runner = CliRunner()


def test_list_and_info(tmp_zoo):
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0, res.output
    for name in ("smollm2-135m", "minilm-l6", "dinov2-s14", "smollm2-135m-refusal", "toy-grammar"):
        assert name in res.output
    assert str(tmp_zoo / "zoo") in res.output
    res = runner.invoke(app, ["info", "dinov2-s14"])
    assert res.exit_code == 0 and "Dinov2Model" in res.output and zoo.recipe_hash("dinov2-s14") in res.output
    assert "cached:       no" in res.output
    res = runner.invoke(app, ["info", "dinov2-s14", "--json"])
    rec = json.loads(res.output)
    assert rec["recipe_hash"] == zoo.recipe_hash("dinov2-s14") and rec["path"] is None


def test_unknown_name(tmp_zoo):
    res = runner.invoke(app, ["build", "no-such-model"])
    assert res.exit_code == 2 and "unknown zoo entry" in res.output


def test_build_and_force(tmp_zoo):
    calls = []

    def builder(out, params):
        from interp.testing import tiny_model

        calls.append(1)
        tiny_model("llama", folder=out, n_layers=1, d_model=32)
        return {"note": "tiny"}

    zoo.register(zoo.ZooEntry(name="test-cli", description="tiny", source="test", architecture="LlamaForCausalLM",
                              size="tiny", builder=builder))
    try:
        res = runner.invoke(app, ["build", "test-cli"])
        assert res.exit_code == 0, res.output
        assert res.output.strip().endswith(zoo.info("test-cli").path.name) and calls == [1]
        assert runner.invoke(app, ["build", "test-cli"]).exit_code == 0 and calls == [1]
        assert runner.invoke(app, ["build", "test-cli", "--force"]).exit_code == 0 and calls == [1, 1]
        res = runner.invoke(app, ["info", "test-cli"])
        assert "note: tiny" in res.output and "cached:       " + str(tmp_zoo) in res.output
    finally:
        zoo.unregister("test-cli")


def test_mounted_in_main_cli(tmp_zoo):
    from interp.apps.cli import app as main_app

    res = runner.invoke(main_app, ["zoo", "list"])
    assert res.exit_code == 0 and "toy-grammar" in res.output


def test_old_path_is_a_deprecated_alias_of_the_moved_cli():
    """``interp.zoo.cli`` moved to the applications (#45): the old path is the same module, with a warning."""
    import subprocess
    import sys

    import interp.apps.zoo.cli

    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import interp.zoo.cli\nexcept DeprecationWarning as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "interp.zoo.cli moved to interp.apps.zoo.cli" in out.stdout
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from interp.zoo.cli import app as old_app
    assert old_app is app is interp.apps.zoo.cli.app

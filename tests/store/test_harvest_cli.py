"""``interp harvest``: writes a store, resumes by rerunning, and refuses bad input with exit code 2."""
from __future__ import annotations

from typer.testing import CliRunner

from interp.apps.cli import app
from interp.store import ActivationStore


def test_harvest_cli_writes_and_resumes(model_dir, texts, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(texts))
    out = tmp_path / "store"
    args = ["harvest", str(model_dir), "--names", "blocks.*.hook_resid_post", "--data", str(corpus), "--out", str(out),
            "--context-size", "16", "--batch-size", "4", "--shard-mb", "0.1", "--dtype", "float16"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    store = ActivationStore(out, verify=True)
    assert store.names == [f"blocks.{i}.hook_resid_post" for i in range(3)] and store.dtype == "float16"
    r2 = CliRunner().invoke(app, args)
    assert r2.exit_code == 0 and "wrote 0, kept" in r2.output
    r3 = CliRunner().invoke(app, args[:-2] + ["--dtype", "float32"])
    assert r3.exit_code == 2 and "dtype" in r3.output
    r4 = CliRunner().invoke(app, ["harvest", str(model_dir), "--names", "blocks.0.hook_resid_post", "--data",
                                  str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x")])
    assert r4.exit_code == 2 and "does not exist" in r4.output

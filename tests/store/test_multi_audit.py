"""``interp audit ckpt1 ckpt2`` (local engine): one report per checkpoint plus a comparing index page."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from interp.apps.cli import app


def test_audit_two_checkpoints_local(model_dir, other_model, tmp_path):
    other_dir = other_model.source
    out = tmp_path / "audits"
    args = ["audit", str(model_dir), str(other_dir), "--checks", "heads", "--out", str(out), "--max-texts", "2",
            "--set", "heads.n_random=1", "--steps", "20,10"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    index = json.loads((out / "results.json").read_text())
    assert index["schema"] == "interp.audit.index" and index["engine"] == "local" and index["schema_version"] == 2
    # --steps gives the training steps in the order given; the index is ordered by step
    assert [(s["spec"], s["step"]) for s in index["reports"]] == [(other_dir, 10), (str(model_dir), 20)]
    folders = [s["folder"] for s in index["reports"]]
    assert len(set(folders)) == 2 and all(f.startswith(("01-", "02-")) for f in folders)
    for s in index["reports"]:
        report = json.loads((out / s["folder"] / "results.json").read_text())
        assert report["model"]["spec"] == s["spec"] and report["checks"][0]["status"] == "ok"
        assert report["provenance"]["checkpoint"]["step"] == s["step"]
    page = (out / "index.html").read_text()
    assert all(f'href="{f}/index.html"' in page for f in folders)
    (out / "notes.txt").write_text("mine")
    r2 = CliRunner().invoke(app, args)  # a rerun replaces the earlier output and keeps the user's file
    assert r2.exit_code == 0, r2.output
    assert (out / "notes.txt").read_text() == "mine"
    r3 = CliRunner().invoke(app, ["audit", str(model_dir), "--engine", "spark", "--out", str(tmp_path / "x")])
    assert r3.exit_code == 2 and "engine" in r3.output

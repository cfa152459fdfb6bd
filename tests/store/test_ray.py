"""The Ray engine on an in-process local cluster: the harvest equals the local engine's byte for byte, and
``interp audit ckpt1 ckpt2 --engine ray`` writes one report per checkpoint plus an index page."""
from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

# Ray workers each import torch/transformers and load the model: ~45 s per test on the shared 2-core
# machine, beyond the default-suite budget; the local multi-audit path is tested in test_multi_audit.py.
pytestmark = pytest.mark.slow

from typer.testing import CliRunner  # noqa: E402

from interp.apps.cli import app  # noqa: E402
from interp.store import harvest  # noqa: E402

NAMES = ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"]
KW = dict(context_size=16, batch_size=3, shard_mb=0.05)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "INTERP_PROGRESS": "0"}})
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_harvest_equals_local(cluster, model, model_dir, texts, tmp_path):
    local = harvest(model, texts, NAMES, tmp_path / "local", **KW)
    dist = harvest(str(model_dir), texts, NAMES, tmp_path / "ray", **KW, engine="ray", num_workers=2)
    assert local.n_shards >= 4 and dist.shards_written == local.n_shards and dist.engine == "ray"
    for e in local.shards:
        assert (tmp_path / "ray" / e["file"]).read_bytes() == (tmp_path / "local" / e["file"]).read_bytes()
    a = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    b = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert a["shards"] == b["shards"] and a["identity"] == b["identity"]


def test_audit_several_checkpoints_on_ray(cluster, model_dir, other_model, tmp_path):
    other_dir = other_model.source
    out = tmp_path / "audits"
    r = CliRunner().invoke(app, ["audit", str(model_dir), str(other_dir), "--engine", "ray", "--checks", "heads",
                                 "--out", str(out), "--max-texts", "3", "--set", "heads.n_random=1"])
    assert r.exit_code == 0, r.output
    index = json.loads((out / "results.json").read_text())
    assert index["schema"] == "interp.audit.index" and [s["spec"] for s in index["reports"]] == [str(model_dir), other_dir]
    for s in index["reports"]:
        report = json.loads((out / s["folder"] / "results.json").read_text())
        assert report["model"]["spec"] == s["spec"] and report["checks"][0]["status"] == "ok"
        assert (out / s["folder"] / "index.html").is_file()
    page = (out / "index.html").read_text()
    assert all(f'href="{s["folder"]}/index.html"' in page for s in index["reports"])
    assert all(k in page for k in index["reports"][0]["checks"][0]["summary"])
    r2 = CliRunner().invoke(app, ["audit", str(model_dir), str(other_dir), "--checks", "heads", "--out", str(out),
                                  "--max-texts", "3", "--set", "heads.n_random=1"])
    assert r2.exit_code == 0, r2.output  # rerun (local engine) replaces the earlier multi-report

"""``--engine ray`` on a training run gives the local engine's index: same order, steps, metrics, drift, failures."""
from __future__ import annotations

import json
import shutil

import pytest

ray = pytest.importorskip("ray")

# Ray workers each import torch/transformers and load a checkpoint: ~1 min on the shared 2-core machine.
pytestmark = pytest.mark.slow

from interp.apps.audit import AuditData  # noqa: E402
from interp.apps.audit.demo import tiny_training_run  # noqa: E402
from interp.apps.audit.multi import run_audits  # noqa: E402

VOLATILE = {"seconds", "timings", "created", "engine"}


def _strip(obj):
    """Drop what legitimately differs between two runs (wall-clock times, the engine's name)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def test_ray_index_equals_local(tmp_path):
    ckpts = tiny_training_run(tmp_path / "run", (5, 20))
    bad = tmp_path / "run" / "checkpoint-12"
    shutil.copytree(ckpts[0], bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    (bad / "trainer_state.json").unlink()  # its step comes from the folder name
    specs = [str(ckpts[1]), str(bad), str(ckpts[0])]
    data = AuditData(AuditData.builtin().texts[:4])
    opts = {"heads": {"n_random": "1"}}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "INTERP_PROGRESS": "0"}})
    try:
        run_audits(specs, ["heads"], data, tmp_path / "ray", opts, engine="ray")
    finally:
        ray.shutdown()
    run_audits(specs, ["heads"], data, tmp_path / "local", opts)
    a, b = (json.loads((tmp_path / e / "results.json").read_text()) for e in ("ray", "local"))
    assert a["engine"] == "ray" and [r["step"] for r in a["reports"]] == [5, 12, 20]
    assert a["reports"][1]["error"] and a["reports"][1]["folder"] is None and a["exit_code"] == 1
    assert _strip(a) == _strip(b)
    for r in b["reports"]:
        if r["folder"]:
            ra, rb = (json.loads((tmp_path / e / r["folder"] / "results.json").read_text()) for e in ("ray", "local"))
            assert _strip(ra["provenance"]) == _strip(rb["provenance"]) and _strip(ra["checks"]) == _strip(rb["checks"])

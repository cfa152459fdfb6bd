"""A harvest killed with SIGKILL mid-run and started again gives the store of an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from interp.store import ActivationStore, harvest

NAMES = ["blocks.0.hook_resid_post", "blocks.2.hook_resid_pre"]
KW = dict(context_size=16, batch_size=2, shard_mb=0.03)  # 3 contexts per shard

SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)
    import interp
    from interp.store import harvest
    model_dir, out, names, kw, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5])
    m = interp.load(model_dir)
    # slow every forward down (the hook returns None: activations are unchanged) so the kill lands mid-run
    with m.intervene({"blocks.0.hook_resid_pre": lambda t, ctx: time.sleep(0.15)}):
        harvest(m, texts, names, out, **kw)
""")


def test_sigkill_then_rerun_is_bit_identical(model, model_dir, texts, tmp_path):
    ref = harvest(model, texts, NAMES, tmp_path / "ref", **KW)
    assert ref.n_shards >= 6
    out = tmp_path / "killed"
    env = {**os.environ, "INTERP_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(model_dir), str(out), json.dumps(NAMES),
                             json.dumps(KW), json.dumps(texts)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 240
    done = 0
    while time.time() < deadline and proc.poll() is None:
        try:
            done = len(json.loads((out / "manifest.json").read_text())["shards"])
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"harvest ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    man = json.loads((out / "manifest.json").read_text())
    assert not man["complete"] and 2 <= len(man["shards"]) < ref.n_shards
    res = harvest(model, texts, NAMES, out, **KW)  # the same call again
    assert res.shards_skipped == len(man["shards"]) and res.shards_written == ref.n_shards - len(man["shards"])
    assert not list(out.glob(".*.tmp"))  # temporary files of the killed run are gone
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "ref").iterdir())
    for e in ref.shards:
        assert (out / e["file"]).read_bytes() == (tmp_path / "ref" / e["file"]).read_bytes()
    a, b = json.loads((out / "manifest.json").read_text()), json.loads((tmp_path / "ref" / "manifest.json").read_text())
    assert a["shards"] == b["shards"] and a["n_tokens"] == b["n_tokens"]
    ActivationStore(out, verify=True)

"""Third-party steering methods plug in through the ``interp.steering`` entry-point group.

A real package (``tests/steering/plugin_pkg``) is pip-installed into the test environment, a fresh
interpreter discovers it through ``importlib.metadata`` entry points, fits it, saves and reloads its
vector (which must come back as the plug-in's own vector class), and the package is uninstalled again.
"""
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PKG = Path(__file__).resolve().parent / "plugin_pkg"
DIST = "interp-steering-plugin-example"

SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import torch
    import interp
    from interp import steering
    from interp.testing import tiny_model
    from interp.steering import SteeringData, SteeringVector

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = steering.available()
    cls = steering.get("example_pca")
    try:
        steering.get("example_broken")
        broken = "no error"
    except KeyError as exc:
        broken = str(exc)
    hf, tok = tiny_model("llama")
    model = interp.wrap(hf, tok)
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(65, 78, (12, 8), generator=g)
    neg = torch.randint(97, 110, (12, 8), generator=g)
    vec = cls(layer=1, scale=3.0).fit(model, SteeringData(pos, neg))
    vec.save(sys.argv[1])
    back = SteeringVector.load(sys.argv[1])
    base = model(neg)
    with back.apply(model):
        steered = model(neg)
    print(json.dumps({
        "names": names, "module": cls.__module__, "builtin_same": steering.get("repit") is steering.RepIt,
        "broken": broken, "warned": any("example_broken" in str(w.message) for w in caught),
        "loaded_class": type(back).__name__, "explained": back.explained, "hooks": list(back.hooks),
        "equal": bool(torch.equal(back.direction, vec.direction)),
        "changed": float((steered - base).abs().max()),
    }))
""")


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600)


def test_entry_point_plugin(tmp_path):
    src = tmp_path / "plugin_src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = _pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", str(src))
    assert done.returncode == 0, done.stderr
    try:
        run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "vec")], capture_output=True,
                             text=True, timeout=600, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        _pip("uninstall", "--yes", "--quiet", DIST)
    assert {"example_pca", "diff_in_means", "directional_ablation", "repit"} <= set(out["names"])
    assert out["module"] == "interp_steering_plugin_example" and out["builtin_same"]
    assert "failed to load" in out["broken"] and "DoesNotExist" in out["broken"] and out["warned"]
    assert out["loaded_class"] == "PCAVector" and 0 < out["explained"] <= 1
    assert out["hooks"] == ["blocks.1.hook_resid_pre"] and out["equal"] and out["changed"] > 1e-3
    # uninstalled again: a fresh interpreter no longer sees it
    after = subprocess.run([sys.executable, "-c", "from interp import steering; print('example_pca' in steering.available())"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert after.stdout.strip() == "False", after.stderr[-2000:]

"""Every notebook in notebooks/ is executed top to bottom, so none can rot."""
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # progress bars render as widgets (ipywidgets is a dev dependency): no tqdm fallback warning in any cell
    stderr = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")
    assert "IProgress not found" not in stderr and "TqdmWarning" not in stderr, stderr[-2000:]
    if path.stem == "transformer_lens_habits":  # what a TL user reads first: rich displays, plotly views, widget bars
        kinds = {k for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) for k in o.get("data", {})}
        assert {"text/html", "application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json"} <= kinds

"""Execute the notebooks on the embedded default (slow: they run the real model).

Set ``PARALLELMUSE_NOTEBOOK_OUT`` to a folder to keep the executed notebooks (with outputs) there.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    if out := os.environ.get("PARALLELMUSE_NOTEBOOK_OUT"):
        nbformat.write(nb, Path(out) / path.name)

"""A notebook with an EMPanel, run in a real kernel (nbclient) and saved, still shows the
panel's final plot without a kernel: as the ``image/png`` output of ``panel.snapshot()`` in the
``.ipynb`` (and so as an ``<img>`` in nbconvert's HTML), and as the plot image in the stored
widget state (what JupyterLab renders). The panel is local (no cluster): what is saved does
not depend on where the steps ran, and a kernel starting a cluster would take most of the test.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from mixle_nb.widgets.em_view import FIGSIZE
from mixle_nb.widgets.live_figure import DPI

pytestmark = pytest.mark.kernel

STEPS = 25
EXPECTED_SIZE = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))  # the panel's figure in pixels
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header (its IHDR chunk)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", png[16:24])


def executed_panel_notebook(path) -> str:
    """Run the panel notebook in a fresh kernel, save it to ``path``; the SHA-256 of the
    panel's final plot as the kernel saw it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import hashlib\n"
            "import numpy as np\n"
            "from mixle_nb.stats import GaussianDistribution, MixtureDistribution, seq_encode\n"
            "from mixle_nb.widgets import EMPanel\n"
            "rng = np.random.default_rng(0)\n"
            "x = np.concatenate([rng.normal(-2, 1, 2000), rng.normal(3, 0.7, 2000)])\n"
            "start = MixtureDistribution([GaussianDistribution(-1, 1), GaussianDistribution(1, 1)], [0.5, 0.5])\n"
            "panel = EMPanel(handle=seq_encode(x, model=start), estimator=start.estimator(), model=start,\n"
            "                data_sample=x)\n"
            "panel"
        ),
        nbformat.v4.new_code_cell(
            f"panel.run({STEPS})\nprint(len(panel.history), hashlib.sha256(panel.image.value).hexdigest())"
        ),
        nbformat.v4.new_code_cell("panel.snapshot()"),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=True).execute()
    nbformat.write(nb, path)
    steps, digest = nb.cells[1].outputs[0]["text"].split()
    assert int(steps) == STEPS
    return digest


def test_saved_notebook_shows_the_final_plot_in_html_and_without_a_kernel(tmp_path):
    path = tmp_path / "panel.ipynb"
    final = executed_panel_notebook(path)
    saved = nbformat.read(path, as_version=4)  # from disk: no kernel behind it

    # the snapshot cell's output is the final plot as a static image/png
    png = base64.b64decode(saved.cells[2].outputs[0]["data"]["image/png"])
    assert hashlib.sha256(png).hexdigest() == final
    assert png_size(png) == EXPECTED_SIZE

    # the stored widget state holds the same final plot, which JupyterLab draws without a kernel
    state = saved.metadata["widgets"][WIDGET_STATE]["state"]
    images = [m for m in state.values() if m["model_name"] == "ImageModel"]
    assert len(images) == 1
    (buffer,) = images[0]["buffers"]  # the image's bytes travel as a binary buffer, base64 in the file
    assert buffer["path"] == ["value"] and buffer["encoding"] == "base64"
    assert hashlib.sha256(base64.b64decode(buffer["data"])).hexdigest() == final

    # nbconvert's HTML shows it as an <img> with the PNG inline, and carries the widget state
    html, _ = HTMLExporter().from_notebook_node(saved)
    inline = [base64.b64decode(b) for b in re.findall(r'<img[^>]*src="data:image/png;base64,([^"]+)"', html)]
    assert [hashlib.sha256(p).hexdigest() for p in inline].count(final) == 1, len(inline)
    assert png_size(next(p for p in inline if hashlib.sha256(p).hexdigest() == final)) == EXPECTED_SIZE
    assert WIDGET_STATE in html

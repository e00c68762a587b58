"""The EM panel's HMM picture as a person sees it: JupyterLab in headless Chromium, Step clicked
three times in the browser on a local panel over four sequences (``notebooks/hmm_panel.ipynb``),
then the rendered picture read back from the browser's screenshot — the transition heat map's
colours and each state's colour where the sequence is drawn — and the page checked for errors.
The screenshot is the docs' picture (``docs/_static/hmm_panel_browser.png``, shown in
``docs/guide/hmm.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from labdriver import image_digest, opened, wait_for_new_digest

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "_static" / "hmm_panel_browser.png"
STEPS = 3


def pixels_near(image: np.ndarray, rgb: tuple, tolerance: float = 12.0) -> int:
    """How many pixels of ``image`` (H x W x 3, 0–255) lie within ``tolerance`` of ``rgb``."""
    return int((np.linalg.norm(image[..., :3].astype(float) - np.asarray(rgb, dtype=float), axis=-1) < tolerance).sum())


def test_the_hmm_picture_in_the_browser(lab, browser):
    from matplotlib import colormaps
    from matplotlib.colors import to_rgb
    from PIL import Image
    from playwright.sync_api import expect

    from mixle_nb.widgets.model_picture import COLOURS

    with opened(lab, browser, "hmm_panel.ipynb", label="hmm-panel") as notebook:
        notebook.run_all(timeout_s=120)
        panel = notebook.output_area("import numpy").locator(".jupyter-widgets.widget-vbox").first
        status = panel.locator(".widget-html-content")
        expect(status).to_have_text("step 0")
        image = panel.locator("img.widget-image").first
        expect(image).to_be_visible()
        digest = image_digest(image)
        for k in range(1, STEPS + 1):  # one click at a time: a click while a step runs is ignored
            panel.get_by_role("button", name="Step", exact=True).click()
            expect(status).to_have_text(re.compile(rf"^step {k} · log-density -?\d"))
            digest = wait_for_new_digest(image, digest)
        # the figure the kernel drew is the HMM picture of the model after the clicks
        assert notebook.kernel_value("len(hmm_panel.history)") == STEPS
        assert notebook.kernel_value("hmm_panel.view.picture.kind") == "hmm"
        heat_error = "float(abs(hmm_panel.view.picture.heat.get_array() - hmm_panel.model.transmat).max())"
        assert notebook.kernel_value(heat_error) == 0.0
        transmat = np.array(notebook.kernel_value("hmm_panel.model.transmat.tolist()"))
        path = set(
            notebook.kernel_value(
                "hmm_panel.model.seq_viterbi(hmm_panel.model.dist_to_encoder().seq_encode(seqs[:1]))[1].tolist()"
            )
        )
        # no error anywhere on the page: no traceback or stderr output, no script error
        expect(
            notebook.page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        ).to_have_count(0)
        expect(notebook.page.locator(".jp-OutputArea-output", has_text="Traceback")).to_have_count(0)
        assert not [line for line in notebook.console if line.startswith("[pageerror]")], notebook.console
        SCREENSHOT.parent.mkdir(exist_ok=True)
        panel.screenshot(path=str(SCREENSHOT))
    shot = np.asarray(Image.open(SCREENSHOT).convert("RGB"))
    # the heat map: the cells of the largest transition probabilities, in the Blues map's colour
    for p in np.sort(transmat.ravel())[-2:]:
        rgb = tuple(255 * np.asarray(colormaps["Blues"](float(p))[:3]))
        assert pixels_near(shot, rgb) > 200, f"no heat-map cell of colour {rgb} (p = {p:.3f}) in the screenshot"
    # the sequence coloured by its Viterbi states: each state on the path drawn in its colour
    for state in path:
        rgb = tuple(255 * np.asarray(to_rgb(COLOURS[state])))
        assert pixels_near(shot, rgb, tolerance=30) > 20, f"state {state}'s colour {COLOURS[state]} is not drawn"

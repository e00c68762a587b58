"""The EM panel's HMM picture as a person sees it: JupyterLab in headless Chromium, Step clicked
three times in the browser on a local panel over four sequences (``notebooks/hmm_panel.ipynb``),
then the rendered picture read back from the browser's screenshot — the transition heat map's
colours and each state's colour where the sequence is drawn — and the page checked for errors.
The screenshot is the docs' picture (``docs/_static/hmm_panel_browser.png``, shown in
``docs/guide/hmm.md``), rewritten there only by ``make screenshots`` (``labdriver.docs_picture``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from labdriver import docs_picture, image_digest, opened, wait_for_new_digest

pytestmark = pytest.mark.browser

STEPS = 3


def pixels_near(image: np.ndarray, rgb: tuple, tolerance: float = 12.0) -> int:
    """How many pixels of ``image`` (H x W x 3, 0–255) lie within ``tolerance`` of ``rgb``."""
    return int((np.linalg.norm(image[..., :3].astype(float) - np.asarray(rgb, dtype=float), axis=-1) < tolerance).sum())


# Computed in the kernel (so this process imports neither matplotlib nor mixle_nb.widgets): the
# colours the picture must show, as 0-255 RGB. The heat map's two largest transition
# probabilities in the Blues map, and the colour of each state on the first sequence's Viterbi path.
HEAT_COLOURS = (
    "[[float(255 * c) for c in __import__('matplotlib').colormaps['Blues'](float(p))[:3]] "
    "for p in sorted(hmm_panel.model.transmat.ravel())[-2:]]"
)
PATH_COLOURS = (
    "[[float(255 * c) for c in __import__('matplotlib.colors', fromlist=['to_rgb']).to_rgb("
    "__import__('mixle_nb.widgets.model_picture', fromlist=['COLOURS']).COLOURS[s])] for s in sorted(set("
    "hmm_panel.model.seq_viterbi(hmm_panel.model.dist_to_encoder().seq_encode(seqs[:1]))[1].tolist()))]"
)
HEAT_ERROR = "float(abs(hmm_panel.view.picture.heat.get_array() - hmm_panel.model.transmat).max())"


def test_the_hmm_picture_in_the_browser(lab, browser):
    from PIL import Image
    from playwright.sync_api import expect

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
        assert notebook.kernel_value(HEAT_ERROR) == 0.0
        heat, states = notebook.kernel_value(HEAT_COLOURS), notebook.kernel_value(PATH_COLOURS)
        # no error anywhere on the page: no traceback or stderr output, no script error
        page = notebook.page
        expect(page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")).to_have_count(0)
        expect(page.locator(".jp-OutputArea-output", has_text="Traceback")).to_have_count(0)
        assert not [line for line in notebook.console if line.startswith("[pageerror]")], notebook.console
        screenshot = docs_picture("hmm_panel_browser.png")
        panel.screenshot(path=str(screenshot))
    shot = np.asarray(Image.open(screenshot).convert("RGB"))
    for rgb in heat:  # the heat map's cells of the largest transition probabilities
        assert pixels_near(shot, rgb) > 200, f"no heat-map cell of colour {rgb} in the screenshot"
    assert len(states) >= 2, "the first sequence's Viterbi path visits one state only"
    for rgb in states:  # the sequence coloured by its Viterbi states
        assert pixels_near(shot, rgb, tolerance=30) > 20, f"a state's colour {rgb} is not drawn"

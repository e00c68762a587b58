"""Every view of the panels as a person sees it in JupyterLab (headless Chromium), with a
screenshot of each in ``tests/browser/artifacts/``: the EM panel after a 200-step run clicked
in the browser (the message rate to the front end measured on the page's websocket while it
runs), Gaussians in four dimensions, categorical and Poisson mixtures, a model with no
picture, and the training panel with held-out points and an entropy floor.
"""
from __future__ import annotations

import re
import time

import pytest

from labdriver import opened, save_screenshot

pytestmark = pytest.mark.browser

NOTEBOOK = "panel_views.ipynb"
MAX_UPDATES_PER_S = 10


@pytest.fixture(scope="module")
def notebook(lab, browser):
    with opened(lab, browser, NOTEBOOK, label="views-run-all") as page:
        page.run_all(timeout_s=400)
        yield page


def panel_of(page, cell_start: str):
    return page.output_area(cell_start).locator(".jupyter-widgets.widget-vbox").first


def loaded_image(panel):
    from playwright.sync_api import expect

    image = panel.locator("img.widget-image").first
    expect(image).to_be_visible()
    panel.page.wait_for_function("img => img.complete && img.naturalWidth > 300", arg=image.element_handle())
    return image


# Records when the image element's source changes: each change is one plot update drawn.
_JS_WATCH_IMAGE = """
(img) => {
  window.__mixleImageUpdates = [];
  new MutationObserver(() => window.__mixleImageUpdates.push(performance.now()))
    .observe(img, {attributes: true, attributeFilter: ['src']});
}
"""


def max_per_second(times_ms) -> int:
    return max((sum(1 for u in times_ms if t <= u < t + 1000.0) for t in times_ms), default=0)


def test_em_panel_after_a_200_step_run_clicked_in_the_browser(notebook):
    from playwright.sync_api import expect

    page = notebook.page
    panel = panel_of(notebook, "# one-dimensional")
    status = panel.locator(".widget-html-content")
    expect(status).to_have_text("step 0")
    image = loaded_image(panel)
    image.evaluate(_JS_WATCH_IMAGE)
    n_box = panel.locator(".widget-inline-hbox input[type=number]")
    n_box.fill("200")
    n_box.press("Enter")
    notebook.wait_kernel_value("em_1d.n_steps.value", lambda v: v == 200, what="N typed in the browser")
    redraws_before = notebook.kernel_value("em_1d.redraws")
    panel.get_by_role("button", name="Run N", exact=True).click()
    notebook.wait_kernel_value("len(em_1d.history)", lambda v: v == 200, timeout_s=300, what="the 200-step run")
    notebook.wait_kernel_value("em_1d.running", lambda v: v is False, what="the run's end")
    expect(panel.locator(".widget-html-content")).to_have_text(re.compile(r"^step 200 · log-density -\d"),
                                                               timeout=30_000)
    page.wait_for_timeout(500)
    sent = notebook.kernel_value("em_1d.redraws") - redraws_before
    times = page.evaluate("() => window.__mixleImageUpdates")
    assert len(times) >= 3, f"only {len(times)} plot updates reached the page ({sent} sent)"
    assert max_per_second(times) <= MAX_UPDATES_PER_S, f"{max_per_second(times)} plot updates in one second"
    save_screenshot(panel, "view_em_1d_after_200_steps.png")


@pytest.mark.parametrize("cell, name, kind", [
    ("# four dimensions", "view_em_4d_ellipses.png", "ellipses"),
    ("# categorical mixture", "view_em_categorical_bars.png", "categorical"),
    ("# Poisson mixture", "view_em_poisson_bars.png", "poisson"),
    ("# a model the panel cannot draw", "view_em_no_picture.png", None),
])
def test_model_pictures(notebook, cell, name, kind):
    from playwright.sync_api import expect

    panel = panel_of(notebook, cell)
    loaded_image(panel)
    variable = {"ellipses": "em_4d", "categorical": "em_cat", "poisson": "em_pois", None: "no_picture"}[kind]
    assert notebook.kernel_value(f"{variable}.view.picture.kind") == kind
    if kind is not None:
        expect(panel.locator(".widget-html-content")).to_have_text(re.compile(r"^step 15 · log-density -\d"))
    shot = save_screenshot(panel, name)
    assert shot.stat().st_size > 10_000


def test_train_panel_with_held_out_points_and_entropy_floor(notebook):
    from playwright.sync_api import expect

    panel = panel_of(notebook, "# training")
    loaded_image(panel)
    expect(panel.locator(".widget-html-content")).to_have_text(re.compile(r"^step (\d+)/\1 · mean loss .* held-out"))
    assert notebook.kernel_value("len(train_panel.held_out)") == 1
    expect(panel.locator("textarea")).to_have_value(re.compile(r"^The .{20,}", re.S))
    save_screenshot(panel, "view_train_steps.png")
    before = loaded_image(panel).screenshot()
    panel.get_by_role("button", name="targets", exact=True).click()  # x axis: targets
    panel.get_by_role("checkbox", name="log scale").check()
    notebook.wait_kernel_value("(train_panel.x_axis.value, train_panel.log_scale.value)",
                               lambda v: v == ("targets", True), what="the view toggles")
    notebook.wait_kernel_value("train_panel.view.ax.get_yscale()", lambda v: v == "log", what="the log view")
    deadline = time.monotonic() + 30
    while loaded_image(panel).screenshot() == before:
        assert time.monotonic() < deadline, "the plot did not change after the toggles"
        panel.page.wait_for_timeout(200)
    save_screenshot(panel, "view_train_targets_log.png")

"""Every view of the panels as a person sees it in JupyterLab (headless Chromium), with a
screenshot of each in ``tests/browser/artifacts/``: the EM panel after a 200-step run clicked
in the browser (the message rate to the front end measured on the page's websocket while it
runs), Gaussians in four dimensions, categorical and Poisson mixtures, a model with no
picture, and the training panel with held-out points and an entropy floor.
"""

from __future__ import annotations

import re

import pytest
from figure_checks import (
    assert_curve_fits_the_steps,
    assert_em_axes_fit,
    assert_fills_its_axes,
    assert_loss_axes_fit,
    assert_rank_bars_in_ms,
    axis_limits,
)
from labdriver import image_digest, opened, save_screenshot, type_number, wait_for_new_digest

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
    type_number(notebook, panel, "N", 200, "em_1d.n_steps.value")
    redraws_before = notebook.kernel_value("em_1d.redraws")
    panel.get_by_role("button", name="Run N", exact=True).click()
    notebook.wait_kernel_value("len(em_1d.history)", lambda v: v == 200, timeout_s=300, what="the 200-step run")
    notebook.wait_kernel_value("em_1d.running", lambda v: v is False, what="the run's end")
    expect(panel.locator(".widget-html-content")).to_have_text(
        re.compile(r"^step 200 · log-density -\d"), timeout=30_000
    )
    page.wait_for_timeout(500)
    sent = notebook.kernel_value("em_1d.redraws") - redraws_before
    times = page.evaluate("() => window.__mixleImageUpdates")
    assert len(times) >= 3, f"only {len(times)} plot updates reached the page ({sent} sent)"
    assert max_per_second(times) <= MAX_UPDATES_PER_S, f"{max_per_second(times)} plot updates in one second"
    assert_curve_fits_the_steps(notebook, "em_1d", 200)
    assert_rank_bars_in_ms(notebook, "em_1d")
    assert_em_axes_fit(notebook, "em_1d")
    save_screenshot(panel, "view_em_1d_after_200_steps.png")


# What each picture must hold, computed in the kernel from the model's parameters: the largest
# difference between the drawn artists and the model (ellipse centres against the projected
# means, bar heights against the probabilities, by scipy for Poisson), or the picture's text.
PICTURE_ERROR = {
    "ellipses": (
        "float(max(abs(__import__('numpy').subtract(e.get_center(), em_4d.view.picture.matrix @ c.mu)).max() "
        "for e, c in zip(em_4d.view.picture.ellipses, em_4d.model.components)))"
    ),
    "categorical": (
        "float(max(abs(p.get_height() - c.pmap.get(key, 0.0)) for bars, c in "
        "zip(em_cat.view.picture.bars, em_cat.model.components) "
        "for p, key in zip(bars, em_cat.view.picture.labels)))"
    ),
    "poisson": (
        "float(max(abs(p.get_height() - __import__('scipy.stats', fromlist=['poisson']).poisson.pmf(k, c.lam)) "
        "for bars, c in zip(em_pois.view.picture.bars, em_pois.model.components) "
        "for p, k in zip(bars, em_pois.view.picture.labels)))"
    ),
}
PICTURE_ARTISTS = {
    "ellipses": "len(em_4d.view.picture.ellipses)",
    "categorical": "len(em_cat.view.picture.bars)",
    "poisson": "len(em_pois.view.picture.bars)",
}


@pytest.mark.parametrize(
    "cell, name, kind",
    [
        ("# four dimensions", "view_em_4d_ellipses.png", "ellipses"),
        ("# categorical mixture", "view_em_categorical_bars.png", "categorical"),
        ("# Poisson mixture", "view_em_poisson_bars.png", "poisson"),
        ("# a model the panel cannot draw", "view_em_no_picture.png", None),
    ],
)
def test_model_pictures(notebook, cell, name, kind):
    from playwright.sync_api import expect

    panel = panel_of(notebook, cell)
    loaded_image(panel)
    variable = {"ellipses": "em_4d", "categorical": "em_cat", "poisson": "em_pois", None: "no_picture"}[kind]
    assert notebook.kernel_value(f"{variable}.view.picture.kind") == kind
    if kind is None:
        assert notebook.kernel_value("[t.get_text() for t in no_picture.view.picture.ax.texts]") == [
            "no picture for this model"
        ]
    else:
        expect(panel.locator(".widget-html-content")).to_have_text(re.compile(r"^step 15 · log-density -\d"))
        assert notebook.kernel_value(f"{variable}.view.model is {variable}.model") is True
        assert notebook.kernel_value(PICTURE_ARTISTS[kind]) == notebook.kernel_value(
            f"len({variable}.model.components)"
        )
        assert notebook.kernel_value(PICTURE_ERROR[kind]) < 1e-12
        assert_curve_fits_the_steps(notebook, variable, 15)
        assert_rank_bars_in_ms(notebook, variable)
    save_screenshot(panel, name)


def test_train_panel_with_held_out_points_and_entropy_floor(notebook):
    from playwright.sync_api import expect

    panel = panel_of(notebook, "# training")
    loaded_image(panel)
    expect(panel.locator(".widget-html-content")).to_have_text(re.compile(r"^step (\d+)/\1 · mean loss .* held-out"))
    assert notebook.kernel_value("len(train_panel.held_out)") == 1
    expect(panel.locator("textarea")).to_have_value(re.compile(r"^The .{20,}", re.S))
    assert_loss_figure(notebook, "steps")
    assert_loss_axes_fit(notebook, "train_panel")
    save_screenshot(panel, "view_train_steps.png")
    digest = image_digest(loaded_image(panel))
    panel.get_by_role("button", name="targets", exact=True).click()  # x axis: targets
    panel.get_by_role("checkbox", name="log scale").check()
    notebook.wait_kernel_value(
        "(train_panel.x_axis.value, train_panel.log_scale.value)",
        lambda v: v == ("targets", True),
        what="the view toggles",
    )
    notebook.wait_kernel_value("train_panel.view.ax.get_yscale()", lambda v: v == "log", what="the log view")
    wait_for_new_digest(loaded_image(panel), digest)
    notebook.wait_kernel_value("len(train_panel.view.mean.get_xdata())", lambda v: v > 0, what="the redrawn curve")
    assert_loss_figure(notebook, "targets")
    assert_loss_axes_fit(notebook, "train_panel")
    save_screenshot(panel, "view_train_targets_log.png")

    # fit recent half: the y axis fits the losses of the latest half of the targets
    digest = image_digest(loaded_image(panel))
    panel.get_by_role("checkbox", name="fit recent half").check()
    notebook.wait_kernel_value("train_panel.view.fit_recent", lambda v: v is True, what="the recent view")
    wait_for_new_digest(loaded_image(panel), digest)
    notebook.wait_kernel_value("len(train_panel.view.mean.get_xdata())", lambda v: v > 0, what="the redrawn curve")
    drawn = "(*train_panel.view.raw.values(), train_panel.view.mean, train_panel.view.held_out)"
    late = (
        f"[y for l in {drawn} for x, y in zip(*l.get_data()) "
        f"if x >= 0.5 * max(x for m in {drawn} for x in m.get_xdata())]"
    )
    assert_fills_its_axes(notebook, "train_panel", "train_panel.view.ax", late, "the latest half's losses")
    save_screenshot(panel, "view_train_fit_recent.png")


def assert_loss_figure(notebook, x_axis: str) -> None:
    """The training figure holds the held-out point and each rank's points at their steps or
    targets, the entropy floor's line, and an x axis from 0 covering them."""
    column = {"steps": 0, "targets": 1}[x_axis]
    assert notebook.kernel_value(f"{x_axis[:-1]!r} in train_panel.view.ax.get_xlabel()") is True
    drawn = notebook.kernel_value(
        "([(float(x), float(y)) for x, y in zip(*train_panel.view.held_out.get_data())], "
        "[[(float(x), float(y)) for x, y in zip(*l.get_data())] for l in train_panel.view.raw.values()])"
    )
    truth = notebook.kernel_value(
        f"([(float(p[{column}]), float(p[2])) for p in train_panel.held_out], "
        f"[[(float(p[{column}]), float(p[2])) for p in train_panel.points[r]] for r in train_panel.view.raw])"
    )
    assert drawn == truth and len(truth[0]) == 1 and len(truth[1]) == 1
    floors = notebook.kernel_value(
        "[list(map(float, l.get_ydata())) for l in train_panel.view.ax.get_lines() if l.get_linestyle() == '--']"
    )
    assert floors == [[1.0, 1.0]]
    low, high = axis_limits(notebook, "train_panel.view.ax")
    assert low == 0.0 and high >= max(x for pts in truth[1] for x, _ in pts)

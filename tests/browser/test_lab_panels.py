"""The panels as a person meets them: JupyterLab in headless Chromium, clicks in the browser.

One notebook (``notebooks/cluster_panels.ipynb``: a 2-engine cluster, an EMPanel and a
TrainPanel) is opened and run once for the module; each test checks its own panel.
"""

from __future__ import annotations

import re

import pytest
from figure_checks import (
    assert_curve_fits_the_steps,
    assert_em_axes_fit,
    assert_loss_axes_fit,
    assert_rank_bars_in_ms,
    axis_limits,
)
from labdriver import image_digest, opened, save_screenshot, type_number, wait_for_new_digest

pytestmark = pytest.mark.browser

NOTEBOOK = "cluster_panels.ipynb"


@pytest.fixture(scope="module")
def notebook(lab, browser):
    """The panels notebook, open in Lab with every cell run in the browser."""
    with opened(lab, browser, NOTEBOOK, label="run-all") as page:
        page.run_all()
        yield page


def panel_with_button(page, label: str):
    """The widget box (ipywidgets VBox) holding the panel whose buttons include ``label``."""
    return page.page.locator(".jp-OutputArea-output .jupyter-widgets.widget-vbox").filter(
        has=page.page.get_by_role("button", name=label, exact=True)
    )


def step_count(status_text: str) -> int:
    match = re.match(r"step (\d+)", status_text.strip())
    assert match, f"unexpected panel status {status_text!r}"
    return int(match.group(1))


# the largest difference between the drawn density and the panel's model's, by scipy
DENSITY_ERROR = (
    "float(abs(em_panel.view.picture.line.get_ydata() - sum("
    "w * __import__('scipy.stats', fromlist=['norm']).norm.pdf(em_panel.view.picture.grid, c.mu, "
    "c.sigma2 ** 0.5) for w, c in zip(em_panel.model.w, em_panel.model.components))).max())"
)


def test_em_panel_buttons_clicked_in_the_browser(notebook):
    """Step, Run N (N = 100,000) and Pause, Back, Reset, Init and Choose K, each clicked; after
    each, what the figure holds: the curve's points, step axes fitted to the steps taken (not
    to N), the rank bars in milliseconds on an axis scaled to them, the model's density."""
    from playwright.sync_api import expect

    panel = panel_with_button(notebook, "Run N")
    expect(panel).to_have_count(1)
    expect(panel.locator("button.widget-button")).to_have_text(
        ["Step", "Run N", "Pause", "Back", "Reset", "Init", "Choose K"]
    )
    expect(panel.locator(".widget-hprogress .progress-bar")).to_have_count(1)
    image = panel.locator("img.widget-image")
    expect(image).to_have_count(1)
    expect(image).to_be_visible()
    status = panel.locator(".widget-html-content")
    expect(status).to_have_text("step 0")
    digest = image_digest(image)

    def click(name: str) -> None:
        panel.get_by_role("button", name=name, exact=True).click()

    for k in (1, 2, 3):  # one click at a time: a click while a step runs is ignored by design
        click("Step")
        expect(status).to_have_text(re.compile(rf"^step {k} · log-density -?\d"))
        digest = wait_for_new_digest(image, digest)
    assert_curve_fits_the_steps(notebook, "em_panel", 3)
    assert_rank_bars_in_ms(notebook, "em_panel")
    assert_em_axes_fit(notebook, "em_panel")
    save_screenshot(panel, "em_panel_after_3_steps.png")

    n = 100_000  # minutes of steps: Run N sends batches of about 0.2 s, so a short run could end before Pause lands
    type_number(notebook, panel, "N", n, "em_panel.n_steps.value")
    click("Run N")
    # under way: at least two steps of the run shown in the browser
    expect(status).to_have_text(re.compile(r"^step ([5-9]|\d\d+) "), timeout=60_000)
    seen = step_count(status.inner_text())
    click("Pause")
    notebook.wait_kernel_value("em_panel.running", lambda v: v is False, what="the run after Pause")
    final = notebook.kernel_value("len(em_panel.history)")
    assert seen <= final < 3 + n, f"Pause at step {seen}, run ended at {final} of {3 + n}"
    expect(status).to_have_text(re.compile(rf"^step {final} · log-density"))
    width = panel.locator(".widget-hprogress .progress-bar").evaluate("e => parseFloat(e.style.width)")
    assert width < 100, f"progress bar full ({width}%) after a paused run"
    assert_curve_fits_the_steps(notebook, "em_panel", final)  # to the steps taken, not to N
    assert_rank_bars_in_ms(notebook, "em_panel")
    assert_em_axes_fit(notebook, "em_panel")
    save_screenshot(panel, "em_panel_after_pause.png")

    for clicked, steps in (("Back", final - 1), ("Reset", 0)):
        click(clicked)
        expect(status).to_have_text(re.compile(rf"^step {steps}( · |$)"))
        assert_curve_fits_the_steps(notebook, "em_panel", steps)
        assert_em_axes_fit(notebook, "em_panel")
        save_screenshot(panel, f"em_panel_after_{clicked.lower()}.png")
    assert notebook.kernel_value("len(em_panel.view.objective_line.get_xdata())") == 0

    # Init: a k-means++ start from the data replaces the start model, and the picture draws it
    start = notebook.kernel_value("id(em_panel.start_model)")
    click("Init")
    notebook.wait_kernel_value("id(em_panel.start_model)", lambda v: v != start, what="the start after Init")
    notebook.wait_kernel_value("em_panel.running", lambda v: v is False, what="Init's end")
    assert notebook.kernel_value("repr(em_panel.start_model) != repr(start)") is True
    assert notebook.kernel_value(DENSITY_ERROR) < 1e-12
    expect(status).to_have_text("step 0")
    assert_em_axes_fit(notebook, "em_panel")  # the new model's picture

    # Choose K: K = 1..3 fitted on the ranks; BIC picks the data's two components, and its plot
    # appears below the panel's
    type_number(notebook, panel, "K max", 3, "em_panel.k_max.value")
    click("Choose K")
    expect(status).to_have_text(re.compile(r"BIC chooses K = 2 \(of 1\.\.3\)$"), timeout=120_000)
    choice = notebook.kernel_value("(em_panel.k_choice['k'], [float(b) for b in em_panel.k_choice['bic']])")
    assert choice[0] == [1, 2, 3] and min(choice[1]) == choice[1][1], choice
    expect(image).to_have_count(2)
    panel.page.wait_for_function("img => img.complete && img.naturalWidth > 200", arg=image.nth(1).element_handle())
    save_screenshot(panel, "em_panel_after_choose_k.png")


def test_train_panel_trains_stops_and_trains_on_from_browser_clicks(notebook):
    """Train, Stop (after the chunk under way) and Train again to the end, clicked; the figure
    holds each rank's points and the smoothed mean as they come, its x axis covering them."""
    from playwright.sync_api import expect

    panel = panel_with_button(notebook, "Train")
    expect(panel).to_have_count(1)
    expect(panel.locator("button.widget-button")).to_have_text(["Train", "Stop"])
    expect(panel.locator(".widget-hprogress .progress-bar")).to_have_count(1)
    image = panel.locator("img.widget-image")
    expect(image).to_be_visible()
    sample = panel.locator("textarea")
    expect(sample).to_have_value("")
    status = panel.locator(".widget-html-content")
    drawn = (
        "(len(train_panel.view.mean.get_xdata()), "
        "[float(l.get_xdata()[-1]) for l in train_panel.view.raw.values()], "
        "[float(p[-1][0]) for r, p in sorted(train_panel.points.items())])"
    )

    panel.get_by_role("button", name="Train", exact=True).click()
    notebook.wait_kernel_value("len(train_panel.view.mean.get_xdata())", lambda v: v >= 3, what="3 reports drawn")
    assert_loss_axes_fit(notebook, "train_panel")  # from the first reports on
    # a few loss reports in (a curve, not one point), well before the end
    expect(status).to_have_text(re.compile(r"^step ([4-9]\d|1\d\d)/\d+ · mean loss"), timeout=60_000)
    digest = image_digest(image)
    assert_loss_axes_fit(notebook, "train_panel")
    save_screenshot(panel, "train_panel_midrun_1.png")
    first = notebook.kernel_value(drawn)[0]
    wait_for_new_digest(image, digest, timeout_s=60)  # the browser gets the curve as it grows
    notebook.wait_kernel_value(drawn, lambda v: v[0] > first, what="more mean points drawn")
    assert notebook.kernel_value("train_panel.running") is True, "training ended before the curve grew"
    save_screenshot(panel, "train_panel_midrun_2.png")

    panel.get_by_role("button", name="Stop", exact=True).click()
    notebook.wait_kernel_value("train_panel.running", lambda v: v is False, what="training after Stop")
    # each rank's curve drawn to its last report, where the chunk under way ended
    _, _, points_end = notebook.wait_kernel_value(drawn, lambda v: v[1] == v[2], what="the curves after Stop")
    stopped, total = int(max(points_end)), notebook.kernel_value("train_panel.progress.max")
    assert 0 < stopped < total, (stopped, total)
    expect(status).to_have_text(re.compile(rf"^step {stopped}/{total} · mean loss"))
    assert axis_limits(notebook, "train_panel.view.ax")[1] >= stopped
    assert_loss_axes_fit(notebook, "train_panel")
    save_screenshot(panel, "train_panel_after_stop.png")

    panel.get_by_role("button", name="Train", exact=True).click()  # on from where Stop left it
    expect(sample).to_have_value(re.compile(r"^The .{20,}", re.S), timeout=180_000)
    assert notebook.kernel_value("train_panel.error is None") is True
    assert notebook.kernel_value("sorted(train_panel.curves)") == [0, 1]
    expect(status).to_have_text(re.compile(rf"^step {total}/{total} · mean loss"))  # ran to the end
    notebook.wait_kernel_value(drawn, lambda v: v[1] == v[2] == [float(total)] * 2, what="the curves at the end")
    assert axis_limits(notebook, "train_panel.view.ax")[1] >= total
    assert_loss_axes_fit(notebook, "train_panel")
    save_screenshot(panel, "train_panel_done.png")


def test_cluster_status_magic_renders_its_table(notebook):
    from playwright.sync_api import expect

    table = notebook.output_area("%mixle_cluster status").locator("table")
    expect(table).to_have_count(1)
    expect(table.locator("thead th")).to_have_text(
        ["engine_id", "rank", "pid", "host", "alive", "in_group", "rss_MiB", "last_call_s"]
    )
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(2)
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(2)]
    assert [c[1] for c in cells] == ["0", "1"]
    assert all(c[4] == "True" and c[5] == "True" for c in cells), cells
    pids = notebook.kernel_value("[row.pid for row in mixle.status()]")
    assert [int(c[2]) for c in cells] == pids  # the table shows this cluster's engines
    save_screenshot(notebook.output_area("%mixle_cluster status"), "cluster_status.png")

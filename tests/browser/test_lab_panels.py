"""The panels as a person meets them: JupyterLab in headless Chromium, clicks in the browser.

One notebook (``notebooks/cluster_panels.ipynb``: a 2-engine cluster, an EMPanel and a
TrainPanel) is opened and run once for the module; each test checks its own panel.
"""
from __future__ import annotations

import re
import time

import pytest

from labdriver import opened, save_screenshot

pytestmark = pytest.mark.browser

NOTEBOOK = "cluster_panels.ipynb"

# An image's bytes as the browser holds them (the widget's PNG, via its blob: URL).
_JS_IMAGE_DIGEST = """
async (img) => {
  if (!img.src || !img.complete || img.naturalWidth === 0) return null;
  const bytes = await (await fetch(img.src)).arrayBuffer();
  const digest = await crypto.subtle.digest('SHA-256', bytes);
  return Array.from(new Uint8Array(digest), b => b.toString(16).padStart(2, '0')).join('');
}
"""


@pytest.fixture(scope="module")
def notebook(lab, browser):
    """The panels notebook, open in Lab with every cell run in the browser."""
    with opened(lab, browser, NOTEBOOK, label="run-all") as page:
        page.run_all()
        yield page


def panel_with_button(page, label: str):
    """The widget box (ipywidgets VBox) holding the panel whose buttons include ``label``."""
    return (page.page.locator(".jp-OutputArea-output .jupyter-widgets.widget-vbox")
            .filter(has=page.page.get_by_role("button", name=label, exact=True)))


def image_digest(image) -> str:
    digest = image.evaluate(_JS_IMAGE_DIGEST)
    assert digest, "the plot image has not loaded"
    return digest


def wait_for_new_digest(page, image, previous: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        digest = image.evaluate(_JS_IMAGE_DIGEST)
        if digest and digest != previous:
            return digest
        assert time.monotonic() < deadline, f"the plot image did not change within {timeout_s} s"
        page.page.wait_for_timeout(100)


def step_count(status_text: str) -> int:
    match = re.match(r"step (\d+)", status_text.strip())
    assert match, f"unexpected panel status {status_text!r}"
    return int(match.group(1))


def test_em_panel_steps_runs_and_pauses_from_browser_clicks(notebook):
    from playwright.sync_api import expect

    panel = panel_with_button(notebook, "Run N")
    expect(panel).to_have_count(1)
    expect(panel.locator("button.widget-button")).to_have_text(["Step", "Run N", "Pause", "Back", "Reset"])
    expect(panel.locator(".widget-hprogress .progress-bar")).to_have_count(1)
    image = panel.locator("img.widget-image")
    expect(image).to_have_count(1)
    expect(image).to_be_visible()
    status = panel.locator(".widget-html-content")
    expect(status).to_have_text("step 0")
    digest = image_digest(image)

    for k in (1, 2, 3):  # one click at a time: a click while a step runs is ignored by design
        panel.get_by_role("button", name="Step", exact=True).click()
        expect(status).to_have_text(re.compile(rf"^step {k} · log-density -?\d"))
        digest = wait_for_new_digest(notebook, image, digest)
    expect(status).to_have_text(re.compile(r"^step 3 · log-density"))
    assert notebook.kernel_value("len(em_panel.history)") == 3
    shot = save_screenshot(panel, "em_panel_after_3_steps.png")
    assert shot.stat().st_size > 10_000

    n = 100_000  # minutes of steps: Run N sends batches of about 0.2 s, so a short run could end before Pause lands
    n_box = panel.locator(".widget-inline-hbox input[type=number]")
    n_box.fill(str(n))
    n_box.press("Enter")
    notebook.wait_kernel_value("em_panel.n_steps.value", lambda v: v == n, what="N typed in the browser")
    panel.get_by_role("button", name="Run N", exact=True).click()
    # under way: at least two steps of the run shown in the browser
    expect(status).to_have_text(re.compile(r"^step ([5-9]|\d\d+) "), timeout=60_000)
    seen = step_count(status.inner_text())
    panel.get_by_role("button", name="Pause", exact=True).click()
    notebook.wait_kernel_value("em_panel.running", lambda v: v is False, what="the run after Pause")
    final = notebook.kernel_value("len(em_panel.history)")
    assert seen <= final < 3 + n, f"Pause at step {seen}, run ended at {final} of {3 + n}"
    expect(status).to_have_text(re.compile(rf"^step {final} · log-density"))
    width = panel.locator(".widget-hprogress .progress-bar").evaluate("e => parseFloat(e.style.width)")
    assert width < 100, f"progress bar full ({width}%) after a paused run"
    save_screenshot(panel, "em_panel_after_pause.png")

    # what the figure holds: every step's log-density as the curve's points, the last step's
    # E-step milliseconds as the rank bars; after Back one point fewer, after Reset none
    curve_is_history = ("list(em_panel.view.objective_line.get_ydata()) == "
                        "[r.log_density for r in em_panel.history]")
    bars_are_ms = ("[b.get_height() for b in em_panel.view.bars] == "
                   "[1e3 * s for s in em_panel.history[-1].rank_seconds]")
    for clicked, steps in (("Back", final - 1), ("Reset", 0)):
        panel.get_by_role("button", name=clicked, exact=True).click()
        expect(status).to_have_text(re.compile(rf"^step {steps}( · |$)"))
        assert notebook.kernel_value("len(em_panel.history)") == steps
        notebook.wait_kernel_value(curve_is_history, lambda v: v is True, what=f"the curve after {clicked}")
        if steps:
            assert notebook.kernel_value(bars_are_ms) is True
    assert notebook.kernel_value("len(em_panel.view.objective_line.get_xdata())") == 0


def test_train_panel_loss_curve_updates_while_training_then_shows_text(notebook):
    from playwright.sync_api import expect

    panel = panel_with_button(notebook, "Train")
    expect(panel).to_have_count(1)
    expect(panel.locator("button.widget-button")).to_have_text(["Train", "Stop"])
    expect(panel.locator(".widget-hprogress .progress-bar")).to_have_count(1)
    image = panel.locator("img.widget-image")
    expect(image).to_be_visible()
    sample = panel.locator("textarea")
    expect(sample).to_have_value("")

    panel.get_by_role("button", name="Train", exact=True).click()
    status = panel.locator(".widget-html-content")
    # a few loss reports in (a curve, not one point), well before the end
    expect(status).to_have_text(re.compile(r"^step ([4-9]\d|1\d\d)/\d+ · mean loss"), timeout=60_000)
    first = image.screenshot()
    save_screenshot(panel, "train_panel_midrun_1.png")
    taken = time.monotonic()
    while True:  # seconds later, the loss curve itself (the image, not only the status) differs
        notebook.page.wait_for_timeout(500)
        second = image.screenshot()
        if time.monotonic() - taken >= 2 and second != first:
            break
        assert time.monotonic() - taken < 60, "the loss curve did not change within 60 s of training"
    save_screenshot(panel, "train_panel_midrun_2.png")
    assert notebook.kernel_value("train_panel.running") is True, "training ended before the second screenshot"

    expect(sample).to_have_value(re.compile(r"^The .{20,}", re.S), timeout=180_000)
    assert notebook.kernel_value("train_panel.error is None") is True
    assert notebook.kernel_value("sorted(train_panel.curves)") == [0, 1]
    expect(status).to_have_text(re.compile(r"^step (\d+)/\1 · mean loss"))  # ran to the end
    save_screenshot(panel, "train_panel_done.png")


def test_cluster_status_magic_renders_its_table(notebook):
    from playwright.sync_api import expect

    table = notebook.output_area("%mixle_cluster status").locator("table")
    expect(table).to_have_count(1)
    expect(table.locator("thead th")).to_have_text(
        ["engine_id", "rank", "pid", "host", "alive", "in_group", "rss_MiB", "last_call_s"])
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(2)
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(2)]
    assert [c[1] for c in cells] == ["0", "1"]
    assert all(c[4] == "True" and c[5] == "True" for c in cells), cells
    pids = notebook.kernel_value("[row.pid for row in mixle.status()]")
    assert [int(c[2]) for c in cells] == pids  # the table shows this cluster's engines
    save_screenshot(notebook.output_area("%mixle_cluster status"), "cluster_status.png")

"""A notebook executed headlessly (as ``make demo`` does) and signed as trusted opens in
JupyterLab with its panels rendered from the stored widget state: live-looking widgets with
their plot images, not the text fallback and not "Loading widget...".
"""

from __future__ import annotations

import re
import subprocess
import sys

import nbformat
import pytest
from labdriver import ARTIFACTS, NOTEBOOKS, opened, save_screenshot
from nbformat.sign import NotebookNotary

pytestmark = pytest.mark.browser

# The notebook to open. Without stored widget state it is executed here first (nbclient,
# store_widget_state=True, in the session's Jupyter directories); an already executed notebook
# (e.g. the demo's out/02_distributed_em.ipynb) is only copied and signed.
STORED_STATE_NOTEBOOK = NOTEBOOKS / "stored_panels.ipynb"

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
EXECUTE_TIMEOUT_S = 300

_EXECUTE = """
import sys
import nbformat
from nbclient import NotebookClient
src, dest, cwd = sys.argv[1:4]
nb = nbformat.read(src, as_version=4)
NotebookClient(nb, timeout=int(sys.argv[4]), kernel_name="python3", store_widget_state=True,
               resources={"metadata": {"path": cwd}}).execute()
nbformat.write(nb, dest)
"""


def has_widget_state(nb) -> bool:
    return bool(nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state"))


def widget_views(nb) -> int:
    return sum(
        WIDGET_VIEW in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )


def executed(lab, src, dest):
    """``src`` executed headlessly into ``dest`` in a separate process (its own event loop,
    the session's Jupyter directories), unless it already carries widget state."""
    if not has_widget_state(nbformat.read(src, as_version=4)):
        env = {k: v for k, v in lab.env.items() if k != "JUPYTER_TOKEN"}
        run = subprocess.run(
            [sys.executable, "-c", _EXECUTE, str(src), str(dest), str(lab.root), str(EXECUTE_TIMEOUT_S)],
            env=env,
            cwd=lab.root,
            capture_output=True,
            text=True,
            timeout=EXECUTE_TIMEOUT_S + 60,
        )
        assert run.returncode == 0, f"executing {src.name} failed:\n{run.stderr[-3000:]}"
        return nbformat.read(dest, as_version=4)
    return nbformat.read(src, as_version=4)


def test_executed_signed_notebook_renders_panels_from_stored_widget_state(lab, browser, request):
    from playwright.sync_api import expect

    name = "stored_state.ipynb"
    nb = executed(lab, STORED_STATE_NOTEBOOK, lab.root / name)
    views = widget_views(nb)
    assert has_widget_state(nb) and views >= 1, "the executed notebook stored no widget state"
    # Signed with the server's own secret and signature database (the session's data dir).
    notary = NotebookNotary(data_dir=str(lab.data_dir))
    notary.sign(nb)
    nbformat.write(nb, lab.root / name)
    assert notary.check_signature(nbformat.read(lab.root / name, as_version=4))

    with opened(lab, browser, lab.root / name, label=request.node.name) as page:
        notebook = page.page.locator(".jp-NotebookPanel")
        outputs = notebook.locator(".jp-OutputArea-output:has(> .jupyter-widgets)")  # widget views
        expect(outputs).to_have_count(views)
        # rendered from the notebook's state: no kernel holds these models, and the views say so
        expect(outputs.filter(has=page.page.locator(".jupyter-widgets-disconnected"))).to_have_count(views)
        images = outputs.locator("img.widget-image")
        expect(images.first).to_be_visible()
        for i in range(images.count()):
            images.nth(i).scroll_into_view_if_needed()
            page.page.wait_for_function(
                "img => img.complete && img.naturalWidth > 100", arg=images.nth(i).element_handle()
            )
        expect(outputs.locator("button.widget-button").first).to_be_visible()
        expect(notebook).not_to_contain_text("Loading widget")
        expect(notebook).not_to_contain_text("Error displaying widget")
        expect(
            notebook.locator('.jp-OutputArea-output[data-mime-type="text/plain"]').filter(has_text="Box(children=")
        ).to_have_count(0)  # the text fallback
        if STORED_STATE_NOTEBOOK.parent == NOTEBOOKS:  # our own notebook: both panels, all parts
            buttons = outputs.locator("button.widget-button")  # (a disconnected icon joins their a11y name)
            expect(buttons).to_have_text(["Step", "Run N", "Pause", "Back", "Reset", "Train", "Stop"])
            expect(outputs.locator(".widget-html-content").filter(has_text="step 5 · log-density")).to_have_count(1)
            expect(outputs.locator("textarea")).to_have_value(re.compile(r"^The .{20,}", re.S))
        save_screenshot(outputs.first, "stored_state_first_panel.png")
        page.page.screenshot(path=str(ARTIFACTS / "stored_state_notebook.png"), full_page=True)

    # The control: an unsigned copy (changed, so its digest is not in the signature database)
    # shows the text fallback, so the checks above would catch an untrusted notebook.
    nb.metadata.pop("signature", None)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("An unsigned copy."))
    unsigned = "stored_state_unsigned.ipynb"
    nbformat.write(nb, lab.root / unsigned)
    assert not notary.check_signature(nbformat.read(lab.root / unsigned, as_version=4))
    with opened(lab, browser, lab.root / unsigned, label=request.node.name + "-unsigned") as page:
        outputs = page.page.locator(".jp-NotebookPanel .jp-OutputArea-output")
        expect(outputs.filter(has_text="Box(children=").first).to_be_visible()
        expect(page.page.locator(".jp-NotebookPanel img.widget-image")).to_have_count(0)

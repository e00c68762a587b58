"""The built documentation site in headless Chromium (issue 41): the front page, the ``EMPanel``
reference page and a tutorial render their title, a code block and, where the page has one, a
picture. The site is tests/docs_site.py's build (shared with tests/test_docs_site.py), opened
from its folder with no server; a screenshot of each page is saved as ``site_*.png`` by
``labdriver.docs_picture`` (into docs/_static/ only under ``make screenshots``).
"""

from __future__ import annotations

import pytest
from docs_site import built_site, stub_page
from labdriver import docs_picture
from playwright.sync_api import expect

VIEWPORT = {"width": 1400, "height": 1000}
# (page in the build, its title, whether it shows a picture, the screenshot's name)
PAGES = [
    ("index.html", "mixle_nb documentation", True, "site_front.png"),
    (f"{stub_page('mixle_nb.widgets', 'EMPanel')}.html", "EMPanel", False, "site_empanel.png"),
    ("tutorials/01_em_by_hand.html", "01 · EM by hand", True, "site_tutorial.png"),
]


@pytest.mark.browser
@pytest.mark.parametrize(("path", "title", "has_picture", "screenshot"), PAGES, ids=[p[3][5:-4] for p in PAGES])
def test_built_site_page_renders(browser, path, title, has_picture, screenshot):
    site = built_site()  # its warnings fail tests/test_docs_site.py; the pages are written all the same
    assert (site.html / path).exists(), f"the build wrote no {path}:\n{site.warnings[-4000:]}"
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto((site.html / path).as_uri())
        expect(page.locator("article h1").first).to_contain_text(title)
        assert title in page.title()
        code = page.locator("article div.highlight pre").first
        expect(code).to_be_visible()
        assert code.inner_text().strip(), "an empty code block"
        if has_picture:
            picture = page.locator("article img").first
            expect(picture).to_be_visible()
            assert picture.evaluate("img => img.complete && img.naturalWidth > 0"), "the picture did not load"
        page.screenshot(path=str(docs_picture(screenshot)))
        assert not errors, f"JavaScript errors on {path}: {errors}"
    finally:
        context.close()

"""Fixtures for the browser tests (``@pytest.mark.browser``): one JupyterLab server and one
headless Chromium per session; see ``labdriver`` for how they are set up and torn down.

Without Chromium (or jupyterlab/playwright) the tests skip, unless ``CI=true``: then they fail.
On failure, a full-page screenshot and the browser console log of every open page are saved
in ``tests/browser/artifacts/`` next to the server log.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # labdriver, under any --import-mode
from labdriver import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    EXPECT_TIMEOUT_MS,
    LabServer,
    chromium_executable,
    descendants,
    missing,
    open_pages,
    reap,
)


@pytest.fixture(scope="session")
def browser_requirements() -> str:
    """The Chromium executable, after checking the Python packages the tests drive it with."""
    for module, extra in (("jupyterlab", "browser"), ("playwright", "browser")):
        try:
            __import__(module)
        except ImportError:
            missing(f"{module} is not installed (pip install -e '.[{extra}]')")
    path = chromium_executable()
    if path is None:
        where = os.environ.get("MIXLE_CHROMIUM") or "chromium on PATH or /usr/bin/chromium"
        missing(f"Chromium not found ({where}): apt-get install chromium, or set MIXLE_CHROMIUM")
    return path


@pytest.fixture(scope="session")
def lab(browser_requirements, tmp_path_factory):
    """The session's JupyterLab server; stopped, with every process it started, at the end."""
    ARTIFACTS.mkdir(exist_ok=True)
    for old in ARTIFACTS.iterdir():  # artifacts describe the latest run only
        if old.is_file():
            old.unlink()
    server = LabServer(tmp_path_factory.mktemp("jupyterlab"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
    assert not server.leaked, f"processes outlived JupyterLab's shutdown and were killed: {server.leaked}"


# --------------------------------------------------------------------------- the browser


@pytest.fixture(scope="session")
def browser(browser_requirements):
    """One headless Chromium for the session."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    before = {p.pid for p in descendants(os.getpid())}
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=browser_requirements, args=CHROMIUM_ARGS, headless=True)
    except BaseException:
        playwright.stop()
        raise
    started = [p for p in descendants(os.getpid()) if p.pid not in before]
    try:
        yield chromium
    finally:
        tracked = started + [d for p in started for d in descendants(p.pid)]
        try:
            chromium.close()
        finally:
            playwright.stop()
        leaked = reap(tracked)
    assert not leaked, f"browser processes outlived close() and were killed: {leaked}"


# --------------------------------------------------------------------------- failure evidence


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and report.when in ("setup", "call") and open_pages:
        for page in list(open_pages):
            page.save_failure_artifacts(item.name)
    return report

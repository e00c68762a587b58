"""JupyterLab in headless Chromium, for the browser tests (``@pytest.mark.browser``).

One JupyterLab server per test session, on 127.0.0.1 with a random port and token and its own
temporary config, data, runtime, workspaces and IPython directories; one headless Chromium.
Every notebook is a copy in the server's temporary root, opened in its own browser context at
``/lab/workspaces/<unique>/tree/<name>?reset`` so no test finds another's tabs.

Teardown is checked: kernels are shut down through the REST API (after the notebook's cluster
is stopped from inside its kernel), then the server, then the browser; every process they
started must be gone, and any that is not is killed and reported as an error.

Lab's news and update checks are off (no network), and notebook windowing is off so every
cell's output is in the DOM. The server's log goes to ``tests/browser/artifacts/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil
from strictness import unavailable

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE / "notebooks"
ARTIFACTS = HERE / "artifacts"
# The docs' pictures some tests take: committed in docs/_static/, written there only on request
# (``make screenshots``), else beside the artifacts, so that a test run leaves the tree as it was.
DOCS_PICTURES = HERE.parents[1] / "docs" / "_static"
UPDATE_SCREENSHOTS = "MIXLE_UPDATE_SCREENSHOTS"

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1500, "height": 1000}
SERVER_START_TIMEOUT_S = 90
PROCESS_EXIT_TIMEOUT_S = 20
EXPECT_TIMEOUT_MS = 30_000

# Lab user settings for the session: no network (news, update checks), no toasts asking about
# them, and every cell attached to the DOM (no windowing) so a test can find any output.
LAB_USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

open_pages: list[LabPage] = []  # pages whose screenshot and console log a failure saves


# --------------------------------------------------------------------------- requirements


def missing(reason: str):
    """Skip locally; fail in CI and under `make test`, which installs Chromium."""
    unavailable(reason)


def chromium_executable() -> str | None:
    """``$MIXLE_CHROMIUM`` when set (``make test`` sets it), else Debian's ``chromium``."""
    if os.environ.get("MIXLE_CHROMIUM"):
        candidates = [os.environ["MIXLE_CHROMIUM"]]
    else:
        candidates = [shutil.which("chromium"), "/usr/bin/chromium"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


# --------------------------------------------------------------------------- processes


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def reap(processes, timeout: float = PROCESS_EXIT_TIMEOUT_S) -> list[str]:
    """Wait for ``processes`` to exit; kill the ones that do not. Returns what had to be killed."""
    _, alive = psutil.wait_procs(list(processes), timeout=timeout)
    leaked = []
    for proc in alive:
        try:
            leaked.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)
    return leaked


# --------------------------------------------------------------------------- the server


class LabServer:
    """A JupyterLab server with private directories under ``base``."""

    def __init__(self, base: Path):
        self.base = base
        self.dirs = {name: base / name for name in ("config", "data", "runtime", "workspaces", "root", "ipython")}
        for path in self.dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        self.root, self.data_dir = self.dirs["root"], self.dirs["data"]
        self.token = secrets.token_hex(24)
        self.log_path = ARTIFACTS / "jupyterlab-server.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.leaked: list[str] = []
        settings = self.dirs["config"] / "lab" / "user-settings"
        for name, value in LAB_USER_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(value))

    @property
    def env(self) -> dict:
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=str(self.dirs["config"]),
            JUPYTER_DATA_DIR=str(self.dirs["data"]),
            JUPYTER_RUNTIME_DIR=str(self.dirs["runtime"]),
            JUPYTERLAB_WORKSPACES_DIR=str(self.dirs["workspaces"]),
            JUPYTERLAB_SETTINGS_DIR=str(self.dirs["config"] / "lab" / "user-settings"),
            IPYTHONDIR=str(self.dirs["ipython"]),  # ipyparallel profiles of the notebooks' clusters
            JUPYTER_TOKEN=self.token,  # in the environment, not on a command line `ps` shows
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("JUPYTER_PORT", None)
        return env

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.terminals_enabled=False",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.workspaces_dir={self.dirs['workspaces']}",
            "--KernelManager.shutdown_wait_time=20",  # room for a kernel's atexit cluster stop
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        ARTIFACTS.mkdir(exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            env=self.env,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        info_file = self.dirs["runtime"] / f"jpserver-{self.proc.pid}.json"
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            if info_file.exists():
                try:
                    info = json.loads(info_file.read_text())
                    self.url = f"http://127.0.0.1:{info['port']}"
                    if self.api("GET", "/api/status") is not None:
                        return
                except (ValueError, KeyError, OSError):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"JupyterLab did not answer within {SERVER_START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def api(self, method: str, path: str, timeout: float = 60):
        request = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else {}

    def lab_url(self, path: str) -> str:
        workspace = f"t-{uuid.uuid4().hex[:10]}"
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?reset&token={self.token}"

    def shutdown_kernels(self) -> None:
        """Shut every kernel down (graceful: a kernel's atexit stops its cluster); then wait
        for every process the kernels had started, killing and recording stragglers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tracked = descendants(self.proc.pid)
        for kernel in self.api("GET", "/api/kernels"):
            try:
                self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=90)
            except (urllib.error.URLError, OSError):
                pass
        self.leaked += reap([p for p in tracked if p.pid != self.proc.pid])

    def stop(self) -> None:
        if self.proc is None:
            return
        tracked = descendants(self.proc.pid)
        if self.proc.poll() is None:
            try:
                self.shutdown_kernels()
                self.api("POST", "/api/shutdown", timeout=30)
            except (urllib.error.URLError, OSError, ValueError):
                self.proc.terminate()
            try:
                self.proc.wait(PROCESS_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.leaked.append(f"{self.proc.pid} jupyterlab server")
                self.proc.kill()
                self.proc.wait(10)
        self.leaked += reap(tracked)


# --------------------------------------------------------------------------- a notebook page

_JS_NOTEBOOK = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.sessionContext) return w;
  }
  return null;
}
"""

_JS_KERNEL_READY = f"""
(path) => {{
  const find = {_JS_NOTEBOOK};
  const nb = find(path);
  if (!nb || !nb.context.isReady || !nb.content.widgets.length) return false;
  const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}}
"""

# {done, errors}: done when every code cell has an execution count and the kernel is idle;
# errors lists the error outputs so far (run-all stops at the first one).
_JS_RUN_STATE = f"""
(path) => {{
  const find = {_JS_NOTEBOOK};
  const nb = find(path);
  const errors = [];
  let pending = 0;
  for (const cell of nb.content.widgets) {{
    if (cell.model.type !== 'code') continue;
    if (cell.model.executionCount === null) pending++;
    for (const out of cell.model.outputs.toJSON()) {{
      if (out.output_type === 'error') errors.push(out.ename + ': ' + out.evalue);
    }}
  }}
  const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
  return {{done: pending === 0 && !!kernel && kernel.status === 'idle', pending, errors}};
}}
"""

_JS_USER_EXPRESSION = f"""
async ([path, expr]) => {{
  const find = {_JS_NOTEBOOK};
  const kernel = find(path).sessionContext.session.kernel;
  const future = kernel.requestExecute({{code: '', silent: true, store_history: false,
                                         user_expressions: {{value: expr}}}});
  const reply = await future.done;
  const value = reply.content.user_expressions.value;
  if (value.status !== 'ok') throw new Error(value.ename + ': ' + value.evalue);
  return value.data['text/plain'];
}}
"""

_JS_EXECUTE = f"""
async ([path, code]) => {{
  const find = {_JS_NOTEBOOK};
  const nb = find(path);
  const kernel = nb && nb.sessionContext.session && nb.sessionContext.session.kernel;
  if (!kernel) return false;
  const reply = await kernel.requestExecute({{code, silent: true, store_history: false}}).done;
  return reply.content.status;
}}
"""

STOP_CLUSTER_CODE = (
    "from mixle_nb import cluster as _mixle_cluster_module\n"
    "if _mixle_cluster_module.current() is not None:\n"
    "    _mixle_cluster_module.current().stop()\n"
)


class LabPage:
    """One notebook open in JupyterLab in its own browser context."""

    def __init__(self, server: LabServer, browser, name: str):
        self.server, self.path = server, name
        self.console: list[str] = []
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.console.append(f"[{m.type}] {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"[pageerror] {e}"))
        open_pages.append(self)
        try:
            self.page.goto(server.lab_url(name))
            self.page.wait_for_function(_JS_KERNEL_READY, arg=name, timeout=120_000, polling=200)
            self.page.evaluate("() => window.jupyterapp.restored")
            self.page.evaluate("() => { const s = window.jupyterapp.shell; if (s.collapseLeft) s.collapseLeft(); }")
        except BaseException:
            self.save_failure_artifacts("open")
            self.close()
            raise

    # -- running --------------------------------------------------------------------------

    def run_all(self, timeout_s: float = 240) -> None:
        """Run all cells (Lab's own command, as the Run menu does) and wait for the last one."""
        self.page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.page.evaluate(_JS_RUN_STATE, self.path)
            if state["errors"]:
                raise AssertionError(f"{self.path}: a cell raised {state['errors']}")
            if state["done"]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path}: {state['pending']} cells still pending after {timeout_s} s")
            self.page.wait_for_timeout(250)

    def kernel_value(self, expression: str):
        """``expression`` evaluated in the notebook's kernel, from its repr."""
        import ast

        text = self.page.evaluate(_JS_USER_EXPRESSION, [self.path, expression])
        return ast.literal_eval(text)

    def wait_kernel_value(self, expression: str, predicate, timeout_s: float = 60, what: str = ""):
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.kernel_value(expression)
            if predicate(value):
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what or expression}: still {value!r} after {timeout_s} s")
            self.page.wait_for_timeout(100)

    def output_area(self, cell_source_start: str):
        """The output area of the code cell whose source starts with ``cell_source_start``."""
        index = self.page.evaluate(
            f"""([path, start]) => {{
                const nb = ({_JS_NOTEBOOK})(path);
                return nb.content.widgets.findIndex(c => c.model.sharedModel.getSource().startsWith(start));
            }}""",
            [self.path, cell_source_start],
        )
        assert index >= 0, f"no cell starting with {cell_source_start!r} in {self.path}"
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")

    # -- evidence -------------------------------------------------------------------------

    def save_failure_artifacts(self, test_name: str) -> None:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{test_name}-{Path(self.path).stem}")
        try:
            self.page.screenshot(path=str(ARTIFACTS / f"{stem}-failure.png"), full_page=True)
        except Exception as exc:  # the page may be the thing that broke
            self.console.append(f"[artifacts] screenshot failed: {exc}")
        (ARTIFACTS / f"{stem}-console.log").write_text("\n".join(self.console) + "\n")

    def close(self) -> None:
        """Stop the notebook's cluster from inside its kernel, close the page, shut kernels down."""
        try:
            self.page.evaluate(_JS_EXECUTE, [self.path, STOP_CLUSTER_CODE])
        except Exception:
            pass  # shutting the kernel down stops the cluster too (atexit), just less gently
        finally:
            if self in open_pages:
                open_pages.remove(self)
            self.context.close()
            self.server.shutdown_kernels()


def open_lab_page(lab: LabServer, browser, src, name: str | None = None) -> LabPage:
    """Copy ``src`` (a path, or a name in tests/browser/notebooks) into the server's root as
    ``name`` and open it in JupyterLab, its kernel started and idle."""
    src = Path(src) if os.path.isabs(str(src)) else NOTEBOOKS / src
    name = name or src.name
    if src.resolve() != (lab.root / name).resolve():
        shutil.copyfile(src, lab.root / name)
    return LabPage(lab, browser, name)


@contextlib.contextmanager
def opened(lab: LabServer, browser, src, name: str | None = None, label: str = "setup"):
    """``open_lab_page`` as a context manager: on an exception inside, the page's screenshot
    and console log are saved (labelled ``label``); the page is always closed."""
    page = open_lab_page(lab, browser, src, name)
    try:
        yield page
    except BaseException:
        page.save_failure_artifacts(label)
        raise
    finally:
        page.close()


def docs_picture(name: str) -> Path:
    """Where a test saves the docs' picture ``name``: ``docs/_static/`` under
    ``MIXLE_UPDATE_SCREENSHOTS=1`` (``make screenshots``), else ``artifacts/pictures/`` (ignored;
    a folder, so the lab fixture's clearing of the artifacts at its start spares it)."""
    folder = DOCS_PICTURES if os.environ.get(UPDATE_SCREENSHOTS) == "1" else ARTIFACTS / "pictures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def save_screenshot(locator, name: str) -> Path:
    """An element screenshot in the artifacts folder (kept after the run)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    locator.screenshot(path=str(path))
    return path


# An image's bytes as the browser holds them (the widget's PNG, via its blob: URL).
_JS_IMAGE_DIGEST = """
async (img) => {
  if (!img.src || !img.complete || img.naturalWidth === 0) return null;
  const bytes = await (await fetch(img.src)).arrayBuffer();
  const digest = await crypto.subtle.digest('SHA-256', bytes);
  return Array.from(new Uint8Array(digest), b => b.toString(16).padStart(2, '0')).join('');
}
"""


def image_digest(image) -> str:
    """SHA-256 of the PNG an image element shows, as the browser received it."""
    digest = image.evaluate(_JS_IMAGE_DIGEST)
    assert digest, "the plot image has not loaded"
    return digest


def wait_for_new_digest(image, previous: str, timeout_s: float = 30) -> str:
    """Wait until the browser shows another PNG than the one of digest ``previous``; its digest."""
    deadline = time.monotonic() + timeout_s
    while True:
        digest = image.evaluate(_JS_IMAGE_DIGEST)
        if digest and digest != previous:
            return digest
        assert time.monotonic() < deadline, f"the plot image did not change within {timeout_s} s"
        image.page.wait_for_timeout(100)


def type_number(page: LabPage, widget, label: str, value: int, kernel_name: str) -> None:
    """Type ``value`` into the number box labelled ``label`` in ``widget`` (a locator) and wait
    until the kernel's ``kernel_name`` holds it."""
    box = (
        widget.locator(".widget-inline-hbox")
        .filter(has=widget.page.locator("label", has_text=re.compile(rf"^{re.escape(label)}$")))
        .locator("input[type=number]")
    )
    box.fill(str(value))
    box.press("Enter")
    page.wait_kernel_value(kernel_name, lambda v: v == value, what=f"{label} typed in the browser")

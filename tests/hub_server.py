"""A real JupyterHub on this host for the shared-host test: ``LocalProcessSpawner`` (each user's
single-user server runs as that user), ``configurable-http-proxy`` from the npm registry
(``make hub`` installs it under ``.hub/``), bound to loopback on random free ports.

No one can log in with a password: the Hub's authenticator is JupyterHub's ``null`` one. The
test drives it as a service with a per-run token (allowed to manage users, servers and tokens),
and each user's notebook with a token the Hub issues to that user, as a notebook front end
would, over the proxy: the Hub's REST API, the single-user server's REST API, and its kernel
websocket (:mod:`hub_kernel`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROXY = os.path.join(REPO, ".hub", "node_modules", ".bin", "configurable-http-proxy")
SERVICE = "mixle-test"
START_S = 60.0  # the Hub, or a single-user server, ready within this
# the server extensions of the front ends (the test uses the kernel API only), not loaded
UNUSED_EXTENSIONS = ("jupyterlab", "notebook", "jupyter_lsp", "jupyterlab_jupytext", "ipyparallel", "notebook_shim")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(token: str, pythonpath: str) -> dict[str, dict[str, Any]]:
    """The Hub's configuration (traitlets' JSON form)."""
    bin_dir = os.path.dirname(sys.executable)
    settings: dict[str, Any] = {
        "JupyterHub.ip": "127.0.0.1",
        "JupyterHub.port": free_port(),
        "JupyterHub.hub_ip": "127.0.0.1",
        "JupyterHub.hub_port": free_port(),
        "JupyterHub.authenticator_class": "null",
        "JupyterHub.spawner_class": "localprocess",
        "JupyterHub.services": [{"name": SERVICE, "api_token": token}],
        "JupyterHub.load_roles": [
            {"name": SERVICE, "scopes": ["admin:users", "admin:servers", "tokens"], "services": [SERVICE]}
        ],
        "ConfigurableHTTPProxy.command": [PROXY],
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{free_port()}",
        "Spawner.cmd": [os.path.join(bin_dir, "jupyterhub-singleuser")],
        "Spawner.args": [f"--ServerApp.jpserver_extensions={dict.fromkeys(UNUSED_EXTENSIONS, False)!r}"],
        "Spawner.environment": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"},
        "Spawner.disable_user_config": True,
        "Spawner.start_timeout": int(START_S),
        "Spawner.http_timeout": int(START_S),
    }
    config: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        section, name = key.split(".")
        config.setdefault(section, {})[name] = value
    return config


class Hub:
    """``with Hub() as hub``: a running JupyterHub and its proxy. On exit the Hub gets SIGTERM
    by its pid (it stops its servers and its proxy), then whatever of it is left is killed by
    pid, and its folder (configuration, database, log) is removed."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(32)
        self.folder = ""
        self.process: subprocess.Popen[bytes] | None = None
        self.started: list[psutil.Process] = []  # the Hub and the proxy it started
        self.url = ""

    def __enter__(self) -> Hub:
        self.folder = tempfile.mkdtemp(prefix="mixle-hub-")
        tests = os.path.join(REPO, "tests")
        config = _config(self.token, os.pathsep.join([REPO, tests]))
        with open(os.path.join(self.folder, "jupyterhub_config.json"), "w") as f:
            json.dump(config, f)
        self.url = f"http://127.0.0.1:{config['JupyterHub']['port']}"
        try:
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "jupyterhub", "-f", "jupyterhub_config.json"],
                    cwd=self.folder,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={key: value for key, value in os.environ.items() if not key.startswith("JUPYTERHUB_")},
                )
            self.started = [psutil.Process(self.process.pid)]
            self._wait_ready()
            self.started += self.started[0].children(recursive=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def log_path(self) -> str:
        """Where the Hub's (and its proxy's) output goes."""
        return os.path.join(self.folder, "jupyterhub.log")

    def log(self) -> str:
        """The Hub's log so far (its last 4,000 characters)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        """Until the Hub's API answers through the proxy (its route added)."""
        deadline = time.monotonic() + START_S
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterHub exited with {self.process.returncode}:\n{self.log()}")
            try:
                if self.request("GET", "/hub/api/", self.token)[0] == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass  # the proxy is not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"JupyterHub did not answer within {START_S} s:\n{self.log()}")
            time.sleep(0.2)

    def request(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        """``(status, decoded JSON or None)`` of a request through the proxy with ``token``."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"token {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = response.read()
                return response.status, json.loads(payload) if payload else None
        except urllib.error.HTTPError as error:
            return error.code, None

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """A request as the test's service; raises on an error status."""
        status, payload = self.request(method, path, self.token, body)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {status}\n{self.log()}")
        return payload

    def start_servers(self, users: list[str]) -> dict[str, str]:
        """Create ``users`` in the Hub, start their single-user servers (all at once) and
        return, for each, a token the Hub issued to them (the scopes of an ordinary user)."""
        for user in users:
            self.api("POST", f"/hub/api/users/{user}")
            self.api("POST", f"/hub/api/users/{user}/server")
        self._wait_servers(users, ready=True)
        body = {"note": "mixle hub test", "expires_in": 600}
        return {user: str(self.api("POST", f"/hub/api/users/{user}/tokens", body)["token"]) for user in users}

    def stop_servers(self, users: list[str]) -> None:
        """Stop ``users``' servers through the Hub (its spawner ends each by pid) and wait."""
        for user in users:
            self.api("DELETE", f"/hub/api/users/{user}/server")
        self._wait_servers(users, ready=False)

    def _wait_servers(self, users: list[str], ready: bool) -> None:
        """Until every one of ``users``' servers is ready (or, ``ready=False``, gone)."""
        deadline = time.monotonic() + START_S
        waiting = list(users)
        while waiting:
            servers = {user: self.api("GET", f"/hub/api/users/{user}")["servers"] for user in waiting}
            if ready:
                waiting = [user for user in waiting if not servers[user].get("", {}).get("ready")]
            else:
                waiting = [user for user in waiting if servers[user]]
            if waiting and time.monotonic() > deadline:
                state = "ready" if ready else "stopped"
                raise RuntimeError(f"servers of {waiting} not {state} within {START_S} s:\n{self.log()}")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the Hub stops its servers and its proxy
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for proc in self.started:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(self.started, timeout=5)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

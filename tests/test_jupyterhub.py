"""A shared host as it is used (issue 40): a real multi-user JupyterHub on this machine.

Two local users, made for the test (``tests/hub_users.py``), each get a single-user server from
the Hub's ``LocalProcessSpawner`` behind its ``configurable-http-proxy``, all on loopback
(``tests/hub_server.py``). The test drives their kernels as a front end does, over the Hub's
proxy with tokens the Hub issued to each user (``tests/hub_kernel.py``). User A's notebook
starts a 2-engine cluster with the magics, pushes data and steps an ``EMPanel``; user B's
kernel, meanwhile, probes every TCP port A's processes listen on (``shared_host_probe``:
bounded bursts, 50 rounds, loopback only; the ports are found by the harness, as root, since B
cannot see A's sockets), tries A's Unix sockets and reads A's connection files and sockets
folders. A keeps stepping, each step within the call bound and equal to one process's EM step
within 1e-10; B reaches none of A's files, folders or sockets, nor A's server through the Hub.
Every process started is stopped by pid and both users are removed.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from shared_host_probe import listening_ports, unix_listeners
from strictness import import_or_unavailable, unavailable
from test_shared_host import require_root

from mixle_nb.stats import GaussianDistribution, MixtureDistribution, em_step, seq_encode

pytestmark = pytest.mark.hub

ROUNDS = 50
CALL_BOUND_S = 30.0  # the cluster's 20 s collective timeout, and time to answer
STEPS_AT_LEAST = 3
LOOPBACK = {"127.0.0.1", "::1"}

A_STARTS = """
%load_ext mixle_nb
%mixle_cluster start 2 --timeout 20
import json
from test_jupyterhub import problem
from test_shared_host import cluster_files
x, start = problem()
est = start.estimator()
%mixle_push x est start
"""

A_BUILDS = """
%%mixle
from mixle_nb.parallel import TorchRunEncodedData
h = TorchRunEncodedData(x, estimator=est)
"""

A_PANEL = """
from mixle_nb.widgets import EMPanel
panel = EMPanel(handle="h", estimator="est", model="start")
print(json.dumps({"pids": sorted(mixle.pids), "files": cluster_files(mixle)}))
"""

A_STEPS = """
panel.step()
print(json.dumps(panel.history[-1].log_density))
print(json.dumps([list(panel.model.w), [c.mu for c in panel.model.components], [c.sigma2 for c in panel.model.components]]))
"""

B_PROBES = """
import contextlib, io, json, os
from shared_host_probe import main
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    main({arguments!r})
report = json.loads(printed.getvalue())
report["folders_listed"] = []
for folder in {folders!r}:
    try:
        os.listdir(folder)
        report["folders_listed"].append(folder)
    except OSError:
        pass
print(json.dumps(report))
"""


def problem() -> tuple[np.ndarray, MixtureDistribution]:
    """User A's data (two Gaussians, 4,000 points) and start model (three components)."""
    rng = np.random.default_rng(40)
    x = np.concatenate([rng.normal(-2, 1, 2000), rng.normal(3, 0.7, 2000)])
    start = MixtureDistribution(
        [GaussianDistribution(-1, 1), GaussianDistribution(0.5, 1), GaussianDistribution(2, 1)], [0.3, 0.3, 0.4]
    )
    return x, start


def one_process_steps() -> Iterator[tuple[float, list]]:
    """EM steps in this process from A's start: (the step's log-density, the next model's
    weights, means and variances), without end."""
    x, model = problem()
    enc = seq_encode(x, model=model)
    while True:
        step = em_step(enc, model.estimator(), model)
        model = step.model
        yield step.log_density, [list(model.w), [c.mu for c in model.components], [c.sigma2 for c in model.components]]


def requirements() -> None:
    """Root, JupyterHub, its proxy and setfacl, or fail (strict) / skip saying how to get them."""
    require_root()
    import_or_unavailable("jupyterhub")
    from hub_server import PROXY

    if not os.access(PROXY, os.X_OK):
        unavailable(f"needs configurable-http-proxy at {PROXY}: run `make hub`")
    if not any(os.access(os.path.join(d, "setfacl"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
        unavailable("needs setfacl (Debian's acl package): run `make hub`")


def role(pid: int, cluster_pids: set[int]) -> str:
    """What a process of user A is: an engine of the cluster, the kernel, the server."""
    import psutil

    if pid in cluster_pids:
        return "engine"
    command = " ".join(psutil.Process(pid).cmdline())
    return "kernel" if "ipykernel" in command else "server" if "jupyterhub-singleuser" in command else command


def a_steps_while_b_probes(kernel_a, kernel_b, probe_code: str) -> tuple[dict, int]:
    """Step A's panel (each step within the call bound and equal to one process's) while B's
    kernel runs ``probe_code``, at least :data:`STEPS_AT_LEAST` times, then once more after
    the probe. B's report, and the steps A took while B probed."""
    reference = one_process_steps()
    probed: dict = {}

    def probe() -> None:
        """B's cell, in a thread: its report, or what it raised."""
        try:
            probed["report"] = json.loads(kernel_b.execute(probe_code, timeout=120).strip().splitlines()[-1])
        except BaseException as exc:
            probed["error"] = exc

    def step() -> None:
        """One step of A's panel, checked against the next one-process step."""
        t0 = time.monotonic()
        log_density, model = map(json.loads, kernel_a.execute(A_STEPS, timeout=CALL_BOUND_S).split("\n")[:2])
        assert time.monotonic() - t0 < CALL_BOUND_S
        expected_log_density, expected_model = next(reference)
        np.testing.assert_allclose(log_density, expected_log_density, rtol=1e-10)
        for got, want in zip(model, expected_model):
            np.testing.assert_allclose(got, want, rtol=1e-10)

    prober = threading.Thread(target=probe)
    prober.start()
    steps = 0
    try:
        while prober.is_alive() or steps < STEPS_AT_LEAST:
            step()
            steps += 1
    finally:
        prober.join(130)
    step()  # the next call, after the probe
    assert "error" not in probed, probed.get("error")
    return probed["report"], steps


def test_user_b_cannot_wedge_enter_or_read_user_as_cluster_on_a_jupyterhub():
    requirements()
    from hub_kernel import HubKernel
    from hub_server import Hub
    from hub_users import LocalUsers, processes_of

    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    with LocalUsers(2) as (a, b), Hub() as hub:
        seconds["users and hub"] = time.monotonic() - t0
        hub_ports = listening_ports({proc.pid for proc in hub.started})
        assert hub_ports and {address for address, _, _ in hub_ports} <= LOOPBACK
        tokens = hub.start_servers([a.name, b.name])
        status, _ = hub.request("GET", f"/user/{a.name}/api/kernels", tokens[b.name])
        assert status == 403  # B's token does not open A's server
        seconds["servers"] = time.monotonic() - t0

        with HubKernel(hub, a.name, tokens[a.name]) as kernel_a, HubKernel(hub, b.name, tokens[b.name]) as kernel_b:
            kernel_a.execute(A_STARTS, timeout=120)
            kernel_a.execute(A_BUILDS, timeout=60)
            cluster = json.loads(kernel_a.execute(A_PANEL, timeout=60).strip().splitlines()[-1])
            seconds["kernels, cluster, panel"] = time.monotonic() - t0
            cluster_pids = set(cluster["pids"])
            a_pids = {proc.pid for proc in processes_of({a.uid})}
            assert cluster_pids <= a_pids
            ports = listening_ports(a_pids)
            cluster_ports = listening_ports(cluster_pids)
            unix = unix_listeners(cluster_pids)
            # A listens on loopback only: its server, its kernel, and of its cluster gloo alone
            assert {address for address, _, _ in ports} <= LOOPBACK
            assert 0 < len(cluster_ports) <= 2 and unix
            folders = sorted({os.path.dirname(path) for path in unix + cluster["files"]})
            runtime = glob.glob(os.path.join(a.home, ".local", "share", "jupyter", "runtime", "*"))
            files = [path for path in cluster["files"] + runtime if os.path.isfile(path)]
            assert any(os.path.basename(path).startswith("kernel-") for path in files)

            arguments = [*(str(port) for _, port, _ in ports), "--rounds", str(ROUNDS), "--unix", *unix]
            probe_code = B_PROBES.format(arguments=[*arguments, "--files", *files], folders=folders)
            report, steps = a_steps_while_b_probes(kernel_a, kernel_b, probe_code)
            seconds["probe"] = time.monotonic() - t0
            listening = [(address, port, role(pid, cluster_pids)) for address, port, pid in ports]
            print(
                f"A listens on {listening} and {len(unix)} Unix sockets; B's probe: {report}; A's steps meanwhile: {steps}"
            )
            assert report["uid"] == b.uid and report["rounds"] == ROUNDS and report["ports"] == len(ports)
            assert report["connected"] > 0  # B reached the ports, and A went on stepping
            assert report["unix_connected"] == [] and report["files_read"] == [] and report["folders_listed"] == []
            assert listening_ports(cluster_pids) == cluster_ports  # nothing died, nothing new listens

            assert kernel_a.execute("%mixle_cluster stop", timeout=60).strip() == "mixle cluster stopped"
            assert [proc.pid for proc in processes_of({a.uid}) if proc.pid in cluster_pids] == []
            assert not any(os.path.exists(os.path.dirname(path)) for path in unix)  # its sockets folder removed
        hub.stop_servers([a.name, b.name])
        deadline = time.monotonic() + 10.0
        while processes_of({a.uid, b.uid}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_of({a.uid, b.uid}) == []  # the Hub stopped every server and kernel
        seconds["stopped"] = time.monotonic() - t0
    print("seconds since the start: " + ", ".join(f"{name} {value:.1f}" for name, value in seconds.items()))

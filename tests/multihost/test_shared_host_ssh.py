"""A shared host, across hosts (issue 40): uid ``nobody`` on the notebook's host probes every
port of a 2-host ssh cluster it can reach (the controller's, on the bridge and on loopback, and
the engines' on the simulated hosts' addresses: gloo's and the rendezvous store's) for 50 bounded rounds while the cluster fits.
Every ipyparallel socket is CurveZMQ, so the probe is refused at the handshake: every fit comes
back within the call bound, equal to one process's, and nothing reaches the client."""

import numpy as np
import pytest
from shared_host_probe import listening_ports, probe_while
from test_shared_host import CALL_BOUND_S, FITS_AT_LEAST, ROUNDS, fit_here, fit_on_ranks, require_root

pytestmark = pytest.mark.multihost


def rank_listening():
    """(address, port) of every TCP socket this engine listens on."""
    import psutil

    return sorted(
        {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}
    )


def reachable(address, port, host_address):
    """Where the probe on the notebook's host reaches a socket listening on ``address``; None
    for a simulated host's loopback."""
    if address in ("0.0.0.0", "::"):
        return f"{host_address}:{port}"
    if address in ("127.0.0.1", "::1"):
        return f"127.0.0.1:{port}" if host_address is None else None
    return f"{address.removeprefix('::ffff:')}:{port}"


def test_an_ssh_cluster_refuses_a_probe_without_its_key(ssh_cluster, network):
    require_root()
    if ssh_cluster.state != "running":  # the multi-host tests before this one end by stopping it
        ssh_cluster.start()
    controller = listening_ports(ssh_cluster.pids)
    engines = ssh_cluster.run(rank_listening)
    targets = [reachable(ip, port, None) for ip, port, _ in controller]
    targets += [reachable(ip, port, host.address) for host, ports in zip(network.hosts, engines) for ip, port in ports]
    targets = sorted({t for t in targets if t is not None})
    print(f"controller host: {controller}; engines: {engines}; probed: {targets}")
    assert len(targets) >= len(controller)
    # nothing listens on every interface: the store on engine 0's address toward the controller
    assert {ip for ip, _, _ in controller} <= {"127.0.0.1", network.controller_ip}
    assert [(ip, port) for ports in engines for ip, port in ports if ip in ("0.0.0.0", "::")] == []

    expected = [fit_here(seed) for seed in range(FITS_AT_LEAST)]

    def fit(i):
        got = ssh_cluster.run_async(fit_on_ranks, i % FITS_AT_LEAST).result(timeout=CALL_BOUND_S)
        for rank_fit in got:
            for value, reference in zip(rank_fit, expected[i % FITS_AT_LEAST]):
                np.testing.assert_allclose(value, reference, rtol=1e-9, atol=1e-12)

    try:
        report = probe_while(fit, [*targets, "--rounds", str(ROUNDS)], FITS_AT_LEAST)
        print(f"probe as nobody: {report}")
        assert report["uid"] != 0 and report["connected"] > 0 and report["calls"] >= FITS_AT_LEAST
        assert ssh_cluster.status().dropped == {}
    finally:  # leave the hosts as the multi-host tests before this one did: empty (Slurm's tests check)
        ssh_cluster.stop()
        for host in network.hosts:
            host.disconnect()

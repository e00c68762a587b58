"""What a running cluster listens on, as another user of its hosts sees it (issue 40).

    .venv/bin/python benchmarks/port_inventory.py [--ssh]

For a 2-engine local cluster in each of ``cluster_bench.py``'s three set-ups (the controller on
Unix sockets, the default; on loopback TCP as before, without CurveZMQ and with the engines'
nannies and heartbeat watches; on loopback TCP with CurveZMQ, as across hosts), and with
``--ssh`` (root: ``tests/multihost``'s simulated hosts) for a cluster of one engine on each of
2 hosts through the ssh launcher: every TCP port its processes listen on (``/proc/net/tcp``, as
``tests/shared_host_probe.py`` finds them), the address each is bound to, and whether each
authenticates its peers, found by asking: a ZMTP greeting sent to the port, and the mechanism
the answer announces (CURVE: a peer without the key is refused at the handshake; NULL: anyone
is let in; no ZeroMQ answer: gloo or torch's rendezvous store, which authenticate nothing).
Also the Unix sockets (in the cluster's 0700 folder). Written to ``port_inventory.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from cluster_bench import EXPOSURES
from results import Table, add_json_argument, write_results

from mixle_nb.cluster import MixleCluster

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path[:0] = [TESTS, os.path.join(TESTS, "multihost")]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))

from shared_host_probe import listening_here, listening_ports, unix_listeners, zmtp_mechanism  # noqa: E402

COLUMNS = [
    "cluster",
    "host",
    "processes",
    "TCP ports",
    "bound to",
    "CurveZMQ",
    "ZeroMQ NULL",
    "not ZeroMQ",
    "Unix sockets",
]
KIND = {"CURVE": "CurveZMQ", "NULL": "ZeroMQ NULL", None: "not ZeroMQ"}
LOOPBACK = ("127.0.0.1", "::1")


def add_row(table: Table, where: tuple[str, str, str], found: list[tuple[str, int, str | None]], unix: int) -> None:
    """A row: ``where`` (cluster, host, processes), then what ``found`` (address, port,
    mechanism) holds, by address and by mechanism."""
    kinds = Counter(KIND[mechanism] for _, _, mechanism in found)
    bound = Counter(address for address, _, _ in found)
    table.add(
        *where,
        len(found),
        ", ".join(f"{address} ({count})" for address, count in sorted(bound.items())) or "-",
        kinds["CurveZMQ"],
        kinds["ZeroMQ NULL"],
        kinds["not ZeroMQ"],
        unix,
    )
    print("  ".join(str(value) for value in table.rows[-1]))


def asked(pids: set[int]) -> list[tuple[str, int, str | None]]:
    """The TCP ports ``pids`` listen on, each with the mechanism it answers a greeting with."""
    local = {"0.0.0.0": "127.0.0.1", "::": "::1"}
    return [
        (address, port, zmtp_mechanism((local.get(address, address), port)))
        for address, port, _ in listening_ports(pids)
    ]


def roles(cluster: MixleCluster) -> dict[str, set[int]]:
    """The cluster's local processes by role: the controller (and its schedulers), the engines'
    nannies (an engine's child, where it has one), the engines."""
    import psutil

    engines = {row.pid for row in cluster.status()}
    nannies = {child.pid for pid in engines for child in psutil.Process(pid).children()} & cluster.pids
    return {"controller": cluster.pids - engines - nannies, "nannies": nannies, "engines": engines}


def local_inventory(table: Table) -> None:
    """A row per role of a 2-engine local cluster in each of the three set-ups."""
    for name, options in EXPOSURES.items():
        with MixleCluster(2, timeout=20.0, **options) as cluster:
            for processes, pids in roles(cluster).items():
                add_row(table, (f"local, {name}", "notebook's", processes), asked(pids), len(unix_listeners(pids)))


def ssh_inventory(table: Table) -> None:
    """A row for the notebook's host and one per engine host of a 2-host ssh cluster."""
    from simulated_hosts import SimulatedNetwork

    with SimulatedNetwork(2) as net:
        with MixleCluster(2, launcher="ssh", timeout=20.0, **net.cluster_options(engines_per_host=1)) as cluster:
            found = asked(cluster.pids)
            add_row(table, ("ssh, 2 hosts", "notebook's", "controller"), found, len(unix_listeners(cluster.pids)))
            for host, engine in zip(net.hosts, cluster.run(listening_here)):
                shown = [("loopback" if ip in LOOPBACK else "its address", port, kind) for ip, port, kind in engine]
                add_row(table, ("ssh, 2 hosts", f"engine host {host.index}", "engine and its nanny"), shown, 0)
        for host in net.hosts:
            host.disconnect()


def main() -> None:
    """Measure, print and write ``port_inventory.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ssh", action="store_true", help="also a 2-host ssh cluster on simulated hosts (root)")
    add_json_argument(parser, "port_inventory")
    args = parser.parse_args()
    table = Table("TCP ports a 2-engine cluster listens on, and which authenticate their peers", COLUMNS)
    print("  ".join(COLUMNS))
    local_inventory(table)
    if args.ssh:
        ssh_inventory(table)
    write_results(args.json, "port_inventory", 1, [table])


if __name__ == "__main__":
    main()

"""Fixtures for the multi-host tests: simulated hosts (simulated_hosts.py) and a MixleCluster on them.

Without root, namespaces or sshd the tests skip with what is missing, unless ``CI=true`` or under
``make test``: then they fail (``make test`` installs openssh-server; CI runs as root).
"""

import pytest
from simulated_hosts import SimulatedNetwork, missing_privileges
from strictness import unavailable

GROUP_TIMEOUT_S = 20.0  # the torch.distributed group's timeout on the ssh cluster


@pytest.fixture(scope="session")
def network():
    """Two simulated hosts on one bridge, removed (and checked empty) at session end."""
    reason = missing_privileges()
    if reason:
        unavailable(reason)
    with SimulatedNetwork(2) as net:
        yield net


@pytest.fixture(scope="session")
def ssh_cluster(network):
    """A MixleCluster with one engine on each simulated host, started through ipyparallel's
    ssh launcher, the controller on the bridge address. Tests leave it running (a test that
    breaks it restarts it); the last test stops it."""
    from mixle_nb.cluster import MixleCluster

    cluster = MixleCluster(
        len(network.hosts), launcher="ssh", timeout=GROUP_TIMEOUT_S, **network.cluster_options(engines_per_host=1)
    )
    cluster.start()
    yield cluster
    cluster.stop()

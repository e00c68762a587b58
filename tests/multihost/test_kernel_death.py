"""A notebook kernel that started an ssh cluster on the simulated hosts, killed by force: its
controller ends through the kernel's lifeline and the remote engines, which watch their
controller, end on their hosts within the bound. Runs before test_multihost.py (file order),
whose cluster then has the hosts to itself."""

import os
import pickle
import time

import pytest
from kernels import kernel, kill, new_tag, run, tagged, wait_gone

pytestmark = pytest.mark.multihost

ORPHAN_BOUND_S = 10.0

START = """
import pickle
from mixle_nb.cluster import MixleCluster
with open({options!r}, "rb") as f:
    options = pickle.load(f)
c = MixleCluster(2, launcher="ssh", timeout=20.0, **options).start()
print(c.run(lambda: __import__("torch").distributed.get_rank()))
"""


def test_a_forced_kernel_restart_ends_the_engines_on_every_host_within_the_bound(network):
    options = os.path.join(network.dir, "kernel_cluster_options.pickle")
    with open(options, "wb") as f:
        pickle.dump(network.cluster_options(engines_per_host=1), f)
    tag, local = new_tag(), []
    try:
        with kernel(tag) as (manager, client):
            assert run(client, START.format(options=options)).strip() == "[0, 1]"
            local = [p for p in tagged(tag) if p.pid != manager.provisioner.pid]
            assert all(h.processes() for h in network.hosts)  # an engine on each host

            t0 = time.monotonic()
            manager.restart_kernel(now=True)
            for host in network.hosts:
                host.disconnect()  # the harness's shared ssh connection is not the cluster's
            remote = {h.hostname: h.wait_empty(3 * ORPHAN_BOUND_S) for h in network.hosts}
            waited = time.monotonic() - t0
            left, _ = wait_gone(local, ORPHAN_BOUND_S)
            print(f"every host empty {waited:.2f} s after the forced restart")
            assert remote == {h.hostname: [] for h in network.hosts}
            assert [p.pid for p in left] == []
            assert waited <= ORPHAN_BOUND_S, f"{waited:.1f} s"
    finally:
        kill(local)
        for host in network.hosts:  # the mechanism failed: leak nothing into later tests
            kill(host.processes())

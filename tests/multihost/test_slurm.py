"""MixleCluster through a real Slurm: 4 engines on 2 simulated hosts, one ``sbatch`` job.

The module has its own simulated hosts with Slurm on them (slurm_hosts.py) and one cluster
that the tests share, in file order: the pending test needs its job holding every CPU, the
scancel test restarts it, the last test stops it and checks that nothing is left.
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from interrupts import interrupt_after, kernel_interrupts
from rank_functions import allreduce_sum
from simulated_hosts import PREFIX, SimulatedNetwork, missing_privileges
from slurm_hosts import SlurmOnHosts, missing_slurm
from strictness import unavailable
from test_multihost import (
    em_steps_for,
    rank_ddp_train,
    rank_fit,
    single_process_fit,
    sleep_noting_interrupt,
    union_reference,
    was_interrupted,
)

from mixle_nb.cluster import MixleCluster, RankDiedError

pytestmark = [pytest.mark.multihost, pytest.mark.slurm]

ENGINES, HOSTS = 4, 2
GROUP_TIMEOUT_S = 20.0
HEARTBEAT_BOUND_S = 10.0  # as the ssh path's (test_multihost.py)
PENDING_TIMEOUT_S = 6.0
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def slurm():
    """Two simulated hosts of their own (beside the ssh tests' ones) with Slurm on them; the
    clients' environment points at it while the module runs."""
    reason = missing_privileges() or missing_slurm()
    if reason:
        unavailable(reason)
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PYTHONPATH")}
    with SimulatedNetwork(HOSTS, tag=f"{PREFIX}{os.getpid()}s") as net, SlurmOnHosts(net) as slurm:
        # engines import this checkout and the test modules, as the ssh hosts do (shared filesystem)
        os.environ.update(
            slurm.environment(),
            PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), TESTS, os.path.join(TESTS, "multihost")]),
        )
        try:
            yield slurm
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def slurm_options(slurm, fixed_ports=True, **more):
    """The module's cluster takes the network's engine ports; another one at the same time
    lets the controller choose."""
    net = slurm.network
    lo, hi = net.engine_ports[0], net.engine_ports[-1]
    ports = [f"--IPController.engine_ports={lo}-{hi}"] if fixed_ports else []
    return {
        "launcher": "slurm",
        "partition": slurm.partition,
        "time": "00:10:00",
        "controller_ip": net.controller_ip,
        "timeout": GROUP_TIMEOUT_S,
        "controller_args": ports,
        **more,
    }


@pytest.fixture(scope="module")
def cluster(slurm):
    cluster = MixleCluster(ENGINES, ntasks_per_node=ENGINES // HOSTS, **slurm_options(slurm))
    cluster.start()
    yield cluster
    cluster.stop()


# ---- run on the ranks


def slurm_identity():
    import socket

    return (
        socket.gethostname(),
        int(os.environ["SLURM_PROCID"]),
        int(os.environ["SLURM_LOCALID"]),
        os.environ["SLURM_JOB_ID"],
    )


# ---- tests, in order


def test_four_engines_on_two_hosts_through_sbatch(cluster, slurm):
    seen = cluster.run(slurm_identity)
    hosts = [h.hostname for h in slurm.network.hosts]
    assert [procid for _, procid, _, _ in seen] == list(range(ENGINES))  # rank = SLURM_PROCID
    assert [host for host, *_ in seen] == [hosts[0], hosts[0], hosts[1], hosts[1]]
    assert [local for _, _, local, _ in seen] == [0, 1, 0, 1]
    job = seen[0][3]
    assert {j for *_, j in seen} == {job}
    assert slurm.jobs() == [f"{job} RUNNING"]
    assert cluster.status().job == f"slurm job {job}: RUNNING"
    assert str(cluster.status()).startswith(f"slurm job {job}: RUNNING\n")


def test_em_matches_one_process_and_every_rank_holds_the_same_model(cluster):
    ranks = cluster.run(rank_fit, "allreduce")
    reference = single_process_fit()
    for numbers, log_densities in ranks:
        np.testing.assert_array_equal(numbers, ranks[0][0])
        np.testing.assert_allclose(numbers, reference[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(log_densities, reference[1], rtol=1e-10)


def test_ddp_training_matches_one_process_on_the_union_of_batches(cluster):
    replicas = cluster.run(rank_ddp_train)
    reference = union_reference(ENGINES)
    for name, value in replicas[0].items():
        for r in range(1, ENGINES):
            assert torch.equal(value, replicas[r][name]), f"{name}: rank {r} differs"
        torch.testing.assert_close(value, reference[name], atol=1e-5, rtol=0, msg=name)


def test_ctrl_c_reaches_every_rank(cluster):
    try:
        with kernel_interrupts(), pytest.raises(KeyboardInterrupt):
            timer = interrupt_after(1.0)
            cluster.run(sleep_noting_interrupt, 60)
    finally:
        timer.cancel()
    assert cluster.state == "running"
    assert cluster.run(was_interrupted) == [True] * ENGINES  # through each engine's nanny
    assert cluster.run(allreduce_sum, 1) == [float(ENGINES)] * ENGINES


def test_a_pending_job_shows_its_reason_and_start_gives_up_cleanly(cluster, slurm):
    """The running job holds every CPU, so a second cluster's job pends on Resources."""
    second = MixleCluster(2, pending_timeout=PENDING_TIMEOUT_S, **slurm_options(slurm, fixed_ports=False))
    failure = []
    starting = threading.Thread(target=lambda: _record_failure(second.start, failure))
    starting.start()
    try:
        seen, deadline = "", time.monotonic() + 30
        while "PENDING (" not in seen and time.monotonic() < deadline and starting.is_alive():
            seen = second.status().job
            time.sleep(0.2)
        assert seen.startswith("slurm job ") and "PENDING (Resources" in seen, seen
        job = seen.split()[2].rstrip(":")
    finally:
        starting.join(PENDING_TIMEOUT_S + 60)
    assert not starting.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], TimeoutError), failure
    assert f"slurm job {job} pending: Resources" in str(failure[0])
    assert second.state == "stopped" and second.pids == set()
    assert [line.split()[0] for line in slurm.jobs()] == [cluster.status().job.split()[2].rstrip(":")]


def _record_failure(fn, failures):
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        failures.append(exc)


def test_scancel_mid_step_is_a_rank_died_error_naming_the_job_state(cluster, slurm):
    job = cluster.status().job.split()[2].rstrip(":")
    call = cluster.run_async(em_steps_for, 60)
    deadline = time.monotonic() + 30
    while not all(call.data.get(r, {}).get("steps", 0) >= 3 for r in range(ENGINES)):
        assert time.monotonic() < deadline and not call.done(), f"steps did not start: {call.data}"
        time.sleep(0.05)
    subprocess.run(["scancel", job], check=True)
    t0 = time.monotonic()
    # while its processes end Slurm shows COMPLETING, and CANCELLED only after (seconds here)
    with pytest.raises(RankDiedError, match=rf"died.*slurm job {job} is (CANCELLED|COMPLETING).*restart") as info:
        call.result(timeout=cluster.timeout + 30)
    elapsed = time.monotonic() - t0
    assert info.value.ranks == list(range(ENGINES))  # the job's end is every rank's
    assert elapsed < HEARTBEAT_BOUND_S < cluster.timeout, f"{elapsed:.1f} s"

    cluster.restart()
    assert cluster.run(allreduce_sum, 3) == [3.0 * ENGINES] * ENGINES
    assert cluster.status().job.split()[2].rstrip(":") != job


def test_stop_leaves_no_process_on_any_host_and_no_job(cluster, slurm):
    local = cluster.pids
    cluster.stop()
    assert slurm.jobs() == []
    assert _leftovers_once_disconnected(slurm) == {h.hostname: [] for h in slurm.network.hosts}
    assert [p for p in local if _alive(p)] == []


def test_handles_run_unchanged_under_plain_srun(slurm):
    """``srun python srun_fit.py``: rank, world and store address from SLURM_* only."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
    }
    done = subprocess.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--time=00:05:00",
            sys.executable,
            os.path.join(TESTS, "multihost", "srun_fit.py"),
        ],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    tasks = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda t: t["RANK"])
    first = slurm.network.hosts[0].hostname
    assert [(t["RANK"], t["WORLD_SIZE"], t["MASTER_ADDR"]) for t in tasks] == [("0", "2", first), ("1", "2", first)]
    assert [t["SLURM_PROCID"] for t in tasks] == ["0", "1"]
    reference = single_process_fit()
    for task in tasks:
        np.testing.assert_array_equal(task["numbers"], tasks[0]["numbers"])
        np.testing.assert_allclose(task["numbers"], reference[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(task["log_densities"], reference[1], rtol=1e-10)
    assert _queue_empties(slurm) == []  # srun's own job, once its processes are gone


def _queue_empties(slurm, timeout=30.0):
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    return slurm.jobs()


def _leftovers_once_disconnected(slurm, timeout=10.0):
    """Each host's processes that are not the harness's, after closing its shared ssh connection
    (whose sshd session ends just after the connection's exit)."""
    for host in slurm.network.hosts:
        host.disconnect()
    deadline = time.monotonic() + timeout
    while any((left := slurm.leftovers()).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


_OWNER = """
import sys, time
from mixle_nb.cluster import MixleCluster
cluster = MixleCluster(2, **{options})
cluster.start()
print(cluster.status().job.split()[2].rstrip(":"), flush=True)
time.sleep(600)
"""


def test_the_lifeline_cancels_the_job_when_its_owner_is_killed(slurm):
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER.format(options=repr(slurm_options(slurm)))], stdout=subprocess.PIPE, text=True
    )
    try:
        job = owner.stdout.readline().strip()
        assert job.isdigit(), job
        assert slurm.jobs() == [f"{job} RUNNING"]
    finally:
        owner.kill()
        owner.wait()
    assert _queue_empties(slurm) == []
    assert _leftovers_once_disconnected(slurm) == {h.hostname: [] for h in slurm.network.hosts}


def _alive(pid):
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

"""MixleCluster with real processes: group, data movement, errors, faults, cleanup, exposure."""

import asyncio
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
from interrupts import interrupt_after, kernel_interrupts
from rank_functions import allreduce_sum, late_allreduce

from mixle_nb.cluster import MAX_ENGINES, MixleCluster, RankDiedError, RankError, current

# ---- functions run on the ranks (module level: engines import them from this file's module)


def rank_and_world():
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def fail_on(rank):
    import torch.distributed as dist

    if dist.get_rank() == rank:
        raise ValueError(f"bad shard on {rank}")
    return "ok"


def publish_then_wait(seconds):
    import time

    import torch.distributed as dist
    from ipyparallel.datapub import publish_data

    publish_data({"step": 1, "rank": dist.get_rank()})
    time.sleep(seconds)
    return dist.get_rank()


def alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def listening_addresses(pids):
    """(pid, address) of every listening TCP socket owned by ``pids`` (from /proc/net/tcp*)."""
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    listening[fields[9]] = fields[1].rsplit(":", 1)[0]
    found = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else None
            if inode in listening:
                found.append((pid, listening[inode]))
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 (little-endian hex)


# ---- arguments


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "2", MAX_ENGINES + 1])
def test_bad_n_is_rejected_before_launch(n):
    with pytest.raises((TypeError, ValueError), match="n must be"):
        MixleCluster(n)


def test_bad_backend_timeout_and_nccl_without_gpu():
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        MixleCluster(2, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        MixleCluster(2, timeout=0)
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="nccl.*GPU"):
            MixleCluster(2, backend="nccl")


def test_numpy_integers_are_integers_and_bools_and_floats_are_not():
    assert MixleCluster(np.int64(2), threads=np.int64(1)).n == 2
    with pytest.raises(ValueError, match="threads must be an integer"):
        MixleCluster(2, threads=1.0)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"launcher": "slurm", "partiton": "gpu"},
            r"unexpected keyword argument 'partiton' \(did you mean 'partition'\?\)",
        ),
        ({"mpiexec_arg": ["-n"]}, r"'mpiexec_arg' \(did you mean 'mpiexec_args'\?\)"),
        ({"controller_locaton": "10.0.0.1"}, r"'controller_locaton' \(did you mean 'controller_location'\?\)"),
        ({"no_such_option": 1}, r"unexpected keyword argument 'no_such_option'; its keyword arguments are "),
        ({"engines": "ssh"}, r"does not take engines=: give the engine launcher as launcher="),
    ],
)
def test_a_misspelt_keyword_is_a_type_error_naming_it_and_the_valid_ones(options, message):
    with pytest.raises(TypeError, match=message) as caught:
        MixleCluster(2, **options)
    if "its keyword arguments are" in str(caught.value):
        valid = str(caught.value).split("its keyword arguments are ")[1].split(", ")
        # ours, the Slurm and MPI options, and ipyparallel.Cluster's own traits
        assert {"backend", "partition", "pending_timeout", "mpiexec_args", "profile_dir", "controller_ip"} <= set(valid)
        assert "n" not in valid and "engines" not in valid


@pytest.mark.parametrize(
    "options, message",
    [
        ({"partition": "gpu"}, r"partition= need launcher='slurm' \(launcher is 'local'\)"),
        ({"launcher": "ssh", "gpus_per_task": 1, "time": "1:00"}, r"time=, gpus_per_task= need launcher='slurm'"),
        ({"launcher": "slurm", "mpiexec_args": []}, r"mpiexec_args= needs launcher='mpi' \(launcher is 'slurm'\)"),
        ({"controller_args": "--x"}, r"controller_args must be a list of strings"),
    ],
)
def test_a_launcher_option_for_another_launcher_is_a_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        MixleCluster(2, **options)


def test_the_documented_launcher_calls_build_the_arguments_ipyparallel_gets(tmp_path):
    """The README's Slurm, ssh and MPI calls: every option reaches ``ipyparallel.Cluster``'s
    arguments or the launcher's configuration, none is dropped."""
    from traitlets.config import Config

    slurm = MixleCluster(
        8,
        launcher="slurm",
        partition="gpu",
        account="proj42",
        time="00:30:00",
        nodes=2,
        ntasks_per_node=4,
        gpus_per_task=1,
        extra_sbatch=["--qos=debug"],
        controller_ip="10.0.0.1",
        controller_args=["--IPController.engine_ports=10101-10116"],
        pending_timeout=5,
    )
    arguments = slurm.launch_spec.cluster_arguments(8, str(tmp_path))
    assert arguments["engines"] == "slurm" and arguments["controller_ip"] == "10.0.0.1"
    assert arguments["controller_args"][-1] == "--IPController.engine_ports=10101-10116"
    template = arguments["config"].SlurmEngineSetLauncher.batch_template
    for option in ("--partition=gpu", "--account=proj42", "--time=00:30:00", "--nodes=2", "--ntasks-per-node=4"):
        assert f"#SBATCH {option}\n" in template
    assert "#SBATCH --gpus-per-task=1\n" in template and "#SBATCH --qos=debug\n" in template
    assert slurm.launch_spec.slurm.pending_timeout == 5.0

    config = Config()
    config.SSHEngineSetLauncher.engines = {"host1": 2}
    ssh = MixleCluster(2, launcher="ssh", controller_ip="10.0.0.1", config=config, profile_dir=str(tmp_path))
    arguments = ssh.launch_spec.cluster_arguments(2, None)
    assert arguments["config"] is config and arguments["profile_dir"] == str(tmp_path)
    assert arguments["engines"] == "ssh" and "SlurmEngineSetLauncher" not in config

    mpi = MixleCluster(2, launcher="mpi", mpiexec_args=["--hostfile", "hosts"])
    arguments = mpi.launch_spec.cluster_arguments(2, None)
    assert arguments["config"].MPIEngineSetLauncher.mpi_args == ["--hostfile", "hosts"]


@pytest.mark.cluster
def test_targets_follow_the_same_rules(cluster2):
    assert cluster2.run(rank_and_world, targets=np.int64(1)) == [(1, 2)]
    assert cluster2.run(rank_and_world, targets=[np.int64(0)]) == [(0, 2)]
    for bad in (True, 1.0, [0, 2], [], -1):
        with pytest.raises(ValueError, match="targets"):
            cluster2.run(rank_and_world, targets=bad)


def test_max_engines_is_stated():
    with pytest.raises(ValueError, match=str(MAX_ENGINES)):
        MixleCluster(MAX_ENGINES + 1)


# ---- the shared 2-engine cluster


@pytest.mark.cluster
def test_ranks_are_engine_ids_and_allreduce_sums(cluster2):
    for engine_id in cluster2.client.ids:
        assert cluster2.client[engine_id].apply_sync(rank_and_world) == (engine_id, 2)
    assert cluster2.run(rank_and_world) == [(0, 2), (1, 2)]
    assert cluster2.run(allreduce_sum, 3) == [6.0, 6.0]
    assert cluster2.run(allreduce_sum, value=1, targets=None) == [2.0, 2.0]


@pytest.mark.cluster
def test_push_pull_scatter_run(cluster2):
    cluster2.push(alpha=5, beta=[1, 2])
    assert cluster2.pull("alpha", rank="all") == [5, 5]
    assert cluster2.pull("beta", rank=1) == [1, 2]
    cluster2.scatter("part", list(range(7)))
    assert cluster2.pull("part", rank="all") == [[0, 2, 4, 6], [1, 3, 5]]
    assert cluster2.run(len, list(range(3))) == [3, 3]
    assert cluster2.run(rank_and_world, targets=[1]) == [(1, 2)]


@pytest.mark.cluster
def test_exception_names_the_rank_and_carries_the_traceback(cluster2):
    with pytest.raises(RankError) as info:
        cluster2.run(fail_on, 1)
    err = info.value
    assert err.rank == 1 and err.ename == "ValueError"
    assert "rank 1" in str(err) and "bad shard on 1" in str(err)
    assert "fail_on" in err.traceback_text
    assert cluster2.run(fail_on, 5) == ["ok", "ok"]  # still usable


@pytest.mark.cluster
def test_run_async_publishes_data_and_is_awaitable(cluster2):
    call = cluster2.run_async(publish_then_wait, 1.0)
    deadline = time.monotonic() + 10
    while len(call.data) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert call.data == {0: {"step": 1, "rank": 0}, 1: {"step": 1, "rank": 1}}
    assert not call.done()
    # A thread of its own: the session's Playwright browser keeps an event loop running here.
    awaited = []
    waiter = threading.Thread(target=lambda: awaited.append(asyncio.run(_await(call))))
    waiter.start()
    waiter.join(60)
    assert awaited == [[0, 1]]
    assert call.done() and call.ranks_done() == [0, 1]
    assert cluster2.status()[0].last_call_s >= 1.0


async def _await(call):
    return await call


@pytest.mark.cluster
def test_status_rows(cluster2):
    rows = cluster2.status()
    assert [(r.engine_id, r.rank) for r in rows] == [(0, 0), (1, 1)]
    assert all(r.alive and r.in_group and r.rss_bytes > 0 for r in rows)
    assert all(psutil.pid_exists(r.pid) for r in rows)
    assert "<table>" in rows._repr_html_() and "in_group" in str(rows)


@pytest.mark.cluster
def test_nothing_listens_off_loopback(cluster2):
    found = listening_addresses(cluster2.pids)
    assert {pid for pid, _ in found} & {r.pid for r in cluster2.status()}  # gloo listens too
    assert [(pid, addr) for pid, addr in found if addr not in LOOPBACK] == []


def allreduce_forever():
    """Real work inside collectives: all-reduces until interrupted (the ranks drift apart in
    how many they finished, so an interrupt leaves one waiting in a collective)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(100_000)
    while True:
        dist.all_reduce(t)


@pytest.mark.cluster
@pytest.mark.parametrize("work", ["allreduce_forever", "late_allreduce", "sleep"])
def test_keyboard_interrupt_stops_a_long_call(cluster2, work):
    calls = {
        "allreduce_forever": (allreduce_forever, ()),
        "late_allreduce": (late_allreduce, (1, 60)),
        "sleep": (time.sleep, (60,)),
    }
    fn, args = calls[work]
    engine_pids = [r.pid for r in cluster2.status()]
    pids = cluster2.pids
    t0 = time.monotonic()
    try:
        with kernel_interrupts(), pytest.raises(KeyboardInterrupt):
            timer = interrupt_after(1.0)
            cluster2.run(fn, *args)
        elapsed = time.monotonic() - t0
        state, reason = cluster2.state, cluster2.broken_reason
        after = [r.pid for r in cluster2.status()], cluster2.pids
        works = cluster2.run(allreduce_sum, 1) if state == "running" else None
    finally:
        timer.cancel()
        if cluster2.state != "running":  # for the next tests; this one has failed by then
            cluster2.restart()
    assert elapsed < 10
    assert state == "running", reason  # not broken, and no restart was needed
    assert after == (engine_pids, pids)  # the same engines and processes
    assert works == [2.0, 2.0]


# ---- short-lived clusters for destructive tests


@pytest.mark.cluster
def test_four_engines_kill_restart_and_stop_leaves_nothing():
    with MixleCluster(4, timeout=5.0) as cluster:
        assert current() is cluster
        assert cluster.run(rank_and_world) == [(r, 4) for r in range(4)]
        assert cluster.run(allreduce_sum, 1) == [4.0] * 4
        first_pids = cluster.pids

        victim = cluster.status()[1].pid
        call = cluster.run_async(late_allreduce, 1, 60)  # ranks 0, 2, 3 block in the collective
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RankDiedError, match="rank 1 died.*restart") as info:
            call.result()
        assert info.value.ranks == [1]
        assert time.monotonic() - t0 < cluster.timeout
        with pytest.raises(RankDiedError, match="rank 1"):
            cluster.run(allreduce_sum, 1)
        assert [r.alive for r in cluster.status()] == [True, False, True, True]

        cluster.restart()
        assert cluster.run(allreduce_sum, 2) == [8.0] * 4
        assert alive(first_pids) == []
        second_pids = cluster.pids
    assert cluster.state == "stopped" and current() is None
    assert alive(second_pids) == []


@pytest.mark.cluster
def test_failed_start_leaves_nothing():
    cluster = MixleCluster(2, timeout=5.0)
    seen = {}

    def fail_when_registered(message):
        if message == "2/2 engines registered":
            seen["pids"] = cluster.pids
            raise RuntimeError("progress display broke")

    with pytest.raises(RuntimeError, match="progress display broke"):
        cluster.start(progress=fail_when_registered)
    assert len(seen["pids"]) >= 3  # controller and both engines had started
    assert alive(seen["pids"]) == []
    assert cluster.state == "stopped" and current() is not cluster

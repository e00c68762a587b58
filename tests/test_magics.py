"""The magics through a real IPython shell against a real 2-engine cluster."""

from __future__ import annotations

import psutil
import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

from mixle_nb import cluster as cluster_module


@pytest.fixture(scope="module")
def shell():
    ip = start_ipython() or get_ipython()  # start_ipython answers None once another module started it
    ip.run_line_magic("load_ext", "mixle_nb")
    previous = cluster_module.current()
    cluster_module.set_current(None)  # these tests start their own cluster through the magic
    yield ip
    mine = cluster_module.current()
    if mine is not None:
        mine.stop()
    cluster_module.set_current(previous)


def usage_error(ip, magic: str, line: str, cell: str | None = None) -> str:
    with pytest.raises(UsageError) as info:
        if cell is None:
            ip.run_line_magic(magic, line)
        else:
            ip.run_cell_magic(magic, line, cell)
    message = str(info.value)
    assert "\n" not in message  # one line, no traceback
    return message


def test_misuse_before_a_cluster_exists(shell):
    assert "no mixle cluster is running: start one with %mixle_cluster start N" in usage_error(
        shell, "mixle_cluster", "status"
    )
    assert "no mixle cluster is running" in usage_error(shell, "mixle_push", "x")
    assert "no mixle cluster is running" in usage_error(shell, "mixle", "", "print(1)")
    assert "say how many engines" in usage_error(shell, "mixle_cluster", "start")
    assert "n must be" in usage_error(shell, "mixle_cluster", "start 0")
    assert "invalid choice" in usage_error(shell, "mixle_cluster", "begin 2")
    assert "invalid choice" in usage_error(shell, "mixle_cluster", "start 2 --backend mpi")


@pytest.mark.cluster
def test_start_push_scatter_cell_pull_status_stop(shell, capsys):
    shell.run_line_magic("mixle_cluster", "start 2 --timeout 20")
    started = capsys.readouterr().out
    assert "2/2 engines registered" in started and "group formed" in started
    cluster = shell.user_ns["mixle"]
    assert cluster is cluster_module.current() and cluster.state == "running"
    assert "a mixle cluster is already running" in usage_error(shell, "mixle_cluster", "start 2")

    shell.user_ns.update(offset=10, data=list(range(7)))
    shell.run_line_magic("mixle_push", "offset")
    shell.run_line_magic("mixle_scatter", "data")
    assert "'missing' is not defined in this notebook" in usage_error(shell, "mixle_push", "offset missing")

    shell.run_cell_magic(
        "mixle",
        "",
        "import torch.distributed as dist\n"
        "total = sum(data) + offset\n"
        "print('rank', dist.get_rank(), 'of', dist.get_world_size())",
    )
    out = capsys.readouterr().out
    assert out == "rank 0 of 2\n"  # rank 0's output only, by default
    shell.run_cell_magic("mixle", "--all", "print('hello from', dist.get_rank())")
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0\n" in out and "[rank 1] hello from 1\n" in out
    shell.run_cell_magic("mixle", "--targets 1", "print('only', dist.get_rank())")
    assert capsys.readouterr().out == "only 1\n"

    shell.run_line_magic("px", "px_rank = dist.get_rank()")  # ipyparallel's %px targets the cluster
    assert cluster.pull("px_rank", rank="all") == [0, 1]
    assert shell.run_line_magic("mixle_pull", "total") == sum(range(0, 7, 2)) + 10
    assert shell.run_line_magic("mixle_pull", "total --all") == [22, sum(range(1, 7, 2)) + 10]
    assert "'nothing' is not defined on rank 0" in usage_error(shell, "mixle_pull", "nothing")

    message = usage_error(shell, "mixle", "", "if dist.get_rank() == 1:\n    raise ValueError('bad shard')")
    assert "rank 1" in message and "ValueError: bad shard" in message
    assert "bad shard" in capsys.readouterr().err  # the remote traceback is shown
    assert "--targets takes ranks" in usage_error(shell, "mixle", "--targets one", "pass")

    shell.run_line_magic("mixle_cluster", "status")
    table = capsys.readouterr().out
    assert "rank" in table and str(cluster.status()[1].pid) in table

    pids = cluster.pids
    shell.run_line_magic("mixle_cluster", "stop")
    assert cluster.state == "stopped"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert "no mixle cluster is running" in usage_error(shell, "mixle_cluster", "stop")


def test_help_is_available(shell, capsys):
    for magic in ("mixle_cluster", "mixle_push", "mixle_scatter", "mixle_pull"):
        shell.run_line_magic(magic, "--help")
        text = capsys.readouterr().out
        assert f"%{magic}" in text and "Example" in text
    shell.run_cell_magic("mixle", "--help", "pass")
    assert "--targets" in capsys.readouterr().out


@pytest.mark.cluster
def test_kill_9_during_a_cell_then_restart(shell, capsys):
    import os
    import signal
    import threading
    import time

    shell.run_line_magic("mixle_cluster", "start 2 --timeout 20")
    cluster = shell.user_ns["mixle"]
    victim = cluster.status()[1].pid
    kill = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
    kill.start()
    t0 = time.monotonic()
    try:
        message = usage_error(
            shell,
            "mixle",
            "",
            "import torch, torch.distributed as dist\nt = torch.ones(1000)\nwhile True:\n    dist.all_reduce(t)",
        )
    finally:
        kill.cancel()  # if the cell failed before the kill, the pid must not be killed later
    assert "rank 1 died" in message and time.monotonic() - t0 < 1.0 + 3.0
    assert cluster.state == "broken"
    assert "needs a restart" in usage_error(shell, "mixle", "", "print(1)")
    shell.run_line_magic("mixle_cluster", "restart")
    capsys.readouterr()
    shell.run_cell_magic("mixle", "", "import torch.distributed as dist\nprint(dist.get_world_size())")
    assert capsys.readouterr().out == "2\n" and victim not in [r.pid for r in cluster.status()]
    shell.run_line_magic("mixle_cluster", "stop")

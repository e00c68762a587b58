"""How a local cluster starts (issue 40's start-up): its engines start beside the controller,
through ``mixle_nb.cluster.rank_engine``, which imports torch while the controller comes up; the
controller's heartbeat, which completes each registration, beats every 0.1 s and still drops an
engine after 5.5 s of silence; and joining the group imports neither the handles nor the
cluster's notebook side. The times are measured in ``benchmarks/cluster_bench.py --peer``."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest
from traitlets.config import Config

import mixle_nb.cluster
import mixle_nb.parallel
from mixle_nb.cluster import MixleCluster


def controller_flag(arguments: dict, name: str) -> int:
    (value,) = [arg.split("=")[1] for arg in arguments["controller_args"] if arg.startswith(f"--HeartMonitor.{name}=")]
    return int(value)


def test_local_engines_start_beside_the_controller_and_read_its_connection_file(tmp_path):
    arguments = MixleCluster(2).launch_spec.cluster_arguments(2, None, socket_dir=str(tmp_path))
    engines = arguments["config"].LocalEngineSetLauncher
    assert engines.engine_cmd == [sys.executable, "-m", "mixle_nb.cluster.rank_engine"]
    assert arguments["send_engines_connection_env"] is False  # no wait for the controller's files
    assert engines.delay == 0.0
    assert "--IPEngine.wait_for_url_file=120" in engines.engine_args
    period, misses = controller_flag(arguments, "period"), controller_flag(arguments, "max_heartmonitor_misses")
    assert period == 100 and period * (misses + 1) == 5500  # dropped after 5.5 s, as at 500 ms x 11


def test_engines_on_other_hosts_are_launched_as_before(tmp_path):
    config = Config()
    config.SSHEngineSetLauncher.engines = {"host1": 2}
    ssh = MixleCluster(2, launcher="ssh", controller_ip="10.0.0.1", config=config)
    arguments = ssh.launch_spec.cluster_arguments(2, None)
    assert "send_engines_connection_env" not in arguments  # ipyparallel's default: sent to the engines
    assert "LocalEngineSetLauncher" not in arguments["config"]
    assert controller_flag(arguments, "period") == 100


def test_every_public_name_of_the_lazy_packages_is_there():
    for package in (mixle_nb.cluster, mixle_nb.parallel):
        for name in package.__all__:
            assert getattr(package, name) is not None and name in dir(package)
        with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
            package.nothing  # noqa: B018


@pytest.mark.subprocess
def test_a_rank_imports_torch_and_the_group_but_neither_the_handles_nor_debugpy():
    code = (
        "import json, sys\n"
        "from mixle_nb.cluster.rank_engine import import_kernel_debugger, import_rank_modules\n"
        "import_rank_modules()\n"
        "import_kernel_debugger()\n"
        "modules = sorted(sys.modules)\n"
        "import debugpy, ipykernel.debugger\n"
        "print(json.dumps([modules, ipykernel.debugger._is_debugpy_available, debugpy.__name__]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    modules, jupyter_debugger, debugpy = json.loads(out.splitlines()[-1])
    assert {"torch", "torch.distributed", "mixle_nb.parallel.group", "mixle_nb.cluster.engine"} <= set(modules)
    unneeded = {"mixle_nb.parallel.em_handle", "mixle_nb.parallel.token_handle", "mixle_nb.cluster.mixle_cluster"}
    assert not unneeded & set(modules)
    assert "ipykernel.debugger" in modules and "debugpy" not in modules and jupyter_debugger is False
    assert debugpy == "debugpy"  # a user can still import it on a rank


@pytest.mark.cluster
def test_the_engines_run_rank_engine(cluster2):
    for rank in cluster2.status():
        assert psutil.Process(rank.pid).cmdline()[1:3] == ["-m", "mixle_nb.cluster.rank_engine"]

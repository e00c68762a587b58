"""MixleCluster through Open MPI's mpiexec (launcher="mpi"), on this host: engine id = MPI rank,
the torch group gloo as for any launcher, and stop() leaving no process."""

import os
import shutil

import numpy as np
import pytest
from rank_functions import allreduce_sum
from strictness import unavailable
from test_multihost import rank_fit, single_process_fit

from mixle_nb.cluster import MixleCluster

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpi_rank():
    return int(os.environ["OMPI_COMM_WORLD_RANK"]), os.getppid()


@pytest.mark.mpi
@pytest.mark.cluster
def test_engines_through_mpiexec_take_their_mpi_rank(monkeypatch):
    if shutil.which("mpiexec") is None:
        unavailable("the MPI launcher test needs Open MPI's mpiexec (apt-get install openmpi-bin; `make test` does)")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(TESTS), TESTS, os.path.join(TESTS, "multihost")]))
    args = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cluster = MixleCluster(2, launcher="mpi", mpiexec_args=args)
    try:
        cluster.start()
        ranks = cluster.run(mpi_rank)
        assert [r for r, _ in ranks] == [0, 1]  # rank = MPI rank
        assert cluster.run(allreduce_sum, 2) == [4.0, 4.0]
        reference = single_process_fit()
        for numbers, _ in cluster.run(rank_fit, "allreduce"):
            np.testing.assert_allclose(numbers, reference[0], rtol=1e-10, atol=1e-12)
        local = cluster.pids | {parent for _, parent in ranks}  # engines and mpiexec's daemon
    finally:
        cluster.stop()
    import psutil

    assert [p for p in local if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []


def test_mpiexec_args_need_the_mpi_launcher():
    with pytest.raises(ValueError, match="mpiexec_args= needs launcher='mpi'"):
        MixleCluster(2, mpiexec_args=["--oversubscribe"])

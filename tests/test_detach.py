"""Detach and attach: a detached cluster outlives the kernel that started it, killed by force;
a new kernel attaches to it and steps EM on the handle still on its ranks; stop() ends it all."""

import json

import numpy as np
import pytest
from kernels import alive, kernel, kill, new_tag, run, wait_gone

from mixle_nb.stats import GaussianDistribution, MixtureDistribution, em_step, seq_encode

pytestmark = [pytest.mark.kernel, pytest.mark.cluster]

SURVIVES_S = 3.0  # longer than the lifeline takes to end a cluster that is not detached

START = """
%load_ext mixle_nb
%mixle_cluster start 2 --detach --timeout 20
import json
from mixle_nb.cluster import rank_side
from test_detach import build_on_rank
mixle.run(build_on_rank)
steps = [mixle.run(rank_side.em_step_on_rank, "h", "est", "model")[0].log_density for _ in range(2)]
print(json.dumps({"pids": sorted(mixle.pids), "id": mixle._ipp.cluster_id, "steps": steps}))
"""

ATTACH = """
%load_ext mixle_nb
%mixle_cluster list
%mixle_cluster attach
import json
from mixle_nb.cluster import rank_side
step = mixle.run(rank_side.em_step_on_rank, "h", "est", "model")[0].log_density
print(json.dumps({"step": step, "pids": sorted(mixle.pids)}))
"""


def problem():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, 300), rng.normal(3, 0.7, 301)])
    return x, MixtureDistribution([GaussianDistribution(-1, 1), GaussianDistribution(2, 1)], [0.5, 0.5])


def build_on_rank():
    """The handle ``h`` on this rank's shard, its estimator ``est`` and the start ``model``."""
    from mixle_nb.cluster.rank_side import rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    x, model = problem()
    rank_namespace().update(h=TorchRunEncodedData(x, estimator=model.estimator()), est=model.estimator(), model=model)


def test_a_detached_cluster_survives_its_kernel_and_a_new_kernel_attaches_steps_and_stops_it():
    import psutil

    x, model = problem()
    enc, reference = seq_encode(x, model=model), []
    for _ in range(3):
        step = em_step(enc, model.estimator(), model)
        model = step.model
        reference.append(step.log_density)
    procs = []
    try:
        with kernel(new_tag()) as (manager, client):
            started = json.loads(run(client, START).strip().splitlines()[-1])
            procs = [psutil.Process(pid) for pid in started["pids"]]
            manager.restart_kernel(now=True)
            client.wait_for_ready(timeout=60)
            left, _ = wait_gone(procs, SURVIVES_S)
            assert len(left) == len(procs)  # nothing of it ended with its kernel

            *listed, attached = run(client, ATTACH).strip().splitlines()
            attached = json.loads(attached)
            assert any(line.startswith(f"{started['id']}  2 engines (local)") for line in listed)
            assert set(started["pids"]) <= set(attached["pids"])
            np.testing.assert_allclose(started["steps"] + [attached["step"]], reference, rtol=1e-12)

            assert run(client, "%mixle_cluster stop").strip() == "mixle cluster stopped"
            assert alive(procs) == []
            assert run(client, "%mixle_cluster list").strip() == "no detached mixle cluster is running"
    finally:
        kill(procs)

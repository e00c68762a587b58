"""Detach and attach: a detached cluster outlives the kernel that started it, killed by force;
a new kernel attaches to it and steps EM on the handle still on its ranks; stop() ends it all."""

import json
import os

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
print(json.dumps({"pids": sorted(mixle.pids), "id": mixle.detached_record().cluster_id, "steps": steps}))
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


# ---- the record a detached cluster leaves, without a kernel


def a_record(profile_dir, cluster_id="c1", controller_pid=None, detached_at=1.0):
    from mixle_nb.cluster.detached import DetachedRecord, RankRecord

    return DetachedRecord(
        cluster_id=cluster_id,
        profile_dir=str(profile_dir),
        n=2,
        backend="auto",
        timeout=20.0,
        threads=1,
        launcher="local",
        group_backend="gloo",
        store_dir="/tmp/mixle-rendezvous-x",
        group_generation=3,
        controller_pid=os.getpid() if controller_pid is None else controller_pid,
        host="here",
        ranks=(RankRecord(11, "here", 0), RankRecord(12, "there", 1)),
        detached_at=detached_at,
        detached_by=99,
    )


def test_a_record_round_trips_through_its_file_in_the_documented_form(tmp_path):
    from mixle_nb.cluster.detached import DetachedRecord

    (tmp_path / "security").mkdir()
    record = a_record(tmp_path)
    path = record.write()
    assert path == str(tmp_path / "security" / "mixle-c1.json") == record.path
    assert DetachedRecord.read(path) == record
    with open(path) as f:
        stored = json.load(f)
    # the keys and rank lists %mixle_cluster list and older records use
    assert stored["ranks"] == [[11, "here", 0], [12, "there", 1]]
    assert stored["cluster_id"] == "c1" and stored["group_generation"] == 3 and stored["detached_by"] == 99
    assert stored == record.as_dict()
    assert os.listdir(tmp_path / "security") == ["mixle-c1.json"]  # no temporary left


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n": "2"}, r"n must be"),
        ({"ranks": [[11, "here"]]}, r"ranks must be \[pid, host, gpus\]"),
        ({"extra": 1}, r"unknown \['extra'\]"),
        ({"host": None}, r"host must be"),
    ],
)
def test_a_malformed_record_is_a_value_error(tmp_path, change, message):
    from mixle_nb.cluster.detached import DetachedRecord

    values = {**a_record(tmp_path).as_dict(), **change}
    with pytest.raises(ValueError, match=message):
        DetachedRecord.from_dict(values)
    values = a_record(tmp_path).as_dict()
    del values["store_dir"]
    with pytest.raises(ValueError, match=r"missing \['store_dir'\]"):
        DetachedRecord.from_dict(values)


def test_listing_keeps_live_records_oldest_first_and_removes_stale_ones(tmp_path):
    import subprocess
    import sys

    from mixle_nb.cluster import MixleCluster
    from mixle_nb.cluster.detached import choose, detached_clusters

    (tmp_path / "security").mkdir()
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = a_record(tmp_path, "gone", controller_pid=int(exited.stdout))
    newer, older = a_record(tmp_path, "newer", detached_at=5.0), a_record(tmp_path, "older", detached_at=2.0)
    for record in (stale, newer, older):
        record.write()
    (tmp_path / "security" / "mixle-torn.json").write_text('{"cluster_id": ')

    listed = detached_clusters(str(tmp_path))
    assert listed == [older, newer]
    assert not os.path.exists(stale.path)  # its controller has exited
    assert os.path.exists(tmp_path / "security" / "mixle-torn.json")  # unreadable: skipped, kept
    assert [r["cluster_id"] for r in MixleCluster.list_detached(str(tmp_path))] == ["older", "newer"]
    assert choose(listed, "newer") == newer
    with pytest.raises(LookupError, match="2 detached mixle clusters run"):
        choose(listed, None)
    with pytest.raises(LookupError, match="no detached mixle cluster has id 'x'"):
        choose(listed, "x")


def test_a_running_clusters_record_describes_it_and_reads_back_equal(cluster2, tmp_path):
    from mixle_nb.cluster.detached import DetachedRecord

    record = cluster2.detached_record()
    rows = cluster2.status()
    assert [(r.pid, r.host) for r in record.ranks] == [(row.pid, row.host) for row in rows]
    assert record.n == 2 and record.group_backend == cluster2.group_backend == "gloo"
    assert record.controller_pid in cluster2.pids and record.detached_by == os.getpid()
    assert record.store_dir is not None and os.path.isdir(record.store_dir)
    assert DetachedRecord.from_dict(json.loads(json.dumps(record.as_dict()))) == record

"""Logical shards (issue 30, part 1) in one process: the rows of a file-built handle's shards
gather back in the file's order, lost shards are dealt to the survivors, and elastic=True on
in-memory data is refused with the fix. That the model is bit for bit the same for worlds 3, 2
and 1, whichever rank holds which shard, is checked on a real cluster in test_elastic.py."""

import numpy as np
import pytest

from mixle_nb.parallel.em_handle import TorchRunEncodedData
from mixle_nb.parallel.logical_shards import ShardLayout, rebalance
from mixle_nb.stats import GaussianEstimator, MixtureDistribution, MixtureEstimator
from mixle_nb.stats.gaussian import GaussianDistribution

SHARDS = 6


def problem(tmp_path):
    rng = np.random.default_rng(30)
    x = np.concatenate([rng.normal(-2.0, 1.0, 700), rng.normal(3.0, 0.5, 523)]) * 1e3 + 1e5
    path = str(tmp_path / "x.npy")
    np.save(path, rng.permutation(x))
    start = MixtureDistribution([GaussianDistribution(9.9e4, 4e6), GaussianDistribution(1.02e5, 4e6)], [0.5, 0.5])
    return path, start


def test_shards_gather_back_in_the_files_order(tmp_path):
    path, start = problem(tmp_path)
    with TorchRunEncodedData.from_npy(
        path, MixtureEstimator([GaussianEstimator()] * 2), shards=SHARDS, sub_chunks=2, init_process_group=False
    ) as h:
        scored = h.pysp_shard_map(lambda enc: start.seq_log_density(enc), gather=True)
    rows = np.load(path)
    np.testing.assert_array_equal(scored, start.seq_log_density(start.dist_to_encoder().seq_encode(rows)))


def test_rebalance_deals_lost_shards_to_the_least_loaded_survivor():
    layout, drop, adopt = rebalance([[0, 3], [2, 5]], 6)  # rank 1 of 3 (shards 1, 4) died
    assert layout.owners == (0, 0, 1, 0, 1, 1) and adopt == [[1], [4]] and drop == [[], []]
    layout, drop, adopt = rebalance([[0, 1], [1]], 2)  # shard 1 read twice by a failed recovery
    assert layout.owners == (0, 0) and drop == [[], [1]] and adopt == [[], []]
    assert ShardLayout.dealt(5, 2).slots == 3 and ShardLayout.dealt(5, 2).slot_of(4) == 2


def test_elastic_needs_data_that_can_be_read_again():
    est = MixtureEstimator([GaussianEstimator()] * 2)
    with pytest.raises(ValueError, match=r"elastic=True needs data the ranks can read again.*from_npy"):
        TorchRunEncodedData(np.zeros(4), est, init_process_group=False, elastic=True)
    with pytest.raises(ValueError, match=r"scattered or pushed.*from_files"):
        TorchRunEncodedData.from_shards(np.zeros(4), est, init_process_group=False, elastic=True)


@pytest.mark.cluster
def test_an_elastic_panel_needs_an_elastic_handle(cluster2):
    import rank_functions

    from mixle_nb.cluster import RankError
    from mixle_nb.widgets import EMPanel

    start = MixtureDistribution([GaussianDistribution(-1.0, 1.0), GaussianDistribution(1.0, 1.0)], [0.5, 0.5])
    cluster2.run(rank_functions.build_in_memory_handle, "in_memory")
    try:
        with pytest.raises(RankError, match=r"'in_memory': elastic=True needs data the ranks can read again"):
            EMPanel(cluster2, handle="in_memory", estimator="est", model=start, elastic=True)
    finally:
        cluster2.run(rank_functions.close_named, "in_memory")
    with pytest.raises(ValueError, match="elastic=True needs a cluster"):
        EMPanel(
            None, handle=np.zeros(4), estimator=MixtureEstimator([GaussianEstimator()] * 2), model=start, elastic=True
        )

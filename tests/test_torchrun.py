"""TorchRunEncodedData on real gloo process groups against single-process EM."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from rank_functions import EM_STEPS, em_steps, outcome, params

from mixle_nb.inference import streaming_accumulate
from mixle_nb.parallel.local_launch import run_local
from mixle_nb.stats import (
    CategoricalDistribution,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    seq_encode,
)


def gaussian_problem():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, 300), rng.normal(3, 0.7, 301)])
    start = MixtureDistribution(
        [GaussianDistribution(-1, 1), GaussianDistribution(0.5, 1), GaussianDistribution(2, 1)], [0.3, 0.3, 0.4]
    )
    return x, start


def tied_problem():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 2))
    start = MixtureDistribution(
        [MultivariateGaussianDistribution([0, 0], np.eye(2)), MultivariateGaussianDistribution([1, 1], np.eye(2))],
        [0.5, 0.5],
    )
    estimator = MixtureEstimator(
        [MultivariateGaussianEstimator(2, keys="tied"), MultivariateGaussianEstimator(2, keys="tied")], keys="w"
    )
    return x, start, estimator


def label_problem():
    labels = np.random.default_rng(2).choice(list("abcd"), size=150, p=[0.4, 0.3, 0.2, 0.1])
    start = MixtureDistribution(
        [
            CategoricalDistribution({"a": 0.7, "b": 0.1, "c": 0.1, "d": 0.1}),
            CategoricalDistribution({"a": 0.1, "b": 0.3, "c": 0.3, "d": 0.3}),
        ],
        [0.5, 0.5],
    )
    return labels, start


def _rank_checks(rank, world):
    """Everything one world size is asked, in one process group to keep the suite fast."""
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    x, start = gaussian_problem()
    estimator = start.estimator()
    out = {}
    with TorchRunEncodedData(x, estimator=estimator, fold="allreduce") as h:
        assert dist.is_initialized() and len(h) == len(x)
        out["allreduce"] = em_steps(h, estimator, start)
        out["timings"] = h.last_timings
        from mixle_nb.parallel import exchange

        small_fold_limit, exchange.EXCHANGE_MAX_FLOATS = exchange.EXCHANGE_MAX_FLOATS, 0
        # the large-fold path
        out["allreduce_ring"] = em_steps(TorchRunEncodedData(x, estimator=estimator), estimator, start)
        exchange.EXCHANGE_MAX_FLOATS = small_fold_limit
        out["init"] = params(h.pysp_seq_initialize(estimator, np.random.default_rng(9), 0.5))
        out["density_sum"] = h.pysp_seq_log_density_sum(start)
        out["stream"] = h.pysp_stream_accumulate(estimator, start)  # (count, key-tied value), as mixle's
        gather = TorchRunEncodedData(x, estimator=estimator, fold="gather")
        out["gather"] = em_steps(gather, estimator, start)
        root_only = TorchRunEncodedData(x if rank == 0 else None, model=start, root_only=True, sub_chunks=3)
        out["root_only"] = em_steps(root_only, estimator, start)
        out["root_only_shard"] = root_only.local_count
        xt, tstart, testimator = tied_problem()
        out["tied"] = em_steps(TorchRunEncodedData(xt, estimator=testimator), testimator, tstart)
        labels, lstart = label_problem()
        lhandle = TorchRunEncodedData(labels, model=lstart)
        out["labels"] = em_steps(lhandle, lstart.estimator(), lstart)
        out["labels_fold"] = lhandle.folding.path(lstart.estimator(), {}).path
        tiny = TorchRunEncodedData(x[:3], estimator=estimator)  # fewer points than ranks
        out["tiny"] = em_steps(tiny, estimator, start, steps=2)
        out["tiny_shard"] = tiny.local_count
    out["destroyed_own_group"] = not dist.is_initialized()
    # a new store on a new port: on the old one a fast rank could reach the slow rank's store
    # before that rank has shut it down, and the two would meet in different groups
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
    dist.init_process_group("gloo")
    TorchRunEncodedData(x, estimator=estimator).close()
    out["kept_existing_group"] = dist.is_initialized()
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module", params=[1, 2, 4])
def world_results(request):
    return request.param, run_local(_rank_checks, request.param)


def single_process(x, start, estimator, steps=EM_STEPS):
    return em_steps(seq_encode(x, model=start), estimator, start, steps)


def assert_identical_on_all_ranks(results, key):
    first = results[0][key][0]
    for r in results[1:]:
        assert np.array_equal(r[key][0], first), f"{key}: ranks disagree"


def assert_matches(result, reference, rtol=1e-10):
    np.testing.assert_allclose(result[0], reference[0], rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(result[1], reference[1], rtol=rtol)


@pytest.mark.ranks
def test_em_steps_match_single_process_and_agree_across_ranks(world_results):
    world, results = world_results
    x, start = gaussian_problem()
    reference = single_process(x, start, start.estimator())
    for key in ("allreduce", "allreduce_ring", "gather", "root_only"):
        assert_identical_on_all_ranks(results, key)
        assert_matches(results[0][key], reference)
    # Both fold paths give the same model to 1e-12.
    np.testing.assert_allclose(results[0]["allreduce"][0], results[0]["gather"][0], rtol=1e-12)
    assert sum(r["root_only_shard"] for r in results) == len(x)


@pytest.mark.ranks
def test_key_tied_and_categorical_mixtures(world_results):
    world, results = world_results
    xt, tstart, testimator = tied_problem()
    assert_identical_on_all_ranks(results, "tied")
    assert_matches(results[0]["tied"], single_process(xt, tstart, testimator))
    tied = results[0]["tied"][0]
    np.testing.assert_array_equal(tied[2:8], tied[8:14])  # the two components are one estimate
    labels, lstart = label_problem()
    assert_identical_on_all_ranks(results, "labels")
    assert_matches(results[0]["labels"], single_process(labels, lstart, lstart.estimator()))
    assert results[0]["labels_fold"] == "gather"  # dict statistics cannot be flattened


@pytest.mark.ranks
def test_more_ranks_than_points(world_results):
    world, results = world_results
    x, start = gaussian_problem()
    assert [r["tiny_shard"] for r in results] == [len(range(r, 3, world)) for r in range(world)]
    assert_identical_on_all_ranks(results, "tiny")
    assert_matches(results[0]["tiny"], single_process(x[:3], start, start.estimator(), steps=2))


@pytest.mark.ranks
def test_density_sum_stream_accumulate_and_initialize(world_results):
    world, results = world_results
    x, start = gaussian_problem()
    enc = seq_encode(x, model=start)
    for r in results:
        count, total = r["density_sum"]
        assert count == len(x)
        assert total == pytest.approx(float(np.sum(start.seq_log_density(enc))), rel=1e-12)
        local_count, local_acc = streaming_accumulate(enc, start.estimator(), start)
        assert r["stream"][0] == local_count
        np.testing.assert_allclose(r["stream"][1][0], local_acc.value()[0], rtol=1e-12)
    assert_identical_on_all_ranks(results, "init")
    timings = results[0]["timings"]
    assert timings.shard == len(range(0, len(x), world)) and timings.e_step_s > 0


@pytest.mark.ranks
def test_close_destroys_only_its_own_group(world_results):
    _, results = world_results
    assert all(r["destroyed_own_group"] and r["kept_existing_group"] for r in results)


def _handles_in_a_row(rank, world, rounds):
    """A handle per round, each owning its group; rank 0 leaves each one later than the others."""
    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.stats import GaussianDistribution, GaussianEstimator

    sums = []
    for i in range(rounds):
        with TorchRunEncodedData(np.arange(10.0), estimator=GaussianEstimator()) as h:
            sums.append(h.pysp_seq_log_density_sum(GaussianDistribution(0.0, 1.0)))  # a collective
            if rank == 0:
                time.sleep(0.2 * (i % 3))
    return sums


@pytest.mark.ranks
def test_handles_in_a_row_rendezvous_whoever_leaves_first():
    """torch's env:// rendezvous opens a new store per group on the same port: the rank that left
    first joined the old store and both waited forever (here, and once in CI)."""
    results = run_local(_handles_in_a_row, 2, timeout=60, rounds=8)
    x = np.arange(10.0)
    closed_form = -0.5 * np.sum(x**2) - 5 * np.log(2 * np.pi)
    for count, total in results[0] + results[1]:
        assert count == 10 and abs(total - closed_form) <= 1e-12 * abs(closed_form)


def _initial_model(rank, world):
    from mixle_nb.parallel import TorchRunEncodedData

    x, start = gaussian_problem()
    with TorchRunEncodedData(x, estimator=start.estimator()) as h:
        return params(h.pysp_seq_initialize(start.estimator(), 4, 0.5))


@pytest.mark.ranks
def test_initialize_is_reproducible_for_a_seed_and_world():
    first, second = run_local(_initial_model, 2), run_local(_initial_model, 2)
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[0], first[1])


def test_constructor_errors_name_the_fix(monkeypatch):
    from mixle_nb.parallel import TorchRunEncodedData

    with pytest.raises(ValueError, match="encoder=, model= or estimator="):
        TorchRunEncodedData([1.0, 2.0])
    with pytest.raises(ValueError, match="fold must be one of"):
        TorchRunEncodedData([1.0], estimator=GaussianEstimator(), fold="tree")
    for variable in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node"):
        TorchRunEncodedData([1.0], estimator=GaussianEstimator())


def _fail_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("shard 1 is corrupt")
    return rank


def _hang_on_rank_zero(rank, world):
    if rank == 0:
        time.sleep(60)
    return rank


@pytest.mark.ranks
def test_run_local_reports_every_failed_or_killed_rank():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed:.*ValueError: shard 1 is corrupt"):
        run_local(_fail_on_rank_one, 2)
    with pytest.raises(RuntimeError, match=r"rank 0 produced no result \(killed after the 5 s timeout\)"):
        run_local(_hang_on_rank_zero, 2, timeout=5)


# -- fail together: one rank's error reaches every rank at once, named, without a hang ----------


def _bad_inputs(rank, world):
    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.stats import DiagonalGaussianEstimator, em_step

    x, start = gaussian_problem()
    estimator = start.estimator()
    out = {}
    with TorchRunEncodedData(x, estimator=estimator) as ready:  # forms the group for the rest
        nan_x = x.copy()
        nan_x[3] = np.nan  # observation 3 lives on rank 1 (local index 1)
        out["nan"] = outcome(lambda: TorchRunEncodedData(nan_x, estimator=estimator))
        wide = np.ones((40, 3 if rank == 1 else 2))
        out["dimension"] = outcome(lambda: TorchRunEncodedData(wide, estimator=DiagonalGaussianEstimator()))
        out["no_root_data"] = outcome(
            lambda: TorchRunEncodedData(None if rank == 0 else x, estimator=estimator, root_only=True)
        )
        out["no_data"] = outcome(lambda: TorchRunEncodedData(None if rank == 1 else x, estimator=estimator))
        other = MixtureDistribution(
            [GaussianDistribution(-1, 2), GaussianDistribution(0.5, 1), GaussianDistribution(2, 1)], [0.3, 0.3, 0.4]
        )
        out["model_first_step"] = outcome(lambda: em_step(ready, estimator, other if rank == 1 else start))
        em_step(ready, estimator, start)  # a good step: the fold plan is agreed now
        out["model_later_step"] = outcome(lambda: em_step(ready, estimator, other if rank == 1 else start))
        tuned = start.estimator(pseudo_count=1.0)
        out["estimator"] = outcome(lambda: em_step(ready, tuned if rank == 1 else estimator, start))
        out["density_model"] = outcome(lambda: ready.pysp_seq_log_density_sum(other if rank == 1 else start))
        good_chunks = ready.chunks
        if rank == 1:
            ready.chunks = ["not an encoding"]  # this rank's E-step raises inside the step
        out["e_step"] = outcome(lambda: em_step(ready, estimator, start))
        out["init"] = outcome(lambda: ready.pysp_seq_initialize(estimator, 3, 0.5))
        out["density"] = outcome(lambda: ready.pysp_seq_log_density_sum(start))
        out["stream"] = outcome(lambda: ready.pysp_stream_accumulate(estimator, start))
        ready.chunks = good_chunks
        out["after"] = params(em_step(ready, estimator, start).model)  # the group is still in step
    return out


@pytest.fixture(scope="module")
def bad_input_results():
    return run_local(_bad_inputs, 2)


PROMPT_S = 5.0  # loose: "about a second", far below any group timeout


@pytest.mark.parametrize(
    "case, failing, pattern",
    [
        ("nan", 1, r"observation 1 is NaN or infinite; drop or impute it first"),
        (
            "dimension",
            1,
            r"the data on this rank differs from rank 0's \(an array of 40 observations of shape \(3,\).*"
            r"pass the same full data on every rank",
        ),
        ("no_root_data", 0, r"root_only=True needs the data on the root \(rank 0\), which got None"),
        ("no_data", 1, r"data is None on rank 1: pass the same full data on every rank"),
        ("model_first_step", 1, r"the model on this rank differs from rank 0's.*every rank must pass the same model"),
        ("model_later_step", 1, r"the model on this rank differs from rank 0's"),
        ("estimator", 1, r"the estimator on this rank differs from rank 0's"),
        ("density_model", 1, r"the model on this rank differs from rank 0's"),
        ("e_step", 1, r"."),
        ("init", 1, r"."),
        ("density", 1, r"."),
        ("stream", 1, r"."),
    ],
)
@pytest.mark.ranks
def test_a_failing_rank_makes_every_rank_raise_promptly(bad_input_results, case, failing, pattern):
    import re

    own_type, own_message, own_s = bad_input_results[failing][case]
    peer_type, peer_message, peer_s = bad_input_results[1 - failing][case]
    assert own_type is not None and own_type != "PeerRankError"
    assert re.search(pattern, own_message), own_message
    assert peer_type == "PeerRankError"
    assert f"rank {failing}: {own_message}" in peer_message  # the peer names the rank and its message
    assert own_s < PROMPT_S and peer_s < PROMPT_S


@pytest.mark.ranks
def test_the_group_stays_in_step_after_failures(bad_input_results):
    x, start = gaussian_problem()
    reference = single_process(x, start, start.estimator(), steps=1)
    for r in bad_input_results:
        np.testing.assert_allclose(r["after"], reference[0], rtol=1e-10)


# -- each rank reads its own part: from a .npy file, or from files dealt out to ranks ---------


def _from_disk(rank, world, npy, wide_npy, files):
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData, shards

    dist.init_process_group("gloo")  # one group for all the handles (see _rank_checks on re-forming)
    x, start = gaussian_problem()
    xt, tstart, testimator = tied_problem()
    shards.READ_BLOCK_BYTES = 64  # a few rows per read, so parts span many reads
    out = {}
    with TorchRunEncodedData(x, estimator=start.estimator(), sub_chunks=3) as memory:
        out["memory"] = em_steps(memory, start.estimator(), start)
        out["memory_chunks"] = [len(c) for c in memory.chunks]
    with TorchRunEncodedData.from_npy(npy, estimator=start.estimator(), sub_chunks=3) as disk:
        out["npy"] = em_steps(disk, start.estimator(), start)
        out["npy_chunks"] = [len(c) for c in disk.chunks]
        out["npy_len"] = len(disk)
    out["wide_memory"] = em_steps(TorchRunEncodedData(xt, estimator=testimator), testimator, tstart)
    out["wide_npy"] = em_steps(
        TorchRunEncodedData.from_npy(wide_npy, estimator=testimator, sub_chunks=2), testimator, tstart
    )
    with TorchRunEncodedData.from_files(files, model=start, sub_chunks=2) as dealt:
        out["files"] = em_steps(dealt, start.estimator(), start)
        out["files_shard"] = dealt.local_count
    out["missing"] = outcome(
        lambda: TorchRunEncodedData.from_npy(npy + ".gone" if rank == 1 else npy, estimator=start.estimator())
    )
    dist.destroy_process_group()
    return out


@pytest.mark.ranks
def test_each_rank_reads_its_own_part_from_disk(tmp_path):
    x, start = gaussian_problem()
    xt, tstart, testimator = tied_problem()
    npy, wide_npy = str(tmp_path / "x.npy"), str(tmp_path / "xt.npy")
    np.save(npy, x)
    np.save(wide_npy, xt)
    files = []
    for i, part in enumerate(np.array_split(x, 3)):
        files.append(str(tmp_path / f"part{i}.npy"))
        np.save(files[-1], part)
    results = run_local(_from_disk, 2, npy=npy, wide_npy=wide_npy, files=files)
    for r in results:
        # rows rank::world, in the same parts: the very shards, and so the very model, of the in-memory handle
        assert r["npy_chunks"] == r["memory_chunks"] and r["npy_len"] == len(x)
        assert np.array_equal(r["npy"][0], r["memory"][0]) and r["npy"][1] == r["memory"][1]
        # 2-D: the in-memory shard is a strided view, the file's a contiguous copy; BLAS rounds them apart
        np.testing.assert_allclose(r["wide_npy"][0], r["wide_memory"][0], rtol=1e-12)
    assert_identical_on_all_ranks(results, "files")
    assert [r["files_shard"] for r in results] == [sum(len(np.load(f)) for f in files[rank::2]) for rank in range(2)]
    assert_matches(results[0]["files"], single_process(x, start, start.estimator()))
    own, peer = results[1]["missing"], results[0]["missing"]
    assert own[0] == "FileNotFoundError" and peer[0] == "PeerRankError" and "rank 1: " in peer[1]


def test_a_group_the_handle_creates_carries_its_timeout(monkeypatch):
    """``timeout=`` reaches the group a handle creates from the launcher's variables (default
    300 s, not torch's 30 minutes): the value gloo reports."""
    from datetime import timedelta

    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.parallel.local_launch import free_port
    from mixle_nb.parallel.torch_internals import default_group_timeout

    assert not dist.is_initialized()
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(free_port())),
    ):
        monkeypatch.setenv(name, value)
    for timeout in (45, None):
        options = {} if timeout is None else {"timeout": timeout}
        h = TorchRunEncodedData(np.zeros(3), estimator=GaussianEstimator(), **options)
        try:
            assert default_group_timeout() == timedelta(seconds=timeout or 300)
        finally:
            h.close()
        assert not dist.is_initialized()

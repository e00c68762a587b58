"""The first hour of a new user (issue 31): each place where the README's path broke or misled,
on real gloo groups, the real 2-engine cluster and a real IPython shell. Every bad input must
give one clear error on every rank at once, naming the problem, the rank and the fix."""
from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from rank_functions import outcome

from mixle_nb import cluster as cluster_module
from mixle_nb.inference import choose_k, fit
from mixle_nb.parallel.local_launch import run_local
from mixle_nb.stats import (DiagonalGaussianEstimator, GaussianEstimator, MixtureDistribution, MixtureEstimator,
                            MultivariateGaussianDistribution, MultivariateGaussianEstimator, em_step, seq_encode)
from mixle_nb.widgets import EMPanel

N_2D = 7  # rows of the 2-D file: one file, two ranks


def blobs(n: int = 400, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 1, (n // 2, 2)), rng.normal(3, 1, (n - n // 2, 2))])


def mixture_2d():
    return MixtureEstimator([DiagonalGaussianEstimator() for _ in range(2)])


def model_3d():
    return MixtureDistribution([MultivariateGaussianDistribution(np.full(3, m), np.eye(3)) for m in (-1, 1)],
                               [0.5, 0.5])


def params(model) -> np.ndarray:
    return np.concatenate([model.w] + [np.concatenate([c.mu, c.sigma2]) for c in model.components])


def attempt(fn):
    """``fn()``, or what it raised as text: one item's failure on old code leaves the others to run
    (every item fails on every rank alike, so the group stays in step)."""
    try:
        return fn()
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"


def _handle_checks(rank, world, folder):
    """Every gloo-group question of this file, in one process group to keep the suite fast."""
    from mixle_nb.inference import predict
    from mixle_nb.parallel import TorchRunEncodedData

    out = {}
    x, est = blobs(), mixture_2d()
    # 1: each rank passing its own half (what %mixle_scatter leaves) is refused, even sizes or odd
    with TorchRunEncodedData(x, estimator=est) as full:  # forms the group for every item
        out["halves"] = outcome(lambda: TorchRunEncodedData(x[rank::world], estimator=est).close())
        out["odd_halves"] = outcome(lambda: TorchRunEncodedData(x[:-1][rank::world], estimator=est).close())
        start = fit(None, est, enc_data=full, init="kmeans++", rng=0, max_its=1, out=None).model

        def from_shards():
            with TorchRunEncodedData.from_shards(x[rank::world], estimator=est) as shards:
                return (len(shards), params(em_step(shards, est, start).model), params(em_step(full, est, start).model),
                        predict(shards, start, gather=True), predict(full, start, gather=True))

        out["from_shards"] = attempt(from_shards)
        # 3: a handle is data for fit as for every driver
        out["fit_handle"] = attempt(lambda: params(fit(full, est, init="kmeans++", rng=1, max_its=5, out=None).model))
        out["fit_enc_data"] = params(fit(None, est, enc_data=full, init="kmeans++", rng=1, max_its=5,
                                         out=None).model)
        # 9: progress on the root only, and which K each block of lines belongs to
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            choose_k(full, lambda k: MixtureEstimator([DiagonalGaussianEstimator() for _ in range(k)]), [1, 2],
                     rng=0, max_its=2)
        out["printed"] = printed.getvalue()
        # 5: a model of another dimension: the mismatch, on every rank, before a raw torch error
        out["wrong_dim_step"] = outcome(lambda: em_step(full, MixtureEstimator(
            [MultivariateGaussianEstimator() for _ in range(2)]), model_3d()))
        out["wrong_dim_bic"] = outcome(lambda: full.pysp_seq_log_density_sum(model_3d()))

        # 4: a NaN in the user's row 7 is reported as row 7 (of the file, of the data)
        out["nan_npy"] = outcome(lambda: TorchRunEncodedData.from_npy(os.path.join(folder, "nan.npy"), estimator=est))
        out["nan_memory"] = outcome(lambda: TorchRunEncodedData(np.load(os.path.join(folder, "nan.npy")),
                                                                estimator=est))
        # 8: more components than observations, refused on every rank before any step
        with TorchRunEncodedData(x[:5], estimator=est) as few:
            out["k_over_n"] = outcome(lambda: fit(None, MixtureEstimator([DiagonalGaussianEstimator() for _ in range(10)]),
                                                  enc_data=few, out=None))
    return out


def _empty_rank_checks(rank, world, folder):
    """Item 2 in a group of its own: on the old code the empty rank's errors broke the group."""
    from mixle_nb.parallel import TorchRunEncodedData

    est = mixture_2d()
    path = os.path.join(folder, "one.npy")
    with TorchRunEncodedData.from_files([path], estimator=est) as dealt, \
            TorchRunEncodedData(np.load(path), estimator=est) as memory:
        begin = fit(None, est, enc_data=memory, init="kmeans++", rng=0, max_its=1, out=None).model
        step = attempt(lambda: params(em_step(dealt, est, begin).model))
        fitted = attempt(lambda: params(fit(None, est, enc_data=dealt, init="kmeans++", rng=0, max_its=3,
                                            out=None).model))
        return {"one_file": (step, params(em_step(memory, est, begin).model), fitted)}


def value(result: dict, key: str):
    """An item's value, failing with what it raised instead."""
    found = result[key]
    assert not isinstance(found, str), f"{key}: {found}"
    return found


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("first_hour")
    with_nan = blobs(12, seed=4)
    with_nan[7, 1] = np.nan
    np.save(folder / "nan.npy", with_nan)
    return run_local(_handle_checks, 2, timeout=120, folder=str(folder))


@pytest.fixture(scope="module")
def empty_rank_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("first_hour_empty_rank")
    np.save(folder / "one.npy", blobs(N_2D, seed=3))
    return run_local(_empty_rank_checks, 2, timeout=60, folder=str(folder))


def both_ranks_say(results, key, *phrases):
    for rank, result in enumerate(results):
        kind, message, _ = result[key]
        assert kind is not None, f"rank {rank} raised nothing for {key}"
        for phrase in phrases:
            assert phrase in message, f"rank {rank}, {key}: {phrase!r} not in {message!r}"


def test_1_ranks_passing_different_data_are_told_about_from_shards(rank_results):
    both_ranks_say(rank_results, "halves", "rank 1", "differs from rank 0's", "%mixle_scatter",
                   "TorchRunEncodedData.from_shards")
    both_ranks_say(rank_results, "odd_halves", "rank 1", "%mixle_scatter", "from_shards")


def test_1_from_shards_keeps_each_rank_whole_and_equals_the_full_data_handle(rank_results):
    x = blobs()
    for result in rank_results:
        count, from_shards, full, shard_labels, full_labels = value(result, "from_shards")
        assert count == len(x)
        np.testing.assert_allclose(from_shards, full, rtol=1e-10)
        np.testing.assert_array_equal(shard_labels, full_labels)  # the scattered sequence's order


def test_2_an_empty_rank_of_from_files_is_harmless_for_vector_data(empty_rank_results):
    fits = []
    for result in empty_rank_results:
        dealt, memory, fitted = value(result, "one_file")
        assert not isinstance(dealt, str), f"an EM step: {dealt}"
        assert not isinstance(fitted, str), f"fit from kmeans++: {fitted}"
        np.testing.assert_allclose(dealt, memory, rtol=1e-10)
        assert np.all(np.isfinite(fitted))
        fits.append(fitted)
    np.testing.assert_array_equal(fits[0], fits[1])


def test_3_fit_takes_a_handle_like_every_driver(rank_results):
    for result in rank_results:
        np.testing.assert_array_equal(value(result, "fit_handle"), result["fit_enc_data"])


def test_4_a_nan_is_reported_at_the_users_row_and_file(rank_results, tmp_path):
    both_ranks_say(rank_results, "nan_npy", "row 7 of ", "nan.npy", "NaN or infinite", "rank 1",
                   "drop or impute it")
    both_ranks_say(rank_results, "nan_memory", "row 7 of the data", "rank 1")


def test_5_a_model_of_another_dimension_names_the_mismatch_on_every_rank(rank_results):
    for key in ("wrong_dim_step", "wrong_dim_bic"):
        both_ranks_say(rank_results, key, "dimension 3 but the data has 2 columns", "model of the data's dimension")
        assert "on rank 0" in rank_results[0][key][1] and "on rank 1" in rank_results[1][key][1]


def test_8_more_components_than_observations_is_refused(rank_results):
    both_ranks_say(rank_results, "k_over_n", "10 components needs at least 10 observations", "hold 5",
                   "at most 5 components")
    with pytest.raises(ValueError, match="needs at least 10 observations, and the data hold 5"):
        fit(np.arange(5.0), MixtureEstimator([GaussianEstimator() for _ in range(10)]), out=None)


def test_9_fit_and_choose_k_print_on_the_root_only_and_name_each_k(rank_results):
    root, other = rank_results[0]["printed"], rank_results[1]["printed"]
    assert other == ""
    assert root.startswith("K = 1\nIteration 1:") and "\nK = 2\nIteration 1:" in root


def test_6_a_local_panel_encodes_raw_data_it_is_given():
    x, est = blobs(), mixture_2d()
    panel = EMPanel(handle=x, estimator=est, init="kmeans++")
    panel.step()
    expected = em_step(seq_encode(x, estimator=est), est, panel.start_model).model
    np.testing.assert_allclose(params(panel.model), params(expected), rtol=1e-12)
    assert panel.data_sample.shape == x.shape
    with pytest.raises(ValueError, match="dimension 3 but the data has 2 columns"):
        EMPanel(handle=x, estimator=est, model=model_3d())


def test_9_back_takes_an_integer_as_run_does():
    panel = EMPanel(handle=blobs(), estimator=mixture_2d(), init="kmeans++")
    panel.run(3)
    for bad in (2.0, True):
        with pytest.raises(ValueError, match=r"back\(k\) must be an integer"):
            panel.back(bad)
    assert len(panel.history) == 3
    panel.back(2)
    assert len(panel.history) == 1


def test_10_the_docs_a_user_reaches_for_first():
    from mixle_nb.parallel import TorchRunEncodedData

    assert "fit(h, est" in TorchRunEncodedData.__doc__ and "from_shards" in TorchRunEncodedData.__doc__
    for phrase in ("init=", "kmeans++", "model_selection=True", "Choose K"):
        assert phrase in EMPanel.__doc__
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    assert "rank 0's output only" in readme and "--all" in readme


# -- on the real cluster ---------------------------------------------------------------------

def _build_on_scattered(name: str, use_from_shards: bool):
    """On a rank: a handle on the scattered ``name`` (its error, if any)."""
    from mixle_nb.cluster.rank_side import lookup, rank_namespace
    from mixle_nb.parallel import TorchRunEncodedData

    def build():
        build_ = TorchRunEncodedData.from_shards if use_from_shards else TorchRunEncodedData
        rank_namespace()["fh_h"] = build_(lookup(name), estimator=lookup("fh_est"))

    return outcome(build)


@pytest.fixture(scope="module")
def shell(cluster2):
    ip = start_ipython() or get_ipython()  # start_ipython answers None once another module started it
    ip.run_line_magic("load_ext", "mixle_nb")
    previous = cluster_module.current()
    cluster_module.set_current(cluster2)
    yield ip
    cluster_module.set_current(previous)


def test_1_7_scatter_then_build_on_the_cluster(shell, cluster2, capsys):
    x = blobs()
    shell.user_ns.update(fh_x=x, fh_est=mixture_2d())
    shell.run_line_magic("mixle_push", "fh_est     # the estimator, to every rank")
    shell.run_line_magic("mixle_scatter", "fh_x   # rank r gets fh_x[r::2]")
    shell.run_line_magic("mixle_scatter", "--help")
    assert "from_shards" in capsys.readouterr().out
    refused = cluster2.run(_build_on_scattered, "fh_x", False)
    assert all(kind is not None and "%mixle_scatter" in message and "from_shards" in message
               for kind, message, _ in refused), refused
    assert [kind for kind, _, _ in cluster2.run(_build_on_scattered, "fh_x", True)] == [None, None]
    assert cluster2.run(_handle_length, "fh_h") == [len(x)] * 2
    shell.run_cell_magic("mixle", "--all   # every rank's lines", "print(len(fh_x))")
    assert sorted(capsys.readouterr().out.splitlines()) == ["[rank 0] 200", "[rank 1] 200"]
    shell.run_line_magic("mixle_cluster", "status   # the table")


def _handle_length(name: str) -> int:
    from mixle_nb.cluster.rank_side import lookup

    return len(lookup(name))


def _define_on_rank_one():
    import torch.distributed as dist

    from mixle_nb.cluster.rank_side import rank_namespace

    ns = rank_namespace()
    ns.pop("fh_only_one", None)
    if dist.get_rank() == 1:
        ns["fh_only_one"] = 41


def test_9_pull_names_the_ranks_that_have_it(shell, cluster2):
    cluster2.run(_define_on_rank_one)
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("mixle_pull", "fh_only_one")
    assert str(info.value) == ("'fh_only_one' is not defined on rank 0; ranks [1] have it: pull it with "
                               "%mixle_pull fh_only_one --rank 1")
    assert shell.run_line_magic("mixle_pull", "fh_only_one --rank 1") == 41
    with pytest.raises(UsageError, match="nor on any other rank: push it with %mixle_push fh_never"):
        shell.run_line_magic("mixle_pull", "fh_never")


def test_5_9_panel_on_the_cluster_wrong_model_and_a_handle_gone(shell, cluster2):
    cluster2.push(fh_est=mixture_2d(), fh_x=blobs())
    cluster2.run(_build_on_scattered, "fh_x", False)  # the same full data on every rank: a good handle
    panel = EMPanel(cluster2, handle="fh_h", estimator="fh_est", model=model_3d())
    with pytest.raises(Exception) as info:
        panel.step()
    text = str(info.value)
    assert "dimension 3 but the data has 2 columns" in text and "on rank 0" in text and "rank 1" in text
    assert panel.history == []
    # what a restart leaves: the ranks no longer know the handle, which cannot be pushed
    cluster2.execute_async("del fh_h").result()
    with pytest.raises(NameError) as info:
        panel.step()
    message = str(info.value)
    assert "build it on the ranks again" in message and "panel.attach(handle='fh_h'" in message
    assert "%mixle_push fh_h" not in message


def test_no_stopping_rule_runs_exactly_max_its():
    """For the scikit-learn face (REQUESTS.md): ``delta=None`` with ``tol=0`` or ``None`` never stops
    early, as scikit-learn's ``tol=0``; the iterations are those of EM, step for step."""
    x, est = blobs(), mixture_2d()
    for tol in (0.0, None):
        result = fit(x, est, init="kmeans++", rng=0, delta=None, tol=tol, max_its=40, out=None)
        assert result.n_iter == 40 and not result.converged and len(result.history) == 40
    stopped = fit(x, est, init="kmeans++", rng=0, max_its=40, out=None)
    assert stopped.n_iter < 40 and stopped.converged

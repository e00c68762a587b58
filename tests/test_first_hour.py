"""The first hour of a new user (issue 31): each place where the README's path broke or misled,
on real gloo groups, the real 2-engine cluster and a real IPython shell. Every bad input must
give one clear error on every rank at once, naming the problem, the rank and the fix.

The spawned ranks import this module for ``_handle_checks``: the widgets and IPython, which they
never use (a second of each rank's start), are imported by the tests that use them."""

from __future__ import annotations

import contextlib
import io
import os
import warnings

import numpy as np
import pytest
from rank_functions import outcome, params

from mixle_nb import cluster as cluster_module
from mixle_nb.inference import choose_k, fit
from mixle_nb.parallel.local_launch import run_local
from mixle_nb.stats import (
    DiagonalGaussianEstimator,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    em_step,
    seq_encode,
)


def blobs(n: int = 400, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 1, (n // 2, 2)), rng.normal(3, 1, (n - n // 2, 2))])


def mixture_2d():
    return MixtureEstimator([DiagonalGaussianEstimator() for _ in range(2)])


def model_3d():
    return MixtureDistribution(
        [MultivariateGaussianDistribution(np.full(3, m), np.eye(3)) for m in (-1, 1)], [0.5, 0.5]
    )


def attempt(fn):
    """``fn()``, or what it raised as text: one item's failure on old code leaves the others to run
    (every item fails on every rank alike, so the group stays in step)."""
    try:
        return fn()
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"


def _handle_checks(rank, world, folder):
    """Every gloo-group question of this file, in one process group to keep the suite fast."""
    from mixle_nb.inference import predict, score_samples
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
                return (
                    len(shards),
                    params(em_step(shards, est, start).model),
                    params(em_step(full, est, start).model),
                    predict(shards, start, gather=True),
                    predict(full, start, gather=True),
                )

        out["from_shards"] = attempt(from_shards)

        def from_files():  # 2: three files on two ranks, gathered back file by file
            paths = [os.path.join(folder, f"part{i}.npy") for i in range(3)]
            with TorchRunEncodedData.from_files(paths, estimator=est, sub_chunks=2) as dealt:
                return score_samples(dealt, start, gather=True), score_samples(full, start, gather=True)

        out["files_order"] = attempt(from_files)
        # 3: a handle is data for fit as for every driver
        out["fit_handle"] = attempt(lambda: params(fit(full, est, init="kmeans++", rng=1, max_its=5, out=None).model))
        out["fit_enc_data"] = params(fit(None, est, enc_data=full, init="kmeans++", rng=1, max_its=5, out=None).model)
        # 9: progress on the root only, and which K each block of lines belongs to
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            choose_k(
                full,
                lambda k: MixtureEstimator([DiagonalGaussianEstimator() for _ in range(k)]),
                [1, 2],
                rng=0,
                max_its=2,
            )
        out["printed"] = printed.getvalue()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            fit(full, est, init="kmeans++", rng=0, max_its=2)
            fit(x, est, init="kmeans++", rng=0, max_its=2)  # each rank's own data, under the group
        out["printed_fit"] = printed.getvalue()
        # 5: a model of another dimension: the mismatch, on every rank, before a raw torch error
        out["wrong_dim_step"] = outcome(
            lambda: em_step(full, MixtureEstimator([MultivariateGaussianEstimator() for _ in range(2)]), model_3d())
        )
        out["wrong_dim_bic"] = outcome(lambda: full.pysp_seq_log_density_sum(model_3d()))
        out["wrong_dim_predict"] = outcome(lambda: predict(full, model_3d(), gather=True))

        # 4: a NaN in the user's row 7 is reported as row 7 (of the file, of the data)
        out["nan_npy"] = outcome(lambda: TorchRunEncodedData.from_npy(os.path.join(folder, "nan.npy"), estimator=est))
        out["nan_files"] = outcome(
            lambda: TorchRunEncodedData.from_files(  # nan.npy is rank 1's
                [os.path.join(folder, "clean.npy"), os.path.join(folder, "nan.npy")], estimator=est, sub_chunks=2
            )
        )
        out["nan_memory"] = outcome(
            lambda: TorchRunEncodedData(np.load(os.path.join(folder, "nan.npy")), estimator=est)
        )
        # 8: more components than observations, refused on every rank before any step
        with TorchRunEncodedData(x[:5], estimator=est) as few:
            out["k_over_n"] = outcome(
                lambda: fit(
                    None, MixtureEstimator([DiagonalGaussianEstimator() for _ in range(10)]), enc_data=few, out=None
                )
            )
        out["empty_rank"] = empty_rank_operations(rank, folder)  # 2: defined below
    return out


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
    np.save(folder / "clean.npy", blobs(12, seed=5))
    for i, part in enumerate(np.array_split(blobs(), 3)):
        np.save(folder / f"part{i}.npy", part)
    for family in FAMILIES:
        for source in SOURCES:
            np.save(folder / f"{family}_{source}.npy", family_data(family, source))
    return run_local(_handle_checks, 2, timeout=120, folder=str(folder))


def both_ranks_say(results, key, *phrases):
    for rank, result in enumerate(results):
        kind, message, _ = result[key]
        assert kind is not None, f"rank {rank} raised nothing for {key}"
        for phrase in phrases:
            assert phrase in message, f"rank {rank}, {key}: {phrase!r} not in {message!r}"


@pytest.mark.ranks
def test_1_ranks_passing_different_data_are_told_about_from_shards(rank_results):
    both_ranks_say(
        rank_results, "halves", "rank 1", "differs from rank 0's", "%mixle_scatter", "TorchRunEncodedData.from_shards"
    )
    both_ranks_say(rank_results, "odd_halves", "rank 1", "%mixle_scatter", "from_shards")


@pytest.mark.ranks
def test_1_from_shards_keeps_each_rank_whole_and_equals_the_full_data_handle(rank_results):
    x = blobs()
    for result in rank_results:
        count, from_shards, full, shard_labels, full_labels = value(result, "from_shards")
        assert count == len(x)
        np.testing.assert_allclose(from_shards, full, rtol=1e-10)
        np.testing.assert_array_equal(shard_labels, full_labels)  # the scattered sequence's order


@pytest.mark.ranks
def test_2_from_files_gathers_back_file_by_file(rank_results):
    for result in rank_results:
        dealt, full = value(result, "files_order")
        np.testing.assert_allclose(dealt, full, rtol=1e-10)


@pytest.mark.ranks
def test_3_fit_takes_a_handle_like_every_driver(rank_results):
    for result in rank_results:
        np.testing.assert_array_equal(value(result, "fit_handle"), result["fit_enc_data"])


@pytest.mark.ranks
def test_4_a_nan_is_reported_at_the_users_row_and_file(rank_results, tmp_path):
    both_ranks_say(rank_results, "nan_npy", "row 7 of ", "nan.npy", "NaN or infinite", "rank 1", "drop or impute it")
    both_ranks_say(rank_results, "nan_memory", "row 7 of the data", "rank 1")
    both_ranks_say(rank_results, "nan_files", "row 7 of ", "nan.npy", "NaN or infinite", "rank 1", "drop or impute it")
    assert "clean.npy" not in rank_results[0]["nan_files"][1]


@pytest.mark.ranks
def test_5_a_model_of_another_dimension_names_the_mismatch_on_every_rank(rank_results):
    for key in ("wrong_dim_step", "wrong_dim_bic", "wrong_dim_predict"):
        both_ranks_say(rank_results, key, "dimension 3 but the data has 2 columns", "model of the data's dimension")
        assert "on rank 0" in rank_results[0][key][1] and "on rank 1" in rank_results[1][key][1]


@pytest.mark.ranks
def test_8_more_components_than_observations_is_refused(rank_results):
    both_ranks_say(
        rank_results, "k_over_n", "10 components needs at least 10 observations", "hold 5", "at most 5 components"
    )
    with pytest.raises(ValueError, match="needs at least 10 observations, and the data hold 5"):
        fit(np.arange(5.0), MixtureEstimator([GaussianEstimator() for _ in range(10)]), out=None)


@pytest.mark.ranks
def test_9_fit_and_choose_k_print_on_the_root_only_and_name_each_k(rank_results):
    root, other = rank_results[0]["printed"], rank_results[1]["printed"]
    assert other == ""
    assert root.startswith("K = 1\nIteration 1:") and "\nK = 2\nIteration 1:" in root
    # fit on a handle, then on raw data each rank holds, both under the group: rank 0's lines only
    root, other = rank_results[0]["printed_fit"], rank_results[1]["printed_fit"]
    assert other == ""
    assert [line.split(":")[0] for line in root.splitlines()] == ["Iteration 1", "Iteration 2"] * 2


def test_6_a_local_panel_encodes_raw_data_it_is_given():
    from mixle_nb.widgets import EMPanel

    x, est = blobs(), mixture_2d()
    panel = EMPanel(handle=x, estimator=est, init="kmeans++")
    panel.step()
    expected = em_step(seq_encode(x, estimator=est), est, panel.start_model).model
    np.testing.assert_allclose(params(panel.model), params(expected), rtol=1e-12)
    assert panel.data_sample.shape == x.shape
    with pytest.raises(ValueError, match="dimension 3 but the data has 2 columns"):
        EMPanel(handle=x, estimator=est, model=model_3d())


def test_9_back_takes_an_integer_as_run_does():
    from mixle_nb.widgets import EMPanel

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
    from mixle_nb.widgets import EMPanel

    assert "fit(h, est" in TorchRunEncodedData.__doc__ and "from_shards" in TorchRunEncodedData.__doc__
    for phrase in ("init=", "kmeans++", "model_selection=True", "Choose K"):
        assert phrase in EMPanel.__doc__
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    assert "rank 0's output only" in readme and "--all" in readme


# -- 2: a rank that holds no observation, in every operation and family -----------------------

FAMILIES = ("full", "diagonal", "spherical", "gaussian_1d", "poisson", "categorical")
GAUSSIAN_FAMILIES = FAMILIES[:4]
# from_files: one file on two ranks; from_npy: fewer rows than ranks; from_shards: rank 1's shard empty
SOURCES = ("from_files", "from_npy", "from_shards")
EMPTY_RANK_ITS = 3


def family_data(family: str, source: str) -> np.ndarray:
    """Seven observations (one for from_npy: fewer rows than the two ranks)."""
    x = blobs(7, seed=3)
    data = {
        "poisson": np.array([9, 1, 8, 0, 2, 7, 1]),
        "categorical": np.array([2, 0, 2, 1, 3, 2, 0]),
        "gaussian_1d": x[:, 0].copy(),
    }.get(family, x)
    return data[:1] if source == "from_npy" else data


def family_estimator(family: str, source: str):
    """A mixture of two components of ``family`` (one for the one-row file)."""
    from mixle_nb import stats

    component = {
        "full": MultivariateGaussianEstimator,
        "diagonal": DiagonalGaussianEstimator,
        "spherical": stats.SphericalGaussianEstimator,
        "gaussian_1d": GaussianEstimator,
        "poisson": stats.PoissonEstimator,
        "categorical": stats.CategoricalEstimator,
    }[family]
    return MixtureEstimator([component() for _ in range(1 if source == "from_npy" else 2)])


def family_inits(family: str) -> tuple:
    return ("kmeans++", "random_from_data", "random") if family in GAUSSIAN_FAMILIES else ("random",)


def scoring_model(family: str, source: str):
    """The model every operation but the starts is asked about: two single-process EM steps."""
    return fit(
        family_data(family, source),
        family_estimator(family, source),
        init=family_inits(family)[0],
        rng=0,
        init_p=1.0,
        max_its=2,
        out=None,
    ).model


def numbers(answer) -> np.ndarray:
    """Every number of an answer (a model, an array, a tuple of them), flattened."""
    if hasattr(answer, "dist_to_encoder"):
        return params(answer)
    if isinstance(answer, tuple):
        return np.concatenate([numbers(part) for part in answer])
    return np.ravel(np.asarray(answer, dtype=np.float64))


def empty_rank_operations(rank, folder):
    """Every operation on every family's handle whose rank 1 holds nothing (in the group of
    ``_handle_checks``)."""
    from mixle_nb.inference import bic, initial_model, predict, score_samples
    from mixle_nb.parallel import TorchRunEncodedData
    from mixle_nb.stats import seq_log_density_sum

    out = {}
    for family in FAMILIES:
        for source in SOURCES:
            x, est, model = family_data(family, source), family_estimator(family, source), scoring_model(family, source)
            path = os.path.join(folder, f"{family}_{source}.npy")
            build = {
                "from_files": lambda: TorchRunEncodedData.from_files([path], estimator=est),
                "from_npy": lambda: TorchRunEncodedData.from_npy(path, estimator=est),
                "from_shards": lambda: TorchRunEncodedData.from_shards(
                    x if rank == 0 else x[:0], estimator=est, interleaved=False
                ),
            }[source]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the warning that a rank holds no observations
                handle = build()
            got = {
                "em_step": attempt(lambda: (params((step := em_step(handle, est, model)).model), step.log_density)),
                "log_density_sum": attempt(lambda: seq_log_density_sum(handle, model)),
                "score_samples": attempt(lambda: score_samples(handle, model, gather=True)),
                "predict": attempt(lambda: predict(handle, model, gather=True)),
                "bic": attempt(lambda: bic(handle, model, est)),
            }
            for init in family_inits(family):
                # a Generator, as fit() makes of its seed: the start of the fit below
                got[f"start {init}"] = attempt(lambda: initial_model(handle, est, init, np.random.default_rng(0), 1.0))
                got[f"fit {init}"] = attempt(
                    lambda: params(
                        fit(handle, est, init=init, rng=0, init_p=1.0, max_its=EMPTY_RANK_ITS, out=None).model
                    )
                )
            out[family, source] = got
            handle.close()
    return out


def single_process(family: str, source: str, random_start) -> dict:
    """What one process holding all the data answers to each operation."""
    from mixle_nb.inference import bic, initial_model, predict, score_samples
    from mixle_nb.stats import seq_log_density_sum

    x, est, model = family_data(family, source), family_estimator(family, source), scoring_model(family, source)
    enc = seq_encode(x, estimator=est)
    step = em_step(enc, est, model)
    expected = {
        "em_step": (params(step.model), step.log_density),
        "log_density_sum": seq_log_density_sum(enc, model),
        "score_samples": score_samples(x, model),
        "predict": predict(x, model),
        "bic": bic(x, model, est),
    }
    for init in family_inits(family):
        # every rank's random start is the handle's own draw (it differs from one process's by
        # design); EM from it must be one process's EM from it
        start = random_start if init == "random" else initial_model(enc, est, init, rng=0)
        expected[f"start {init}"] = start
        expected[f"fit {init}"] = params(fit(x, est, init=start, max_its=EMPTY_RANK_ITS, out=None).model)
    return expected


@pytest.mark.ranks
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("family", FAMILIES)
def test_2_an_empty_rank_is_harmless_in_every_operation_and_family(rank_results, family, source):
    """Each answer of the handle whose rank 1 holds no observation is one process's on all the
    data (predictions and scores gathered in the data's order), on both ranks."""
    got = [result["empty_rank"][family, source] for result in rank_results]
    random_start = got[0].get("start random")
    assert not isinstance(random_start, str), f"start random: {random_start}"
    expected = single_process(family, source, random_start)
    for rank, answers in enumerate(got):
        assert answers.keys() == expected.keys()
        for operation, want in expected.items():
            found = answers[operation]
            assert not isinstance(found, str), f"rank {rank}, {operation}: {found}"
            np.testing.assert_allclose(numbers(found), numbers(want), rtol=1e-10, err_msg=f"rank {rank}, {operation}")


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
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or get_ipython()  # start_ipython answers None once another module started it
    ip.run_line_magic("load_ext", "mixle_nb")
    previous = cluster_module.current()
    cluster_module.set_current(cluster2)
    yield ip
    cluster_module.set_current(previous)


@pytest.mark.cluster
def test_1_7_scatter_then_build_on_the_cluster(shell, cluster2, capsys):
    x = blobs()
    shell.user_ns.update(fh_x=x, fh_est=mixture_2d())
    shell.run_line_magic("mixle_push", "fh_est     # the estimator, to every rank")
    shell.run_line_magic("mixle_scatter", "fh_x   # rank r gets fh_x[r::2]")
    shell.run_line_magic("mixle_scatter", "--help")
    assert "from_shards" in capsys.readouterr().out
    refused = cluster2.run(_build_on_scattered, "fh_x", False)
    assert all(
        kind is not None and "%mixle_scatter" in message and "from_shards" in message for kind, message, _ in refused
    ), refused
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


@pytest.mark.cluster
def test_9_pull_names_the_ranks_that_have_it(shell, cluster2):
    from IPython.core.error import UsageError

    cluster2.run(_define_on_rank_one)
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("mixle_pull", "fh_only_one")
    assert str(info.value) == (
        "'fh_only_one' is not defined on rank 0; ranks [1] have it: pull it with %mixle_pull fh_only_one --rank 1"
    )
    assert shell.run_line_magic("mixle_pull", "fh_only_one --rank 1") == 41
    with pytest.raises(UsageError, match="nor on any other rank: push it with %mixle_push fh_never"):
        shell.run_line_magic("mixle_pull", "fh_never")


@pytest.mark.cluster
def test_5_9_panel_on_the_cluster_wrong_model_and_a_handle_gone(shell, cluster2):
    from mixle_nb.widgets import EMPanel

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
    """For the scikit-learn face (issue 27): ``delta=None`` with ``tol=0`` or ``None`` never stops
    early, as scikit-learn's ``tol=0``; the iterations are those of EM, step for step."""
    x, est = blobs(), mixture_2d()
    for tol in (0.0, None):
        result = fit(x, est, init="kmeans++", rng=0, delta=None, tol=tol, max_its=40, out=None)
        assert result.n_iter == 40 and not result.converged and len(result.history) == 40
    stopped = fit(x, est, init="kmeans++", rng=0, max_its=40, out=None)
    assert stopped.n_iter < 40 and stopped.converged

"""GaussianMixture's ``sample_weight`` (a row of integer weight w is w copies of it) and
``partial_fit`` (stepwise EM over chunks reaches the batch fit), against independent
references: the fit of the repeated rows, and the batch fit of all the rows."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn_ranks import CHUNKS, TYPES, blobs, settings, weighted_rank_fits

from mixle_nb.mixture import BayesianGaussianMixture, GaussianMixture
from mixle_nb.parallel import TorchRunEncodedData
from mixle_nb.parallel.local_launch import run_local

RTOL = 1e-8
ATTRIBUTES = ("weights_", "means_", "covariances_", "precisions_cholesky_", "lower_bound_", "lower_bounds_")


def relative_difference(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


@pytest.mark.parametrize("covariance_type", TYPES)
def test_integer_weights_fit_as_the_rows_repeated(covariance_type):
    x = blobs(300, 3, 3)
    w = np.random.default_rng(1).integers(0, 4, size=len(x))
    kwargs = settings(covariance_type, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        weighted = GaussianMixture(**kwargs).fit(x, sample_weight=w)
        repeated = GaussianMixture(**kwargs).fit(np.repeat(x, w, axis=0))
    for name in ATTRIBUTES:
        assert relative_difference(getattr(weighted, name), getattr(repeated, name)) <= RTOL, name
    assert weighted.n_iter_ == repeated.n_iter_ == 12


@pytest.mark.parametrize("init_params", ["k-means++", "random"])
def test_starts_ignore_rows_of_weight_zero(init_params):
    # rows of weight 0 far away would draw a centre or move a mean if the start counted them
    x = blobs(200, 2, 2, seed=4)
    far = np.vstack([x, np.full((50, 2), 1e3)])
    w = np.r_[np.ones(len(x)), np.zeros(50)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm = GaussianMixture(2, init_params=init_params, random_state=0, max_iter=300).fit(far, sample_weight=w)
        reference = GaussianMixture(2, init_params=init_params, random_state=0, max_iter=300).fit(x)
    assert np.abs(gm.means_).max() < 10
    assert gm.score(x) == pytest.approx(reference.score(x), abs=1e-2)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.ones(9), re.escape("sample_weight.shape == (9,), expected (10,)!")),
        (np.r_[np.ones(9), np.nan], "Input sample_weight contains NaN"),
        (np.r_[np.ones(7), -1.0, 1.0, 1.0], re.escape("Negative values in data passed to `sample_weight` (row 7")),
        (np.zeros(10), "Sample weights must contain at least one non-zero number"),
    ],
)
def test_bad_weights_get_scikit_learns_errors_before_any_work(weights, message):
    gm = GaussianMixture(2)
    with pytest.raises(ValueError, match=message):
        gm.fit(blobs(10, 2, 2), sample_weight=weights)
    assert not hasattr(gm, "means_")
    with pytest.raises(ValueError, match=message):
        gm.partial_fit(blobs(10, 2, 2), sample_weight=weights)


def test_partial_fit_passes_over_chunks_reach_the_batch_fit():
    # the size: 40 chunks x 3 passes of N = 2e5, D = 4, K = 5
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 4)) * 3
    x = centres[rng.integers(5, size=200_000)] + rng.normal(size=(200_000, 4))
    batch = GaussianMixture(5, random_state=0, tol=1e-6, max_iter=500).fit(x)
    online = GaussianMixture(5, random_state=0)
    for _ in range(3):
        for chunk in np.array_split(x, 40):
            online.partial_fit(chunk)
    assert online.n_iter_ == 120 and len(online.lower_bounds_) == 120 and not online.converged_
    assert abs(online.score(x) - batch.score(x)) < 1e-3


def test_partial_fit_with_weights_equals_the_rows_repeated_and_refuses_other_features():
    x = blobs(400, 2, 2, seed=2)
    w = np.random.default_rng(3).integers(1, 3, size=len(x))
    kwargs = settings("full", x, k=2)
    weighted, repeated = GaussianMixture(**kwargs), GaussianMixture(**kwargs)
    for part in np.array_split(np.arange(len(x)), 4):
        weighted.partial_fit(x[part], sample_weight=w[part])
        repeated.partial_fit(np.repeat(x[part], w[part], axis=0))
    for name in ATTRIBUTES:
        assert relative_difference(getattr(weighted, name), getattr(repeated, name)) <= RTOL, name
    with pytest.raises(ValueError, match="X has 3 features, but GaussianMixture is expecting 2 features as input"):
        weighted.partial_fit(blobs(10, 3, 2))


def weighted_rows(estimator, x: np.ndarray, w: np.ndarray) -> TorchRunEncodedData:
    """A handle in this process (no group) of rows carrying their weight as a last column."""
    encoder = estimator.weighted_rows_encoder(x.shape[1])
    return TorchRunEncodedData(np.column_stack([x, w]), encoder=encoder, init_process_group=False)


def test_partial_fit_of_weighted_rows_handles_equals_partial_fit_of_weighted_arrays():
    # each chunk's lower bound is the weighted mean log-density on a handle too (it was the
    # unweighted sum over the weighted count)
    x = blobs(300, 3, 3)
    w = np.random.default_rng(1).integers(0, 4, size=len(x)).astype(np.float64)
    arrays, handles = GaussianMixture(**settings("full", x)), GaussianMixture(**settings("full", x))
    for part in np.array_split(np.arange(len(x)), 3):
        arrays.partial_fit(x[part], sample_weight=w[part])
        with weighted_rows(handles, x[part], w[part]) as h:
            handles.partial_fit(h)
    for name in ATTRIBUTES:
        assert relative_difference(getattr(handles, name), getattr(arrays, name)) <= 1e-10, name
    assert handles.n_iter_ == 3


@pytest.mark.parametrize("init_params", ["kmeans", "random", "random_from_data"])
@pytest.mark.parametrize("estimator_class", [GaussianMixture, BayesianGaussianMixture])
def test_a_handle_whose_rows_all_weigh_zero_gets_scikit_learns_error_before_any_work(estimator_class, init_params):
    x = blobs(40, 2, 2)
    for method in ("fit", "partial_fit"):
        estimator = estimator_class(n_components=2, init_params=init_params, random_state=0)
        with weighted_rows(estimator, x, np.zeros(len(x))) as h:
            with pytest.raises(
                ValueError,
                match="Sample weights must contain at least one non-zero number: every one of the handle's 40 rows weighs 0",
            ):
                getattr(estimator, method)(h)
        assert not hasattr(estimator, "means_")


@pytest.mark.ranks
def test_on_two_ranks_weights_beside_the_rows_and_partial_fit_of_handles_equal_one_process(tmp_path):
    # one spawn of 2 ranks for four checks: weighted rows fit as the rows repeated, a bad weight
    # names its rank and row, all-zero weights are refused (a random start), and partial_fit over
    # handles, unweighted and weighted, equals partial_fit over the arrays
    x = blobs(301, 3, 3)
    w = np.random.default_rng(1).integers(0, 4, size=len(x)).astype(np.float64)
    path, bad_path = tmp_path / "weighted.npy", tmp_path / "bad.npy"
    np.save(path, np.column_stack([x, w]))  # each rank reads its own rows, weights included
    bad = np.column_stack([x[:20], np.ones(20)])
    bad[13, -1] = -2.0  # row 13 lies on rank 1 of 2 (rows rank, rank + 2, ...): its row 6
    np.save(bad_path, bad)
    ranks = run_local(weighted_rank_fits, 2, path=str(path), bad_path=str(bad_path))
    for covariance_type, *per_rank in zip(TYPES, *(fits for fits, *_ in ranks)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            repeated = GaussianMixture(**settings(covariance_type, x)).fit(np.repeat(x, w.astype(int), axis=0))
        for fit in per_rank:
            for name in ATTRIBUTES:
                assert relative_difference(fit[name], getattr(repeated, name)) <= RTOL, (covariance_type, name)
            assert fit["n_iter_"] == repeated.n_iter_
    (_, peer, *_), (_, own, *_) = ranks
    assert "rank 1" in peer, peer
    assert "sample weight of row 6 of rank 1's rows is -2.0" in own, own
    online, weighted_online = GaussianMixture(**settings("full", x)), GaussianMixture(**settings("full", x))
    for part in np.array_split(np.arange(len(x)), CHUNKS):
        online.partial_fit(x[part])
        weighted_online.partial_fit(x[part], sample_weight=w[part])
    for _, _, on_ranks, error_of_zeros, weighted_on_ranks in ranks:
        assert "Sample weights must contain at least one non-zero number" in error_of_zeros, error_of_zeros
        for name in ATTRIBUTES:
            assert relative_difference(on_ranks[name], getattr(online, name)) <= RTOL, name
            assert relative_difference(weighted_on_ranks[name], getattr(weighted_online, name)) <= RTOL, name
        assert on_ranks["n_iter_"] == weighted_on_ranks["n_iter_"] == CHUNKS


@pytest.mark.cluster
def test_partial_fit_through_a_cluster_reference_equals_one_process(cluster2):
    # each call folds the chunk's handle on the session cluster's 2 ranks, built there
    x = blobs(301, 3, 3)
    here, there = GaussianMixture(**settings("full", x)), GaussianMixture(**settings("full", x))
    cluster2.push(x_pf=x, est_pf=there.mixture_estimator(3))
    cluster2.execute_async("from mixle_nb.parallel import TorchRunEncodedData").result()
    try:
        for part in np.array_split(np.arange(len(x)), CHUNKS):
            here.partial_fit(x[part])
            code = f"h_pf = TorchRunEncodedData(x_pf[{part[0]}:{part[-1] + 1}], estimator=est_pf)"
            cluster2.execute_async(code).result()
            there.partial_fit(cluster2.handle("h_pf"))
            cluster2.execute_async("h_pf.close(); del h_pf").result()
    finally:
        cluster2.execute_async("del x_pf, est_pf").result()
    for name in ATTRIBUTES:
        assert relative_difference(getattr(there, name), getattr(here, name)) <= 1e-10, name
    assert there.n_iter_ == CHUNKS and not there.converged_

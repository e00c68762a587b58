"""mixle_nb.mixture.BayesianGaussianMixture against scikit-learn's own: its estimator checks,
every fitted attribute from the same start (scikit-learn's own starts, which ours takes on an
array), the lower bound, the errors, and the same fit continued through a handle on 2 and 4
gloo ranks and through a cluster reference; ``sample_weight`` against the fit of the rows
repeated, ``partial_fit`` against the batch fit and, through handles and a cluster reference,
against one process's. scikit-learn's own test modules run in tests/test_bayesian_mixture_suite.py."""

from __future__ import annotations

import copy
import importlib.util
import pickle
import re
import warnings

import numpy as np
import pytest
from bayesian_ranks import (
    ATTRIBUTES,
    INITS,
    PRIOR_TYPES,
    RANK_CASES,
    TYPES,
    blobs,
    continued_rank_fits,
    fit_quietly,
    rank_fits,
    settings,
    warm_started,
    weighted_and_partial_rank_fits,
    weights_problem,
)
from offset_data import offset_problem
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture as ScikitBayesianGaussianMixture
from sklearn.utils.estimator_checks import check_estimator
from test_sklearn_mixture import SAMPLE_WEIGHT_CHECKS

from mixle_nb.mixture import BayesianGaussianMixture
from mixle_nb.parallel import TorchRunEncodedData
from mixle_nb.parallel.local_launch import run_local

RTOL = 1e-8


def relative_difference(a, b) -> float:
    """The largest elementwise relative difference (scikit-learn's tied lower bounds are (1,) arrays)."""
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    assert a.shape == b.shape
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-300))) if a.size else 0.0


def assert_same_fit(ours, reference, rtol: float = RTOL) -> None:
    for name in ATTRIBUTES:
        assert relative_difference(getattr(reference, name), ours[name]) <= rtol, name
    theirs = reference.weight_concentration_
    for mine, their in zip(np.atleast_2d(ours["weight_concentration_"]), np.atleast_2d(theirs)):
        assert relative_difference(their, mine) <= rtol, "weight_concentration_"
    assert ours["n_iter_"] == reference.n_iter_ and ours["converged_"] == reference.converged_


def attributes(estimator) -> dict:
    return {name: getattr(estimator, name) for name in ATTRIBUTES + ("n_iter_", "converged_", "weight_concentration_")}


def test_scikit_learns_estimator_checks_pass_as_for_its_own():
    statuses = {}
    for estimator in (BayesianGaussianMixture(), ScikitBayesianGaussianMixture()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = check_estimator(estimator, on_fail=None)
        statuses[type(estimator).__module__] = {r["check_name"]: r["status"] for r in results}
    ours, theirs = statuses["mixle_nb.mixture.bayesian_mixture"], statuses["sklearn.mixture._bayesian_mixture"]
    # ours takes sample_weight, so check_estimator runs its sample-weight checks too
    assert len(ours) >= 40 and ours.keys() == theirs.keys() | SAMPLE_WEIGHT_CHECKS
    assert all(ours[name] == status for name, status in theirs.items())
    # not passed: check_array_api_input runs only with SCIPY_ARRAY_API=1 (array namespaces), the
    # pandas Series check only with pandas installed (only the bench extra brings it, through anndata)
    not_passed = {name for name, status in ours.items() if status != "passed"}
    pandas = importlib.util.find_spec("pandas") is not None
    assert not_passed == {"check_array_api_input"} | (set() if pandas else {"check_sample_weights_pandas_series"})


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", TYPES)
def test_every_attribute_equals_scikit_learns_from_the_same_start(covariance_type, prior_type):
    for d, init in zip((1, 2, 5, 16), INITS):
        x = blobs(90, d, 3, seed=d)
        options = settings(covariance_type, prior_type, init_params=init, max_iter=8, tol=0)
        ours = fit_quietly(BayesianGaussianMixture(**options), x)
        reference = fit_quietly(ScikitBayesianGaussianMixture(**options), x)
        assert_same_fit(attributes(ours), reference)
        assert np.array_equal(ours.predict(x), reference.predict(x))
        assert relative_difference(reference.predict_proba(x), ours.predict_proba(x)) <= 1e-6
        assert relative_difference(reference.score_samples(x), ours.score_samples(x)) <= RTOL
        bounds = np.asarray(ours.lower_bounds_)
        # variational inference never lowers the bound: a fall is rounding at most
        assert np.all(np.diff(bounds) >= -1e-12 * np.abs(bounds[1:])), np.diff(bounds)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_convergence_n_init_and_warning_agree(covariance_type):
    x = blobs(150, 2, 3, seed=7)
    options = settings(covariance_type, "dirichlet_process", n_init=2, tol=1e-2, max_iter=200)
    ours, reference = BayesianGaussianMixture(**options).fit(x), ScikitBayesianGaussianMixture(**options).fit(x)
    assert ours.converged_ and reference.converged_ and ours.n_iter_ == reference.n_iter_
    assert relative_difference(reference.lower_bound_, ours.lower_bound_) <= RTOL
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        BayesianGaussianMixture(**{**options, "max_iter": 2}).fit(x)


def test_the_extra_components_are_left_empty():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(-5.0, 1.0, (150, 2)), rng.normal(5.0, 1.0, (150, 2))])
    bgm = BayesianGaussianMixture(n_components=6, random_state=0, max_iter=500).fit(x)
    assert np.sum(bgm.weights_ > 0.05) == 2 and bgm.weights_.sum() == pytest.approx(1.0, abs=1e-12)
    sample, labels = bgm.sample(400)
    assert sample.shape == (400, 2) and np.array_equal(np.sort(labels), labels)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_a_fit_does_not_depend_on_where_the_data_sit(covariance_type):
    """The same data at 0 and at 1e6 (shifted exactly): the same posterior, means moved by 1e6.
    scikit-learn's own drifts by 1e-5 to 1e-3 here (its diag and tied sums are raw moments)."""
    problem = offset_problem(1e6, 1.0, 3, separation=8.0)
    near = problem.x - 1e6
    assert np.array_equal(near + 1e6, problem.x)
    options = settings(covariance_type, "dirichlet_process", init_params="random", tol=0, max_iter=30)
    far = fit_quietly(BayesianGaussianMixture(**options), problem.x)
    near = fit_quietly(BayesianGaussianMixture(**options), near)
    assert np.max(np.abs(near.means_ - (far.means_ - 1e6))) <= 1e-7  # the spread is 1
    for name in ("covariances_", "weights_", "mean_precision_", "lower_bound_"):
        assert relative_difference(getattr(near, name), getattr(far, name)) <= 1e-7, name


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(degrees_of_freedom_prior=0.5), "The parameter 'degrees_of_freedom_prior' should be greater than 1"),
        (dict(mean_prior=[0.0, 0.0, 0.0]), "The parameter 'means' should have the shape of"),
        (dict(covariance_prior=np.eye(3)), "The parameter 'full covariance_prior' should have the shape of"),
        (dict(covariance_prior=-np.eye(2)), "'full precision' should be symmetric, positive-definite"),
        (dict(covariance_type="diag", covariance_prior=[1.0, -1.0]), "'diag precision' should be positive"),
        (dict(n_components=40), "Expected n_samples >= n_components"),
        (dict(weight_concentration_prior_type="pitman_yor"), "weight_concentration_prior_type"),
        (dict(mean_precision_prior=0.0), "mean_precision_prior"),
    ],
)
def test_errors_are_scikit_learns(options, message):
    x = blobs(30, 2, 2)
    for estimator_class in (BayesianGaussianMixture, ScikitBayesianGaussianMixture):
        with pytest.raises(ValueError, match=message):
            estimator_class(**options).fit(x)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_integer_weights_fit_as_the_rows_repeated(covariance_type):
    # the same start for both: a posterior fitted (2 iterations from random_from_data) to the
    # unweighted rows, continued with warm_start; the priors come from the weighted rows
    x, w, start, _ = weights_problem(covariance_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        weighted = copy.deepcopy(start).fit(x, sample_weight=w)
        repeated = copy.deepcopy(start).fit(np.repeat(x, w.astype(int), axis=0))
    assert_same_fit(attributes(weighted), repeated)
    for name in ("mean_prior_", "covariance_prior_", "lower_bounds_", "mean_precision_", "degrees_of_freedom_"):
        assert relative_difference(getattr(repeated, name), getattr(weighted, name)) <= RTOL, name
    assert weighted.n_iter_ == 20


def test_the_weighted_kmeans_start_is_the_repeated_rows_start():
    # well-apart clusters: KMeans with the weights and on the repeated rows find one partition
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(centre, 1.0, (40, 2)) for centre in (-8.0, 0.0, 8.0)])
    w = rng.integers(0, 3, size=len(x))
    options = {**settings("full", "dirichlet_distribution", tol=0, max_iter=5), "n_components": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        weighted = BayesianGaussianMixture(**options).fit(x, sample_weight=w)
        repeated = BayesianGaussianMixture(**options).fit(np.repeat(x, w, axis=0))
        labels = BayesianGaussianMixture(**options).fit_predict(x, sample_weight=w)
    assert_same_fit(attributes(weighted), repeated)
    assert np.array_equal(labels, weighted.predict(x))


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.ones(29), re.escape("sample_weight.shape == (29,), expected (30,)!")),
        (np.r_[np.ones(29), np.nan], "Input sample_weight contains NaN"),
        (np.r_[np.ones(7), -1.0, np.ones(22)], re.escape("Negative values in data passed to `sample_weight` (row 7")),
        (np.zeros(30), "Sample weights must contain at least one non-zero number"),
        (np.full(30, 0.01), "The sample weights sum to 0.3"),
    ],
)
def test_bad_weights_get_the_errors_of_gaussian_mixture_before_any_work(weights, message):
    bgm = BayesianGaussianMixture(n_components=2)
    for method in (bgm.fit, bgm.fit_predict, bgm.partial_fit):
        with pytest.raises(ValueError, match=message):
            method(blobs(30, 2, 2), sample_weight=weights)
        assert not hasattr(bgm, "means_")


def test_partial_fit_passes_over_chunks_approach_the_batch_fit():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 2)) * 5.0
    x = centres[rng.integers(3, size=2000)] + rng.normal(size=(2000, 2))
    batch = fit_quietly(BayesianGaussianMixture(n_components=3, random_state=0, tol=1e-6, max_iter=500), x)
    online = BayesianGaussianMixture(n_components=3, random_state=0)
    gaps = []
    for _ in range(3):
        for chunk in np.array_split(x, 10):
            online.partial_fit(chunk)
        gaps.append(online.score(x) - batch.score(x))
    assert online.n_iter_ == 30 and len(online.lower_bounds_) == 30 and not online.converged_
    # the first pass ends 5e-3 below; passes close in (measured: -5.0e-3, -9.4e-4, +5.4e-4: the
    # stream counts every pass's rows, so its posterior is a little narrower than the batch's)
    assert abs(gaps[0]) > abs(gaps[-1]) and abs(gaps[-1]) < 2e-3, gaps
    assert np.abs(np.sort(online.weights_) - np.sort(batch.weights_)).max() < 0.05
    with pytest.raises(ValueError, match="X has 3 features, but BayesianGaussianMixture is expecting 2 features"):
        online.partial_fit(blobs(10, 3, 2))


def test_partial_fit_with_weights_equals_the_rows_repeated():
    x = blobs(200, 2, 2, seed=2)
    w = np.random.default_rng(3).integers(1, 3, size=len(x))
    options = {**settings("diag", "dirichlet_process"), "n_components": 2}
    weighted, repeated = BayesianGaussianMixture(**options), BayesianGaussianMixture(**options)
    first = np.arange(len(x)) < 40
    # the first chunk's start from both: its rows weighted, and repeated, give one k-means partition
    for part in (np.flatnonzero(first), *np.array_split(np.flatnonzero(~first), 3)):
        weighted.partial_fit(x[part], sample_weight=w[part])
        repeated.partial_fit(np.repeat(x[part], w[part], axis=0))
    assert_same_fit(attributes(weighted), repeated)
    assert weighted.n_iter_ == 4


def test_weighted_rows_on_a_handle_fit_and_partial_fit_as_the_rows_repeated():
    # one process (no group): the weights ride as the rows' last column; from one fitted
    # posterior, fit (warm) and partial_fit over two chunks equal those of the repeated rows
    x = blobs(150, 2, 3, seed=6)
    w = np.random.default_rng(4).integers(0, 4, size=len(x)).astype(np.float64)
    start = warm_started(BayesianGaussianMixture, "full", "dirichlet_distribution", x)
    parts = np.array_split(np.arange(len(x)), 2)

    def handle(rows: np.ndarray) -> TorchRunEncodedData:
        encoder = start.weighted_rows_encoder(2)
        return TorchRunEncodedData(np.column_stack([x[rows], w[rows]]), encoder=encoder, init_process_group=False)

    on_handle, repeated = copy.deepcopy(start), copy.deepcopy(start)
    fit_quietly(on_handle, handle(np.arange(len(x))))
    fit_quietly(repeated, np.repeat(x, w.astype(int), axis=0))
    assert_same_fit(attributes(on_handle), repeated)
    for rows in parts:
        on_handle.partial_fit(handle(rows))
        repeated.partial_fit(np.repeat(x[rows], w[rows].astype(int), axis=0))
    assert_same_fit(attributes(on_handle), repeated)
    with pytest.raises(ValueError, match="sample_weight is taken with an array X only"):
        on_handle.fit(handle(parts[0]), sample_weight=w[parts[0]])


@pytest.mark.ranks
def test_a_handle_fit_on_2_ranks_equals_scikit_learns():
    ranks = run_local(rank_fits, 2)
    for (covariance_type, prior_type, d), first, second in zip(RANK_CASES, *ranks):
        for name, value in first.items():  # every rank ends with the same answers
            if name != "own_start" and name != "weight_concentration_":
                assert np.array_equal(np.asarray(value), np.asarray(second[name])), name
        x = blobs(240, d, 3)
        reference = warm_started(ScikitBayesianGaussianMixture, covariance_type, prior_type, x)
        fit_quietly(reference, x)
        assert_same_fit(first, reference)
        assert np.array_equal(first["predict"], reference.predict(x))
        assert relative_difference(reference.score_samples(x), first["score_samples"]) <= RTOL
        own = first["own_start"]  # the handle's own start: the priors are the data's, the bound a fit's
        assert relative_difference(x.mean(axis=0), own["mean_prior_"]) <= 1e-12
        assert relative_difference(reference.covariance_prior_, own["covariance_prior_"]) <= 1e-12
        assert np.isfinite(own["lower_bound_"]) and own["n_iter_"] >= 1


@pytest.mark.ranks
def test_a_handle_fit_on_4_ranks_equals_scikit_learns():
    ranks = run_local(continued_rank_fits, 4)
    for (covariance_type, prior_type, d), *per_rank in zip(RANK_CASES, *ranks):
        x = blobs(240, d, 3)
        reference = fit_quietly(warm_started(ScikitBayesianGaussianMixture, covariance_type, prior_type, x), x)
        for fit in per_rank:
            assert_same_fit(fit, reference)


@pytest.mark.ranks
def test_on_2_ranks_weighted_rows_fit_as_the_rows_repeated_and_partial_fit_equals_one_process():
    # one launch: per covariance type, the warm fit of a handle of the weighted rows against the
    # one-process fit of the rows repeated (the start of the one-process weights test), and
    # partial_fit over handles of the chunks against partial_fit over the chunks' arrays
    ranks = run_local(weighted_and_partial_rank_fits, 2)
    for covariance_type, *per_rank in zip(TYPES, *ranks):
        x, w, start, chunks = weights_problem(covariance_type)
        repeated = fit_quietly(copy.deepcopy(start), np.repeat(x, w.astype(int), axis=0))
        online = warm_started(BayesianGaussianMixture, covariance_type, "dirichlet_process", x)
        for rows in chunks:
            online.partial_fit(x[rows])
        for fits in per_rank:
            assert_same_fit(fits["weighted"], repeated)
            assert fits["weighted"]["n_iter_"] == 20
            assert_same_fit(fits["partial_fit"], online)
            assert fits["partial_fit"]["n_iter_"] == len(chunks)


@pytest.mark.cluster
def test_a_fit_through_a_cluster_reference_equals_the_in_process_fit(cluster2):
    x = blobs(240, 2, 3)
    estimator = warm_started(BayesianGaussianMixture, "full", "dirichlet_process", x)
    local = fit_quietly(pickle.loads(pickle.dumps(estimator)), x)
    cluster2.push(x=x, est=estimator.mixture_estimator(2))
    cluster2.execute_async(
        "from mixle_nb.parallel import TorchRunEncodedData\nh_bgm = TorchRunEncodedData(x, estimator=est)"
    ).result()
    try:
        reference = cluster2.handle("h_bgm")
        fit_quietly(estimator, reference)
        assert_same_fit(attributes(estimator), local, rtol=1e-10)
        assert np.array_equal(estimator.predict(reference), local.predict(x))
        assert relative_difference(local.score_samples(x), estimator.score_samples(reference)) <= 1e-10
        assert estimator.score(reference) == pytest.approx(local.score(x), rel=1e-10)
    finally:
        cluster2.execute_async("h_bgm.close(); del h_bgm, x, est").result()


@pytest.mark.cluster
def test_partial_fit_through_a_cluster_reference_equals_one_process(cluster2):
    # from one fitted posterior, each call folds the chunk's handle, built on the session
    # cluster's 2 ranks, into both the posterior and its running statistics
    x = blobs(240, 2, 3, seed=3)
    there = warm_started(BayesianGaussianMixture, "full", "dirichlet_process", x)
    here = copy.deepcopy(there)
    cluster2.push(x_pf=x, est_pf=there.mixture_estimator(2))
    cluster2.execute_async("from mixle_nb.parallel import TorchRunEncodedData").result()
    chunks = np.array_split(np.arange(len(x)), 3)
    try:
        for part in chunks:
            here.partial_fit(x[part])
            code = f"h_pf = TorchRunEncodedData(x_pf[{part[0]}:{part[-1] + 1}], estimator=est_pf)"
            cluster2.execute_async(code).result()
            there.partial_fit(cluster2.handle("h_pf"))
            cluster2.execute_async("h_pf.close(); del h_pf").result()
    finally:
        cluster2.execute_async("del x_pf, est_pf").result()
    assert_same_fit(attributes(there), here)
    assert there.n_iter_ == len(chunks)

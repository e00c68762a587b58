"""mixle_nb.mixture.BayesianGaussianMixture against scikit-learn's own: its estimator checks,
every fitted attribute from the same start (scikit-learn's own starts, which ours takes on an
array), the lower bound, the errors, and the same fit continued through a handle on 2 gloo
ranks. scikit-learn's own test modules run in tests/test_bayesian_mixture_suite.py."""

from __future__ import annotations

import pickle
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
    fit_quietly,
    rank_fits,
    settings,
    warm_started,
)
from offset_data import offset_problem
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture as ScikitBayesianGaussianMixture
from sklearn.utils.estimator_checks import check_estimator

from mixle_nb.mixture import BayesianGaussianMixture
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
    assert len(ours) >= 40 and ours == theirs
    # the one not passed: check_array_api_input runs only with SCIPY_ARRAY_API=1 (array namespaces)
    assert {name for name, status in ours.items() if status != "passed"} == {"check_array_api_input"}


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

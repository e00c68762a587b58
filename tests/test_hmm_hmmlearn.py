"""mixle_nb.hmm against hmmlearn 0.3.3 from the same start: every fitted attribute within
1e-8, both implementations, every covariance type, categorical and Poisson; and the inference
calls (score, score_samples, decode, predict_proba) on the fitted models."""

from __future__ import annotations

import numpy as np
import pytest

hmmlearn_hmm = pytest.importorskip("hmmlearn.hmm")

from mixle_nb import hmm as ours  # noqa: E402

K = 3
LENGTHS = [40, 7, 1, 25, 60, 17]
STARTPROB = np.array([0.5, 0.3, 0.2])
TRANSMAT = np.array([[0.8, 0.15, 0.05], [0.1, 0.7, 0.2], [0.2, 0.1, 0.7]])
TOL = 1e-8


def gaussian_data(d: int = 2) -> np.ndarray:
    rng = np.random.default_rng(0)
    centres = np.array([[0.0] * d, [3.0] * d, [-2.0] + [1.0] * (d - 1)])
    states = rng.integers(0, K, size=sum(LENGTHS))
    return centres[states] + rng.normal(size=(len(states), d)) * np.array([1.0, 0.5][:d] + [0.8] * (d - 2))


def gaussian_start(cls, covariance_type: str, implementation: str, d: int = 2, **kw):
    kw = {"init_params": "", "n_iter": 6, "tol": -np.inf, **kw}
    m = cls(K, covariance_type=covariance_type, implementation=implementation, **kw)
    m.startprob_, m.transmat_ = STARTPROB.copy(), TRANSMAT.copy()
    m.means_ = np.array([[0.5] * d, [2.0] * d, [-1.0] * d])
    covars = {
        "spherical": np.array([1.0, 1.5, 0.7]),
        "diag": np.array([[1.0] * d, [1.5] * d, [0.7] * d]),
        "full": np.stack([np.eye(d) * s + 0.1 for s in (1.0, 1.5, 0.7)]),
        "tied": np.eye(d) * 1.2 + 0.2,
    }[covariance_type]
    m.covars_ = covars
    return m


def assert_attributes(a, b, names):
    for name in names:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0, atol=TOL, err_msg=name)


def assert_inference(a, b, X, lengths):
    assert a.score(X, lengths) == pytest.approx(b.score(X, lengths), rel=1e-12)
    la, pa = a.score_samples(X, lengths)
    lb, pb = b.score_samples(X, lengths)
    assert la == pytest.approx(lb, rel=1e-12)
    np.testing.assert_allclose(pa, pb, atol=1e-10)
    np.testing.assert_allclose(a.predict_proba(X, lengths), pb, atol=1e-10)
    for algorithm in ("viterbi", "map"):
        va, sa = a.decode(X, lengths, algorithm=algorithm)
        vb, sb = b.decode(X, lengths, algorithm=algorithm)
        assert va == pytest.approx(vb, rel=1e-12)
        np.testing.assert_array_equal(sa, sb)
    np.testing.assert_array_equal(a.predict(X, lengths), b.predict(X, lengths))


@pytest.mark.parametrize("implementation", ["log", "scaling"])
@pytest.mark.parametrize("covariance_type", ["spherical", "diag", "full", "tied"])
def test_gaussian_fit_equals_hmmlearn(covariance_type, implementation):
    X = gaussian_data()
    a = gaussian_start(ours.GaussianHMM, covariance_type, implementation).fit(X, LENGTHS)
    b = gaussian_start(hmmlearn_hmm.GaussianHMM, covariance_type, implementation).fit(X, LENGTHS)
    assert_attributes(a, b, ["startprob_", "transmat_", "means_"])
    # hmmlearn keeps spherical variances as (n_components, n_features) after a fit (and its
    # covars_ getter then returns n_components * n_features matrices); ours stay (n_components,)
    theirs = b._covars_[:, 0] if covariance_type == "spherical" else b._covars_
    np.testing.assert_allclose(a._covars_, theirs, rtol=0, atol=TOL)
    if covariance_type != "spherical":
        np.testing.assert_allclose(a.covars_, b.covars_, rtol=0, atol=TOL)
    np.testing.assert_allclose(list(a.monitor_.history), list(b.monitor_.history), rtol=1e-12)
    assert a.monitor_.iter == b.monitor_.iter == 6
    assert_inference(a, b, X, LENGTHS)
    assert a.bic(X, LENGTHS) == pytest.approx(b.bic(X, LENGTHS), rel=1e-12)
    assert a.aic(X, LENGTHS) == pytest.approx(b.aic(X, LENGTHS), rel=1e-12)


@pytest.mark.parametrize("params", ["st", "m", "tmc", "stm"])
def test_gaussian_params_subset_and_priors(params):
    X = gaussian_data()
    priors = dict(means_prior=0.5, means_weight=2.0, covars_prior=0.3, covars_weight=4.0, transmat_prior=1.5)
    for covariance_type in ("diag", "full"):
        a = gaussian_start(ours.GaussianHMM, covariance_type, "scaling", params=params, **priors).fit(X, LENGTHS)
        b = gaussian_start(hmmlearn_hmm.GaussianHMM, covariance_type, "scaling", params=params, **priors)
        b.fit(X, LENGTHS)
        assert_attributes(a, b, ["startprob_", "transmat_", "means_", "_covars_"])


def test_covariances_without_means_use_the_occupancy():
    """``params`` with ``c`` but not ``m``: hmmlearn 0.3.3 then accumulates neither the
    occupancy nor the first moments (``_needs_sufficient_statistics_for_mean``), so its
    covariances are (prior + raw second moments) / max(covars_weight - 1, 1e-5), not a
    covariance; ours are the weighted scatter about the fixed means, as with ``m``."""
    X = gaussian_data()
    a = gaussian_start(ours.GaussianHMM, "diag", "scaling", params="c", covars_prior=0.0, n_iter=1)
    means = a.means_.copy()
    a.fit(X, LENGTHS)
    posteriors = gaussian_start(ours.GaussianHMM, "diag", "scaling").predict_proba(X, LENGTHS)
    expected = np.stack(
        [(posteriors[:, k, None] * (X - means[k]) ** 2).sum(0) / posteriors[:, k].sum() for k in range(K)]
    )
    np.testing.assert_allclose(a._covars_, expected, rtol=1e-10)
    np.testing.assert_array_equal(a.means_, means)


def test_gaussian_one_feature_far_from_the_origin():
    """The centred sums: data at 1e6 with unit spread fit as hmmlearn's do near 0."""
    X = gaussian_data(1)
    near = gaussian_start(ours.GaussianHMM, "diag", "scaling", d=1).fit(X, LENGTHS)
    far = gaussian_start(ours.GaussianHMM, "diag", "scaling", d=1)
    far.means_ = far.means_ + 1e6
    far.fit(X + 1e6, LENGTHS)
    np.testing.assert_allclose(far.means_ - 1e6, near.means_, atol=1e-8)
    np.testing.assert_allclose(far._covars_, near._covars_, rtol=1e-8)


def categorical_start(cls, implementation, **kw):
    m = cls(K, init_params="", n_iter=6, tol=-np.inf, implementation=implementation, **kw)
    m.startprob_, m.transmat_ = STARTPROB.copy(), TRANSMAT.copy()
    m.emissionprob_ = np.array([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25]])
    return m


@pytest.mark.parametrize("implementation", ["log", "scaling"])
def test_categorical_fit_equals_hmmlearn(implementation):
    X = np.random.default_rng(1).choice(4, size=(sum(LENGTHS), 1), p=[0.4, 0.3, 0.2, 0.1])
    a = categorical_start(ours.CategoricalHMM, implementation).fit(X, LENGTHS)
    b = categorical_start(hmmlearn_hmm.CategoricalHMM, implementation).fit(X, LENGTHS)
    assert_attributes(a, b, ["startprob_", "transmat_", "emissionprob_"])
    assert a.n_features == b.n_features == 4
    np.testing.assert_allclose(list(a.monitor_.history), list(b.monitor_.history), rtol=1e-12)
    assert_inference(a, b, X, LENGTHS)
    assert a.bic(X, LENGTHS) == pytest.approx(b.bic(X, LENGTHS), rel=1e-12)


def poisson_start(cls, implementation, **kw):
    m = cls(K, init_params="", n_iter=6, tol=-np.inf, implementation=implementation, **kw)
    m.startprob_, m.transmat_ = STARTPROB.copy(), TRANSMAT.copy()
    m.lambdas_ = np.array([[1.0, 4.0], [3.0, 2.0], [6.0, 0.5]])
    return m


@pytest.mark.parametrize("implementation", ["log", "scaling"])
def test_poisson_fit_equals_hmmlearn(implementation):
    rng = np.random.default_rng(2)
    X = rng.poisson([[2.0, 3.0]], size=(sum(LENGTHS), 2)) + rng.poisson(3.0, size=(sum(LENGTHS), 1))
    a = poisson_start(ours.PoissonHMM, implementation).fit(X, LENGTHS)
    b = poisson_start(hmmlearn_hmm.PoissonHMM, implementation).fit(X, LENGTHS)
    assert_attributes(a, b, ["startprob_", "transmat_", "lambdas_"])
    np.testing.assert_allclose(list(a.monitor_.history), list(b.monitor_.history), rtol=1e-12)
    assert_inference(a, b, X, LENGTHS)
    a2 = poisson_start(ours.PoissonHMM, implementation, lambdas_prior=2.0, lambdas_weight=0.5).fit(X, LENGTHS)
    b2 = poisson_start(hmmlearn_hmm.PoissonHMM, implementation, lambdas_prior=2.0, lambdas_weight=0.5).fit(X, LENGTHS)
    assert_attributes(a2, b2, ["lambdas_"])


def test_log_density_never_falls():
    X = gaussian_data()
    for covariance_type in ("spherical", "diag", "full", "tied"):
        m = ours.GaussianHMM(K, covariance_type=covariance_type, n_iter=30, tol=-np.inf, random_state=3)
        history = np.array(m.fit(X, LENGTHS).monitor_.history)
        assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:])), covariance_type


def test_sample_matches_hmmlearn_draw_for_draw():
    a = gaussian_start(ours.GaussianHMM, "full", "log")
    b = gaussian_start(hmmlearn_hmm.GaussianHMM, "full", "log")
    xa, sa = a.sample(50, random_state=7)
    xb, sb = b.sample(50, random_state=7)
    np.testing.assert_array_equal(sa, sb)
    np.testing.assert_allclose(xa, xb, atol=1e-12)

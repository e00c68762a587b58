"""The EM core against independent references: scikit-learn, closed forms, one-pass sums."""

from __future__ import annotations

import io
import itertools
import warnings

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture

from mixle_nb.inference import FitError, optimize, streaming_accumulate
from mixle_nb.stats import (
    CategoricalDistribution,
    DegenerateComponentError,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    PoissonDistribution,
    PoissonEstimator,
    accumulate,
    mixture,
    seq_encode,
    seq_estimate,
    seq_initialize,
    seq_log_density_sum,
)


def mixture_problem(n: int, dim: int, k: int, seed: int = 0):
    """Data from a well-separated K-mixture and a perturbed start (every component has data)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 4, size=(k, dim))
    labels = rng.integers(k, size=n)
    scales = rng.uniform(0.5, 1.5, size=(k, dim))
    x = means[labels] + scales[labels] * rng.standard_normal((n, dim))
    start_means = means + rng.normal(0, 0.5, size=means.shape)
    return x, start_means


def sklearn_fit(x2d, start_means, iterations):
    k, d = start_means.shape
    gm = GaussianMixture(
        n_components=k,
        covariance_type="full",
        max_iter=iterations,
        tol=0.0,
        reg_covar=0.0,
        weights_init=np.full(k, 1.0 / k),
        means_init=start_means,
        precisions_init=np.tile(np.eye(d), (k, 1, 1)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not converge": we ask for exactly `iterations`
        gm.fit(x2d)
    return gm


@pytest.mark.parametrize("dim", [1, 8])
def test_em_matches_sklearn_after_20_iterations(dim):
    k, iterations = 8, 20
    x, start_means = mixture_problem(4000, dim, k)
    if dim == 1:
        data = x[:, 0]
        comps = [GaussianDistribution(m[0], 1.0) for m in start_means]
        estimator = MixtureEstimator([GaussianEstimator(reg_covar=0.0) for _ in range(k)])  # as sklearn_fit
    else:
        data = x
        comps = [MultivariateGaussianDistribution(m, np.eye(dim)) for m in start_means]
        estimator = MixtureEstimator([MultivariateGaussianEstimator(dim, reg_covar=0.0) for _ in range(k)])
    model = MixtureDistribution(comps, np.full(k, 1.0 / k))
    enc = seq_encode(data, model=model)
    for _ in range(iterations):
        model = seq_estimate(enc, estimator, model)

    gm = sklearn_fit(x, start_means, iterations)
    np.testing.assert_allclose(model.seq_log_density(enc), gm.score_samples(x), rtol=1e-8)
    np.testing.assert_allclose(model.w, gm.weights_, rtol=1e-6, atol=1e-12)
    if dim == 1:
        mu = np.array([[c.mu] for c in model.components])
        cov = np.array([[[c.sigma2]] for c in model.components])
    else:
        mu = np.array([c.mu for c in model.components])
        cov = np.array([c.covar for c in model.components])
    np.testing.assert_allclose(mu, gm.means_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(cov, gm.covariances_, rtol=1e-6, atol=1e-9)


def _fitted_cases():
    rng = np.random.default_rng(3)
    x1 = rng.normal(size=300)
    xd = rng.normal(size=(300, 3))
    counts = rng.poisson(4.0, size=300)
    labels = rng.choice(["a", "b", "c", "d"], size=300)
    return [
        (x1, MixtureDistribution([GaussianDistribution(-1, 1), GaussianDistribution(1, 2)], [0.4, 0.6])),
        (
            xd,
            MixtureDistribution(
                [
                    DiagonalGaussianDistribution([0, 0, 0], [1, 2, 1]),
                    DiagonalGaussianDistribution([1, 1, 1], [1, 1, 1]),
                ],
                [0.5, 0.5],
            ),
        ),
        (
            xd,
            MixtureDistribution(
                [
                    MultivariateGaussianDistribution(np.zeros(3), np.eye(3)),
                    MultivariateGaussianDistribution(np.ones(3), 2 * np.eye(3)),
                ],
                [0.3, 0.7],
            ),
        ),
        (counts, MixtureDistribution([PoissonDistribution(2.0), PoissonDistribution(6.0)], [0.5, 0.5])),
        (
            labels,
            MixtureDistribution(
                [
                    CategoricalDistribution({"a": 0.7, "b": 0.1, "c": 0.1, "d": 0.1}),
                    CategoricalDistribution({"a": 0.1, "b": 0.3, "c": 0.3, "d": 0.3}),
                ],
                [0.5, 0.5],
            ),
        ),
    ]


def _assert_values_equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        np.testing.assert_allclose(list(a.values()), [b[key] for key in a], rtol=1e-12)
    elif isinstance(a, (tuple, list)):
        for u, v in zip(a, b):
            _assert_values_equal(u, v)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("data,model", _fitted_cases())
def test_chunked_statistics_combine_in_any_order_to_one_pass(data, model):
    estimator = model.estimator()
    whole = accumulate([seq_encode(data, model=model)], estimator, model)
    bounds = [0, 37, 120, 121, 300]
    chunks = [seq_encode(data[a:b], model=model) for a, b in zip(bounds, bounds[1:])]
    values = [accumulate([c], estimator, model).accumulator.value() for c in chunks]
    for order in itertools.islice(itertools.permutations(range(len(values))), 0, 24, 5):
        acc = estimator.accumulator_factory().make()
        for i in order:
            acc.combine(values[i])
        _assert_values_equal(acc.value(), whole.accumulator.value())
    assert whole.log_density == pytest.approx(
        float(np.sum(model.seq_log_density(chunks[0])))
        + sum(float(np.sum(model.seq_log_density(c))) for c in chunks[1:]),
        rel=1e-12,
    )


def test_sampling_round_trips_through_fitting():
    n = 200_000
    cases = [
        (GaussianDistribution(1.5, 4.0), lambda m: [m.mu, m.sigma2]),
        (DiagonalGaussianDistribution([1.0, -2.0], [0.5, 3.0]), lambda m: [*m.mu, *m.sigma2]),
        (MultivariateGaussianDistribution([1.0, -1.0], [[2.0, 0.6], [0.6, 1.0]]), lambda m: [*m.mu, *m.covar.ravel()]),
        (PoissonDistribution(3.5), lambda m: [m.lam]),
        (CategoricalDistribution({"x": 0.2, "y": 0.5, "z": 0.3}), lambda m: [m.pmap[c] for c in "xyz"]),
    ]
    for truth, params in cases:
        x = truth.sampler(7).sample(n)
        fitted = optimize(x, truth.estimator(), max_its=1, out=None, rng=0)
        # Sampling error of these moments at n = 200,000 is below 0.01 for every parameter here.
        np.testing.assert_allclose(params(fitted), params(truth), atol=0.03)


def test_mixture_sample_then_fit_recovers_components():
    truth = MixtureDistribution([GaussianDistribution(-4.0, 1.0), GaussianDistribution(3.0, 0.25)], [0.3, 0.7])
    x = truth.sampler(11).sample(100_000)
    start = MixtureDistribution([GaussianDistribution(-1.0, 1.0), GaussianDistribution(1.0, 1.0)], [0.5, 0.5])
    fitted = optimize(x, truth.estimator(), prev_estimate=start, max_its=200, out=None)
    np.testing.assert_allclose(fitted.w, truth.w, atol=0.01)
    np.testing.assert_allclose([c.mu for c in fitted.components], [-4.0, 3.0], atol=0.02)
    np.testing.assert_allclose([c.sigma2 for c in fitted.components], [1.0, 0.25], atol=0.02)


def test_optimize_reports_one_line_per_iteration_and_never_decreases():
    x, start_means = mixture_problem(2000, 1, 3, seed=5)
    start = MixtureDistribution([GaussianDistribution(m[0], 1.0) for m in start_means], [1 / 3] * 3)
    out, records = io.StringIO(), []
    optimize(x[:, 0], start.estimator(), prev_estimate=start, max_its=15, delta=0.0, out=out, on_step=records.append)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(records) and lines[0].startswith("Iteration 1: log-density")
    log_densities = [r.log_density for r in records]
    assert np.all(np.diff(log_densities) >= -1e-9)
    # The one-pass objective equals a separate evaluation of the model the step started from.
    enc = seq_encode(x[:, 0], model=start)
    assert records[0].log_density == pytest.approx(seq_log_density_sum(enc, start)[1], rel=1e-12)
    assert records[1].log_density == pytest.approx(seq_log_density_sum(enc, records[0].model)[1], rel=1e-12)


def test_optimize_stops_when_gain_falls_below_delta():
    x = np.random.default_rng(0).normal(size=500)
    records = []
    optimize(x, GaussianEstimator(), max_its=50, delta=1e-6, out=None, rng=0, on_step=records.append)
    assert len(records) < 50  # a single Gaussian converges after one M-step


def test_one_stopping_rule_delta_and_tol_name_one_tolerance():
    """Issue 36, item 6: ``delta`` (mixle's name) and ``tol`` (scikit-learn's) set one tolerance
    on the magnitude of the gain per observation. A real fall is never taken for convergence
    (before, ``gain < delta`` stopped at the first fall and called it converged), and two
    different tolerances are refused."""
    from mixle_nb.inference import DEFAULT_DELTA, fit, stopping_tolerance

    x = np.random.default_rng(0).normal(size=500)

    class Alternating(GaussianEstimator):  # not EM: the model flips between a good and a bad mean
        def __init__(self):
            super().__init__()
            self.calls = 0

        def estimate(self, nobs, value):
            self.calls += 1
            return GaussianDistribution(3.0 if self.calls % 2 else 0.0, 1.0)

    for stop in ({"delta": 1e-6}, {"tol": 1e-6}):
        result = fit(x, Alternating(), init=GaussianDistribution(0.0, 1.0), max_its=6, out=None, **stop)
        assert [r.gain < 0 for r in result.history[1:]] == [True, False, True, False, True]
        assert (result.n_iter, result.converged) == (6, False)

    assert stopping_tolerance(DEFAULT_DELTA, None) == DEFAULT_DELTA == 1e-9
    assert stopping_tolerance(1e-4, None) == 1e-4 and stopping_tolerance(None, None) is None
    assert stopping_tolerance(DEFAULT_DELTA, 1e-3) == stopping_tolerance(0.0, 1e-3) == 1e-3
    assert stopping_tolerance(None, 0.0) == 0.0 and stopping_tolerance(1e-3, 1e-3) == 1e-3
    with pytest.raises(ValueError, match=r"delta=1e-05 and tol=0.001 name one tolerance"):
        fit(x, GaussianEstimator(), delta=1e-5, tol=1e-3, out=None)
    with pytest.raises(ValueError, match="delta must be >= 0"):
        optimize(x, GaussianEstimator(), delta=-1.0, out=None)
    with pytest.raises(ValueError, match="out must be a text stream, None or ROOT_STDOUT; got 'log.txt'"):
        fit(x, GaussianEstimator(), out="log.txt")


def test_failed_iteration_keeps_the_last_good_model():
    x = np.random.default_rng(0).normal(size=200)
    start = GaussianDistribution(0.0, 1.0)

    class FailsOnThirdEstimate(GaussianEstimator):
        calls = 0

        def estimate(self, nobs, value):
            type(self).calls += 1
            if type(self).calls == 3:
                raise RuntimeError("disk full")
            return super().estimate(nobs, value)

    with pytest.raises(FitError, match="iteration 3 failed") as info:
        optimize(x, FailsOnThirdEstimate(), prev_estimate=start, max_its=10, delta=0.0, out=None)
    assert len(info.value.history) == 2
    assert info.value.model is info.value.history[-1].model


def test_keys_tie_component_statistics():
    x = np.random.default_rng(1).normal(2.0, 3.0, size=1000)
    estimator = MixtureEstimator(
        [GaussianEstimator(reg_covar=0.0, keys="shared"), GaussianEstimator(reg_covar=0.0, keys="shared")]
    )
    start = MixtureDistribution([GaussianDistribution(0, 1), GaussianDistribution(4, 1)], [0.5, 0.5])
    model = seq_estimate(seq_encode(x, model=start), estimator, start)
    a, b = model.components
    assert (a.mu, a.sigma2) == (b.mu, b.sigma2)
    # Tied components pool all of the data: their estimate is the single-Gaussian fit.
    assert a.mu == pytest.approx(x.mean(), rel=1e-12)
    assert a.sigma2 == pytest.approx(x.var(), rel=1e-10)


def test_streaming_accumulate_ties_keys_once():
    x = np.random.default_rng(1).normal(2.0, 3.0, size=1000)
    estimator = MixtureEstimator(
        [GaussianEstimator(reg_covar=0.0, keys="shared"), GaussianEstimator(reg_covar=0.0, keys="shared")]
    )
    start = MixtureDistribution([GaussianDistribution(0, 1), GaussianDistribution(4, 1)], [0.5, 0.5])
    count, acc = streaming_accumulate(seq_encode(x, model=start), estimator, start)
    model = estimator.estimate(count, acc.value())
    assert model.components[0].mu == pytest.approx(x.mean(), rel=1e-12)
    assert model.components[0].sigma2 == pytest.approx(x.var(), rel=1e-10)


def test_emptied_component_raises_naming_the_component():  # was: silently N(0, 1); issue 26
    x = np.random.default_rng(2).normal(size=500)
    start = MixtureDistribution([GaussianDistribution(0, 1), GaussianDistribution(1e6, 1)], [0.5, 0.5])
    with pytest.raises(DegenerateComponentError, match=r"component 1 of 2 received no weight in the M-step.*Fix: "):
        seq_estimate(seq_encode(x, model=start), start.estimator(), start)
    three = np.array([3.0, 6.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # [n, n·c, S1, S2]: three points at c = (2, 3)
    mvn = MultivariateGaussianEstimator(2).estimate(3.0, three)
    np.testing.assert_allclose(mvn.mu, [2.0, 3.0])
    np.testing.assert_allclose(mvn.covar, 1e-6 * np.eye(2), rtol=1e-12)  # collapsed: reg_covar, as scikit-learn


def test_seq_initialize_is_reproducible_and_uses_a_fraction():
    x = np.random.default_rng(0).normal(size=1000)
    est = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    enc = seq_encode(x, estimator=est)
    a = seq_initialize(enc, est, np.random.default_rng(5), 0.5)
    b = seq_initialize(enc, est, 5, 0.5)
    assert repr(a) == repr(b)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        seq_initialize(enc, est, 0, 0.0)


def test_streaming_accumulate_returns_count_and_statistics():
    x = np.random.default_rng(0).normal(size=300)
    model = GaussianDistribution(0.0, 1.0)
    count, acc = streaming_accumulate(seq_encode(x, model=model), GaussianEstimator(), model)
    assert count == 300
    # [n, n·c, Σ(x - c), Σ(x - c)²] about the model's mean c = 0
    np.testing.assert_allclose(acc.value(), [300, 0.0, x.sum(), (x * x).sum()], rtol=1e-12)


def test_single_observation_protocol_matches_sequence_protocol():
    model = MixtureDistribution([GaussianDistribution(0, 1), GaussianDistribution(2, 1)], [0.5, 0.5])
    assert model.log_density(0.3) == pytest.approx(
        float(
            np.logaddexp(
                np.log(0.5) - 0.5 * np.log(2 * np.pi) - 0.5 * 0.09, np.log(0.5) - 0.5 * np.log(2 * np.pi) - 0.5 * 1.7**2
            )
        ),
        rel=1e-12,
    )
    acc = model.estimator().accumulator_factory().make()
    acc.update(0.3, 2.0, model)
    counts, _ = acc.value()
    assert counts.sum() == pytest.approx(2.0)


def _closed_form_log_density(x, mu, covar):
    diff = x - mu
    _, log_det = np.linalg.slogdet(covar)
    maha = np.einsum("nd,nd->n", diff, np.linalg.solve(covar, diff.T).T)
    return -0.5 * (len(mu) * np.log(2 * np.pi) + log_det + maha)


@pytest.mark.parametrize("dim", [3, 20])
def test_multivariate_log_density_and_em_step_match_closed_form(dim, monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.normal(2.0, 1.5, size=(3000, dim))
    factors = rng.normal(size=(2, dim, dim))
    covars = factors @ factors.transpose(0, 2, 1) / dim + np.eye(dim)
    means = rng.normal(size=(2, dim))
    model = MixtureDistribution([MultivariateGaussianDistribution(m, c) for m, c in zip(means, covars)], [0.3, 0.7])
    monkeypatch.setattr(mixture, "BLOCK_ELEMENTS", 1024)  # several E-step blocks
    enc = seq_encode(x, model=model)

    log_joint = np.stack([np.log(w) + _closed_form_log_density(x, m, c) for w, m, c in zip(model.w, means, covars)], 1)
    expected = np.logaddexp(log_joint[:, 0], log_joint[:, 1])
    np.testing.assert_allclose(model.seq_log_density(enc), expected, rtol=1e-10)

    resp = np.exp(log_joint - expected[:, None])  # closed-form M-step from exact responsibilities
    fitted = seq_estimate(enc, MixtureEstimator([MultivariateGaussianEstimator(dim, reg_covar=0.0)] * 2), model)
    for k, component in enumerate(fitted.components):
        mu = resp[:, k] @ x / resp[:, k].sum()
        covar = (resp[:, k, None] * (x - mu)).T @ (x - mu) / resp[:, k].sum()
        np.testing.assert_allclose(component.mu, mu, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(component.covar, covar, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("offset,rtol", [(0.0, 1e-12), (1e4, 1e-12), (1e9, 1e-12)])  # centred: stats/frame.py
def test_diagonal_log_density_matches_closed_form(offset, rtol, monkeypatch):
    rng = np.random.default_rng(6)
    x = offset + rng.normal(size=(3000, 3))
    means, sigma2 = offset + rng.normal(size=(2, 3)), rng.uniform(0.5, 2.0, size=(2, 3))
    model = MixtureDistribution([DiagonalGaussianDistribution(m, v) for m, v in zip(means, sigma2)], [0.4, 0.6])
    monkeypatch.setattr(mixture, "BLOCK_ELEMENTS", 1024)  # several E-step blocks
    log_joint = np.stack(
        [
            np.log(w) - 0.5 * (np.log(2 * np.pi * v) + (x - m) ** 2 / v).sum(1)
            for w, m, v in zip(model.w, means, sigma2)
        ],
        1,
    )
    np.testing.assert_allclose(
        model.seq_log_density(seq_encode(x, model=model)), np.logaddexp(log_joint[:, 0], log_joint[:, 1]), rtol=rtol
    )


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: seq_encode([1.0, float("nan")], estimator=GaussianEstimator()), "NaN or infinite"),
        (lambda: seq_encode([1.0, float("inf")], estimator=GaussianEstimator()), "NaN or infinite"),
        (lambda: seq_encode([], estimator=GaussianEstimator()), "no observations"),
        (lambda: seq_encode(np.ones((4, 3)), estimator=GaussianEstimator()), "1-D sequence"),
        (lambda: seq_encode(np.ones((4, 3)), estimator=MultivariateGaussianEstimator(2)), "dimension 2"),
        (lambda: seq_encode(np.ones(4), estimator=DiagonalGaussianEstimator()), r"\(N, D\) array"),
        (lambda: seq_encode([1, -2], estimator=PoissonEstimator()), "non-negative integers"),
        (lambda: seq_encode([1, 2.5], estimator=PoissonEstimator()), "non-negative integers"),
        (lambda: MixtureDistribution([], []), "at least one component"),
        (lambda: MixtureEstimator([]), "at least one component"),
        (lambda: MixtureDistribution([GaussianDistribution(0, 1)] * 2, [0.5, 0.6]), "sum to 1"),
        (lambda: GaussianDistribution(0.0, -1.0), "sigma2"),
        (lambda: MultivariateGaussianDistribution([0, 0], [[1, 2], [2, 1]]), "not positive definite"),
        (lambda: CategoricalDistribution({"a": 0.5}), "sum to 1"),
        (lambda: PoissonDistribution(0.0), "lam must be"),
        (lambda: optimize([1.0, 2.0], GaussianEstimator(), max_its=0), "max_its"),
    ],
)
def test_bad_input_raises_before_any_work(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_covariance_key_matches_sklearn_tied_covariance():
    k, dim, iterations = 4, 3, 20
    x, start_means = mixture_problem(3000, dim, k, seed=4)
    estimator = MixtureEstimator(
        [MultivariateGaussianEstimator(dim, reg_covar=0.0, covariance_key="shared") for _ in range(k)]
    )
    model = MixtureDistribution(
        [MultivariateGaussianDistribution(m, np.eye(dim)) for m in start_means], np.full(k, 1.0 / k)
    )
    enc = seq_encode(x, model=model)
    for _ in range(iterations):
        model = seq_estimate(enc, estimator, model)
    gm = GaussianMixture(
        n_components=k,
        covariance_type="tied",
        max_iter=iterations,
        tol=0.0,
        reg_covar=0.0,
        weights_init=np.full(k, 1.0 / k),
        means_init=start_means,
        precisions_init=np.eye(dim),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(x)
    np.testing.assert_allclose(model.seq_log_density(enc), gm.score_samples(x), rtol=1e-8)
    for component in model.components:
        np.testing.assert_allclose(component.covar, gm.covariances_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose([c.mu for c in model.components], gm.means_, rtol=1e-6, atol=1e-9)


def test_variance_key_pools_the_within_component_variance():
    x = np.random.default_rng(6).normal(size=500) * 2
    start = MixtureDistribution([GaussianDistribution(-1, 1), GaussianDistribution(2, 3)], [0.5, 0.5])
    estimator = MixtureEstimator(
        [GaussianEstimator(reg_covar=0.0, variance_key="v"), GaussianEstimator(reg_covar=0.0, variance_key="v")]
    )
    model = seq_estimate(seq_encode(x, model=start), estimator, start)
    resp = start.seq_posterior(seq_encode(x, model=start))
    n = resp.sum(axis=0)
    means = resp.T @ x / n
    pooled = sum((resp[:, j] * (x - means[j]) ** 2).sum() for j in range(2)) / len(x)  # closed form
    np.testing.assert_allclose([c.mu for c in model.components], means, rtol=1e-12)
    for component in model.components:
        assert component.sigma2 == pytest.approx(pooled, rel=1e-10)


def test_read_only_data_and_weights_are_accepted_without_warnings():
    rng = np.random.default_rng(7)
    x, w, counts = rng.normal(size=(200, 3)), rng.random(200), rng.poisson(3.0, size=200).astype(float)
    for array in (x, w, counts):
        array.flags.writeable = False
    cases = [
        (x, MultivariateGaussianEstimator(3)),
        (x, DiagonalGaussianEstimator(3)),
        (x[:, 0], MixtureEstimator([GaussianEstimator(), GaussianEstimator()])),
        (counts, PoissonEstimator()),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a tensor over a read-only array
        for data, estimator in cases:
            enc = seq_encode(data, estimator=estimator)
            model = seq_initialize(enc, estimator, rng=1, p=1.0)
            estimator.accumulator_factory().make().seq_update(enc, w, model)

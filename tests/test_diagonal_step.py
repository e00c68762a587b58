"""The wide diagonal/spherical EM step (``mixle_nb.stats.diagonal_step``, issue 39): log-densities
and sums as matrix products about the mean of the means, each component beyond the shared frame's
reach about its own mean. It must give the general (torch, per-component) step's model and
objective within ``AGREE``, with and without sample weights, over several blocks, with components
on both sides of the reach, at an offset far from the origin; what it does not take falls to the
other steps; and a fit takes it and stays equal to scikit-learn's."""

from __future__ import annotations

import numpy as np
import pytest
from local_steps import assert_raises_as_the_general_step, general_step

from mixle_nb.mixture.translation import mixture_estimator, model_from_parameters
from mixle_nb.stats import diagonal_step, seq_encode
from mixle_nb.stats.diagonal_step import diagonal_em_step
from mixle_nb.stats.frame import with_weights

AGREE = 1e-11  # relative, against the general step (measured: below 1e-13)
KINDS = ("diag", "spherical")


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    """Small problems take the step (its size rule is the benchmarks' business)."""
    monkeypatch.setattr(diagonal_step, "MIN_WIDTH", 1)
    monkeypatch.setattr(diagonal_step, "MIN_WORK", 1)


def _problem(kind: str, d: int, weighted: bool, offset: float = 0.0, k: int = 5, n: int = 500, tight: bool = False):
    rng = np.random.default_rng([d, k, n, int(weighted), int(tight)])
    centres = rng.normal(0, 4, (k, d))
    x = offset + centres[rng.integers(k, size=n)] + rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, d)
    estimator = mixture_estimator(kind, k, d, 1e-6)
    enc = seq_encode(x, estimator=estimator)
    if weighted:
        weights = rng.random(n) * 2.0
        weights[::7] = 0.0
        enc = with_weights(enc, weights)
    variances = rng.uniform(1.0, 3.0, (k, d)) if kind == "diag" else rng.uniform(1.0, 3.0, k)
    means = offset + centres + 0.3
    if tight:  # component 0 narrow, on a point: beyond the shared frame's reach of the mean of the means
        variances[0], means[0] = 1e-5, x[1]  # x[0] weighs 0 when weighted
    model = model_from_parameters(kind, rng.dirichlet(np.ones(k)), means, variances)
    return enc, estimator, model


def _assert_same_mixture(a, b) -> None:
    np.testing.assert_allclose(a.w, b.w, rtol=AGREE)
    for ca, cb in zip(a.components, b.components):
        np.testing.assert_allclose(ca.mu, cb.mu, rtol=AGREE, atol=AGREE * np.abs(cb.mu).max())
        np.testing.assert_allclose(ca.sigma2, cb.sigma2, rtol=AGREE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("tight", [False, True])
def test_diagonal_step_equals_the_general_step(kind, weighted, tight, monkeypatch):
    monkeypatch.setattr(diagonal_step, "BLOCK_ELEMENTS", 64 * (2 * 6 + 5))  # 8 blocks of 64 rows
    enc, estimator, model = _problem(kind, 6, weighted, tight=tight)
    if tight:
        mu = np.array([c.mu for c in model.components])
        sigma2 = np.array([c.sigma2 for c in model.components])
        reach = np.sqrt(np.sum((mu - mu.mean(axis=0)) ** 2 / sigma2, axis=1))
        assert reach[0] > diagonal_step.SHARED_FRAME_REACH > reach[1:].max()  # both sides of it
    new, count, objective = diagonal_em_step(enc, estimator, model)
    reference, reference_count, reference_objective = general_step(enc, estimator, model)
    assert count == pytest.approx(reference_count, rel=AGREE)
    assert objective == pytest.approx(reference_objective, rel=AGREE)
    _assert_same_mixture(new, reference)


@pytest.mark.parametrize("kind", KINDS)
def test_diagonal_step_far_from_the_origin(kind):
    """Data at 1e8: the sums are about the mean of the means, so the offset costs nothing."""
    offset = 1e8
    new, _, _ = diagonal_em_step(*_problem(kind, 3, False, offset=offset))
    at_zero, _, _ = diagonal_em_step(*_problem(kind, 3, False))
    for ca, cz in zip(new.components, at_zero.components):
        np.testing.assert_allclose(ca.mu - offset, cz.mu, atol=1e-7)  # x rounded at 1e8: 1.5e-8
        np.testing.assert_allclose(ca.sigma2, cz.sigma2, rtol=1e-7)


def test_what_the_diagonal_step_leaves_to_the_others(monkeypatch):
    enc, estimator, model = _problem("diag", 3, False)
    assert diagonal_em_step(enc, mixture_estimator("full", 5, 3, 1e-6), model) is None  # full estimator
    assert diagonal_em_step(enc, mixture_estimator("tied", 5, 3, 1e-6), model) is None  # tied covariance
    monkeypatch.setattr(diagonal_step, "MIN_WIDTH", 16)  # D·K = 15
    assert diagonal_em_step(enc, estimator, model) is None
    monkeypatch.setattr(diagonal_step, "MIN_WIDTH", 1)
    monkeypatch.setattr(diagonal_step, "MIN_WORK", 500 * 15 + 1)
    assert diagonal_em_step(enc, estimator, model) is None


def test_diagonal_step_degenerate_component_raises_as_the_general_one():
    enc, estimator, model = _problem("diag", 2, False)
    mu = np.array([c.mu for c in model.components])
    mu[4] += 1e4  # far from every point: it takes no weight
    far = model_from_parameters("diag", model.w, mu, np.ones((5, 2)))
    assert_raises_as_the_general_step(diagonal_em_step, enc, estimator, far)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # 30 iterations, both alike
def test_a_wide_fit_takes_the_step_and_equals_scikit_learn(kind, monkeypatch):
    """A fit at the step's default size rule (N·D·K past ``MIN_WORK``) steps through it, from
    scikit-learn's start to scikit-learn's answer (1e-8)."""
    from sklearn.mixture import GaussianMixture as Reference

    from mixle_nb.mixture import GaussianMixture

    monkeypatch.undo()  # the module's own size rule
    rng = np.random.default_rng(11)
    n, d, k = 1200, 32, 16
    x = rng.normal(0, 3, (k, d))[rng.integers(k, size=n)] + rng.normal(size=(n, d))
    assert n * d * k >= diagonal_step.MIN_WORK and d * k >= diagonal_step.MIN_WIDTH
    precisions = np.full((k, d) if kind == "diag" else k, 0.25)
    start = dict(weights_init=np.full(k, 1 / k), means_init=x[:k], precisions_init=precisions)
    taken = []
    sums = diagonal_step._sums
    monkeypatch.setattr(diagonal_step, "_sums", lambda *a: taken.append(1) or sums(*a))
    ours = GaussianMixture(k, covariance_type=kind, max_iter=30, tol=1e-8, **start).fit(x)
    reference = Reference(k, covariance_type=kind, max_iter=30, tol=1e-8, **start).fit(x)
    assert len(taken) >= ours.n_iter_ > 2
    assert ours.n_iter_ == reference.n_iter_
    for name in ("weights_", "means_", "covariances_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(reference, name), atol=1e-8, err_msg=name)
    np.testing.assert_allclose(ours.lower_bound_, reference.lower_bound_, rtol=1e-10)

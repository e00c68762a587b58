"""The component-by-component full-covariance EM step (``mixle_nb.stats.full_step``, issue 39):
numpy's products, each component's own differences. It must give the general step's model and
objective within ``AGREE``, with and without sample weights, over several blocks, far from the
origin and with components far apart; it leaves to the general step what it does not take; and
a fit takes it and stays equal to scikit-learn's."""

from __future__ import annotations

import numpy as np
import pytest
from local_steps import assert_raises_as_the_general_step, general_step

from mixle_nb.mixture.translation import mixture_estimator, model_from_parameters
from mixle_nb.stats import full_step, seq_encode
from mixle_nb.stats.frame import with_weights
from mixle_nb.stats.full_step import full_em_step

AGREE = 1e-11  # relative, against the general step (measured: below 1e-13)


def _problem(weighted: bool, offset: float = 0.0, spread: float = 4.0, d: int = 24, k: int = 4, n: int = 400):
    rng = np.random.default_rng([d, k, n, int(weighted)])
    centres = rng.normal(0, spread, (k, d))
    x = offset + centres[rng.integers(k, size=n)] + rng.normal(size=(n, d))
    estimator = mixture_estimator("full", k, d, 1e-6)
    enc = seq_encode(x, estimator=estimator)
    if weighted:
        weights = rng.random(n) * 2.0
        weights[::7] = 0.0
        enc = with_weights(enc, weights)
    a = rng.normal(size=(k, d, d))
    covariances = a @ a.transpose(0, 2, 1) / d + np.eye(d)
    model = model_from_parameters("full", rng.dirichlet(np.ones(k)), offset + centres + 0.3, covariances)
    return enc, estimator, model


def _assert_same_step(taken, reference) -> None:
    (new, count, objective), (expected, expected_count, expected_objective) = taken, reference
    assert count == pytest.approx(expected_count, rel=AGREE)
    assert objective == pytest.approx(expected_objective, rel=AGREE)
    np.testing.assert_allclose(new.w, expected.w, rtol=AGREE)
    for ca, cb in zip(new.components, expected.components):
        np.testing.assert_allclose(ca.mu, cb.mu, rtol=AGREE, atol=AGREE * np.abs(cb.mu).max())
        np.testing.assert_allclose(ca.covar, cb.covar, rtol=AGREE, atol=AGREE * np.abs(cb.covar).max())


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("offset, spread", [(0.0, 4.0), (1e8, 4.0), (0.0, 1e5)])
def test_full_step_equals_the_general_step(weighted, offset, spread, monkeypatch):
    """At the origin, at 1e8 (the differences are to each mean) and with means 1e5 spreads apart."""
    monkeypatch.setattr(full_step, "BLOCK_ELEMENTS", 64 * (24 + 4))  # ~6 blocks of 64 rows
    enc, estimator, model = _problem(weighted, offset, spread)
    taken = full_em_step(enc, estimator, model)
    assert taken is not None
    _assert_same_step(taken, general_step(enc, estimator, model))


def test_what_the_full_step_leaves_to_the_general_one():
    enc, estimator, model = _problem(False)
    assert full_em_step(*_problem(False, n=full_step.MAX_ELEMENTS // 4 + 1)) is None  # rows x components
    assert full_em_step(*_problem(False, k=full_step.MAX_COMPONENTS + 1, n=100)) is None  # many: batched
    assert full_em_step(*_problem(False, d=full_step.MIN_DIM)) is None  # narrow: the general step's products
    assert full_em_step(enc, mixture_estimator("tied", 4, 24, 1e-6), model) is None  # tied: tied_step's
    assert full_em_step(enc, mixture_estimator("diag", 4, 24, 1e-6), model) is None


def test_full_step_degenerate_component_raises_as_the_general_one():
    enc, estimator, model = _problem(False, d=20)
    mu = [c.mu for c in model.components]
    mu[3] = mu[3] + 1e4  # far from every point: no weight
    far = model_from_parameters("full", model.w, mu, [c.covar for c in model.components])
    assert_raises_as_the_general_step(full_em_step, enc, estimator, far)


def test_a_full_fit_takes_the_step_and_equals_scikit_learn(monkeypatch):
    """N = 160, D = 64, K = 8: beyond the compiled pass, within this step; from scikit-learn's start
    to scikit-learn's answer (1e-8)."""
    from sklearn.mixture import GaussianMixture as Reference

    from mixle_nb.mixture import GaussianMixture

    rng = np.random.default_rng(5)
    d, k, n = 64, 8, 160  # N·K·D² beyond the compiled pass
    x = rng.normal(0, 3, (k, d))[np.arange(n) % k] + rng.normal(size=(n, d))
    start = dict(weights_init=np.full(k, 1 / k), means_init=x[:k], precisions_init=np.stack([np.eye(d) / 4] * k))
    taken = []
    sums = full_step._sums
    monkeypatch.setattr(full_step, "_sums", lambda *a: taken.append(1) or sums(*a))
    ours = GaussianMixture(k, max_iter=20, tol=1e-8, reg_covar=1e-3, **start).fit(x)
    reference = Reference(k, max_iter=20, tol=1e-8, reg_covar=1e-3, **start).fit(x)
    assert len(taken) >= ours.n_iter_ >= 2
    assert ours.n_iter_ == reference.n_iter_
    np.testing.assert_allclose(ours.weights_, reference.weights_, atol=1e-8)
    np.testing.assert_allclose(ours.means_, reference.means_, atol=1e-8)
    np.testing.assert_allclose(ours.covariances_, reference.covariances_, atol=1e-8)
    np.testing.assert_allclose(ours.lower_bound_, reference.lower_bound_, rtol=1e-10)

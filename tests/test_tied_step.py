"""The tied full-covariance EM step (``mixle_nb.stats.tied_step``, issue 39): points whitened once,
not once per component. It must give the general (torch, per-component) step's model and
objective within ``AGREE``, with and without sample weights, over several blocks, at an offset
far from the origin, and beyond the shared frame's reach (means 1e5 whitened units apart); a start
whose components differ falls to the general step; and a fit takes it and stays equal to
scikit-learn's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from local_steps import assert_raises_as_the_general_step, general_step

from mixle_nb.mixture.translation import mixture_estimator, model_from_parameters
from mixle_nb.stats import em_step, seq_encode, tied_step
from mixle_nb.stats.frame import with_weights
from mixle_nb.stats.tied_step import tied_em_step

AGREE = 1e-11  # relative, against the general step (measured: below 1e-13)


def _problem(d: int, weighted: bool, offset: float = 0.0, k: int = 4, n: int = 600, spread: float = 4.0):
    rng = np.random.default_rng([d, k, n, int(weighted)])
    centres = rng.normal(0, spread, (k, d))
    x = offset + centres[rng.integers(k, size=n)] + rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
    estimator = mixture_estimator("tied", k, d, 1e-6)
    enc = seq_encode(x, estimator=estimator)
    if weighted:
        weights = rng.random(n) * 2.0
        weights[::7] = 0.0
        enc = with_weights(enc, weights)
    a = rng.normal(size=(d, d))
    model = model_from_parameters("tied", rng.dirichlet(np.ones(k)), offset + centres + 0.3, a @ a.T + d * np.eye(d))
    return enc, estimator, model


def _assert_same_mixture(a, b) -> None:
    np.testing.assert_allclose(a.w, b.w, rtol=AGREE)
    for ca, cb in zip(a.components, b.components):
        np.testing.assert_allclose(ca.mu, cb.mu, rtol=AGREE, atol=AGREE * np.abs(cb.mu).max())
        np.testing.assert_allclose(ca.covar, cb.covar, rtol=AGREE, atol=AGREE * np.abs(cb.covar).max())


@pytest.mark.parametrize("d", [2, 5, 24])  # D = 1 tied is a diagonal family
@pytest.mark.parametrize("weighted", [False, True])
def test_tied_step_equals_the_general_step(d, weighted, monkeypatch):
    monkeypatch.setattr(tied_step, "BLOCK_ELEMENTS", 64 * (d + 4))  # ~10 blocks of 64 rows
    enc, estimator, model = _problem(d, weighted)
    new, count, objective = tied_em_step(enc, estimator, model)
    reference, reference_count, reference_objective = general_step(enc, estimator, model)
    assert count == pytest.approx(reference_count, rel=AGREE)
    assert objective == pytest.approx(reference_objective, rel=AGREE)
    _assert_same_mixture(new, reference)
    again = tied_em_step(enc, estimator, new)  # the M-step's copies of the covariance count as one
    assert again is not None
    _assert_same_mixture(again[0], general_step(enc, estimator, new)[0])


def test_tied_step_far_from_the_origin():
    """Data at 1e8: the sums are about the mean of the means, so the offset costs nothing."""
    offset = 1e8
    new, _, objective = tied_em_step(*_problem(3, False, offset=offset))
    at_zero, _, objective_at_zero = tied_em_step(*_problem(3, False))
    assert objective == pytest.approx(objective_at_zero, abs=1e-6 * 600)  # x rounded at 1e8: 1.5e-8
    for ca, cz in zip(new.components, at_zero.components):
        np.testing.assert_allclose(ca.mu - offset, cz.mu, atol=1e-7)
        np.testing.assert_allclose(ca.covar, cz.covar, atol=1e-7 * np.abs(cz.covar).max())


def test_what_the_tied_step_leaves_to_the_general_one():
    enc, estimator, model = _problem(3, False)
    untied = model_from_parameters(
        "full", model.w, [c.mu for c in model.components], [c.covar * (1 + i) for i, c in enumerate(model.components)]
    )
    assert tied_em_step(enc, estimator, untied) is None  # a start whose covariances differ
    assert em_step(enc, estimator, untied).log_density == pytest.approx(
        general_step(enc, estimator, untied)[2], rel=AGREE
    )
    assert tied_em_step(enc, mixture_estimator("full", 4, 3, 1e-6), model) is None  # untied estimator


@pytest.mark.parametrize("weighted", [False, True])
def test_tied_step_beyond_the_shared_frames_reach(weighted, monkeypatch):
    """Means 1e5 whitened units from their mean: the second way (subtracted distances, the scatter
    about the new means in two sums of squares), over several blocks, equal to the general step;
    beyond ``SEPARATED_MAX_ELEMENTS`` the general step's."""
    monkeypatch.setattr(tied_step, "BLOCK_ELEMENTS", 64 * 3 * 5)  # ~10 blocks of 64 rows
    apart, estimator, far = _problem(3, weighted, spread=1e4)
    tight = model_from_parameters("tied", far.w, [c.mu for c in far.components], np.eye(3) * 1e-2)
    mu, factor = np.array([c.mu for c in tight.components]), tight.components[0]._prec_chol
    assert tied_step.shared_point(mu, lambda c: (mu - c) @ factor, torch.float64) is None
    for model in (tight, far):  # the separated start, then a start whose responsibilities mix
        new, count, objective = tied_em_step(apart, estimator, model)
        reference, reference_count, reference_objective = general_step(apart, estimator, model)
        assert count == pytest.approx(reference_count, rel=AGREE)
        assert objective == pytest.approx(reference_objective, rel=AGREE)
        _assert_same_mixture(new, reference)
    monkeypatch.setattr(tied_step, "SEPARATED_MAX_ELEMENTS", 4 * 600 - 1)
    assert tied_em_step(apart, estimator, tight) is None


def test_tied_step_degenerate_component_raises_as_the_general_one():
    enc, estimator, model = _problem(2, False)
    mu = [c.mu for c in model.components]
    mu[3] = mu[3] + 200.0  # within reach (covariance 1e2) but far from every point
    far = model_from_parameters("tied", model.w, mu, np.eye(2))
    assert_raises_as_the_general_step(tied_em_step, enc, estimator, far)


def test_a_tied_fit_takes_the_step_and_equals_scikit_learn(monkeypatch):
    """At N·K·D² beyond the compiled pass, a fit steps through ``tied_em_step``, from scikit-learn's
    start to scikit-learn's answer (1e-8)."""
    from sklearn.mixture import GaussianMixture as Reference

    from mixle_nb.mixture import GaussianMixture

    rng = np.random.default_rng(7)
    d, k = 24, 6
    x = rng.normal(0, 3, (k, d))[rng.integers(k, size=1500)] + rng.normal(size=(1500, d))
    start = dict(weights_init=np.full(k, 1 / k), means_init=x[:k], precisions_init=np.eye(d) / 4)
    taken = []
    monkeypatch.setattr(tied_step, "shared_point", lambda *a: taken.append(1) or _shared_point(*a))
    ours = GaussianMixture(k, covariance_type="tied", max_iter=30, tol=1e-8, **start).fit(x)
    reference = Reference(k, covariance_type="tied", max_iter=30, tol=1e-8, **start).fit(x)
    assert len(taken) >= ours.n_iter_ > 2
    assert ours.n_iter_ == reference.n_iter_
    np.testing.assert_allclose(ours.weights_, reference.weights_, atol=1e-8)
    np.testing.assert_allclose(ours.means_, reference.means_, atol=1e-8)
    np.testing.assert_allclose(ours.covariances_, reference.covariances_, atol=1e-8)
    np.testing.assert_allclose(ours.lower_bound_, reference.lower_bound_, rtol=1e-10)


_shared_point = tied_step.shared_point


def test_a_separated_tied_fit_takes_the_second_way_and_equals_scikit_learn(monkeypatch):
    """Clusters 1e3 of their spreads apart, a few points each: every step beyond the shared frame's
    reach, from scikit-learn's start to scikit-learn's answer (1e-8)."""
    from sklearn.mixture import GaussianMixture as Reference

    from mixle_nb.mixture import GaussianMixture

    rng = np.random.default_rng(11)
    d, k, n = 32, 8, 96  # N·K·D² beyond the compiled pass (FUSED_MAX_TIED_WORK)
    labels = np.arange(n) % k
    x = rng.normal(0, 1, (k, d))[labels] + 1e-3 * rng.normal(size=(n, d))
    start = dict(weights_init=np.full(k, 1 / k), means_init=x[:k] + 1e-4, precisions_init=np.eye(d) * 1e4)
    taken = []
    separated = tied_step._separated_sums
    monkeypatch.setattr(tied_step, "_separated_sums", lambda *a: taken.append(1) or separated(*a))
    ours = GaussianMixture(k, covariance_type="tied", max_iter=20, tol=1e-10, **start).fit(x)
    reference = Reference(k, covariance_type="tied", max_iter=20, tol=1e-10, **start).fit(x)
    assert len(taken) >= ours.n_iter_ >= 2
    assert ours.n_iter_ == reference.n_iter_
    np.testing.assert_allclose(ours.weights_, reference.weights_, atol=1e-8)
    np.testing.assert_allclose(ours.means_, reference.means_, atol=1e-8)
    np.testing.assert_allclose(ours.covariances_, reference.covariances_, rtol=1e-8, atol=1e-8 * 1e-6)
    np.testing.assert_allclose(ours.lower_bound_, reference.lower_bound_, rtol=1e-10)

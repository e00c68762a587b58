"""The fused small-N EM step (``mixle_nb.stats.fused_step``, issue 39): one compiled pass for the
E-step and its sums, then the estimator's own M-step. It must give the general (torch, accumulator)
step's model and objective within ``AGREE`` for every covariance type, with and without sample
weights, at an offset far from the origin, and the k-means start's hard-label M-step likewise;
whatever it does not take (float32, a model of another family) falls to the general step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from local_steps import assert_raises_as_the_general_step, general_step

from mixle_nb.mixture.translation import mixture_estimator, model_from_parameters
from mixle_nb.stats import (
    MixtureEstimator,
    em_step,
    fused_step,
    m_step,
    seq_encode,
)
from mixle_nb.stats.frame import with_weights
from mixle_nb.stats.fused_step import fused_em_step, fused_labelled_estimate

AGREE = 1e-12  # relative, against the general step (measured: below 2e-15)
KINDS = ("full", "tied", "diag", "spherical")


def _problem(kind: str, d: int, weighted: bool, offset: float = 0.0, k: int = 3, n: int = 300):
    rng = np.random.default_rng([d, k, n, int(weighted)])
    centres = rng.normal(0, 4, (k, d))
    x = offset + centres[rng.integers(k, size=n)] + rng.normal(size=(n, d))
    estimator = mixture_estimator(kind, k, d, 1e-6)
    enc = seq_encode(x, estimator=estimator)
    if weighted:
        weights = rng.random(n) * 2.0
        weights[::7] = 0.0  # rows of weight 0 add nothing
        enc = with_weights(enc, weights)
    covariances = {
        "full": np.stack([np.eye(d) * 2.0] * k),
        "tied": np.eye(d) * 2.0,
        "diag": np.full((k, d), 2.0),
        "spherical": np.full(k, 2.0),
    }[kind]
    model = model_from_parameters(kind, rng.dirichlet(np.ones(k)), offset + centres + 0.3, covariances)
    return enc, estimator, model


def _covariance(component) -> np.ndarray:
    return component.covar if hasattr(component, "covar") else component.sigma2


def _assert_same_mixture(a, b, offset: float = 0.0) -> None:
    assert [type(c) for c in a.components] == [type(c) for c in b.components]
    np.testing.assert_allclose(a.w, b.w, rtol=AGREE)
    for ca, cb in zip(a.components, b.components):
        np.testing.assert_allclose(ca.mu, cb.mu, rtol=AGREE, atol=AGREE * 10)  # a mean is a float near the data
        scale = np.abs(_covariance(cb)).max()  # a covariance's entries, against its largest
        np.testing.assert_allclose(_covariance(ca), _covariance(cb), rtol=AGREE, atol=AGREE * scale)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_step_equals_the_general_step(kind, d, weighted):
    enc, estimator, model = _problem(kind, d, weighted)
    fused = fused_em_step(enc, estimator, model)
    assert fused is not None
    new, count, objective = fused
    reference, reference_count, reference_objective = general_step(enc, estimator, model)
    assert count == pytest.approx(reference_count, rel=AGREE)
    assert objective == pytest.approx(reference_objective, rel=AGREE)
    _assert_same_mixture(new, reference)
    step = em_step(enc, estimator, model)  # the public step takes it
    assert step.log_density == objective and step.count == count


@pytest.mark.parametrize("kind", KINDS)
def test_fused_step_far_from_the_origin(kind):
    """Data at 1e8 with unit spread: centred on each mean, the sums keep their digits."""
    offset = 1e8
    enc, estimator, model = _problem(kind, 2, False, offset=offset)
    new, _, objective = fused_em_step(enc, estimator, model)
    reference, _, reference_objective = general_step(enc, estimator, model)
    assert objective == pytest.approx(reference_objective, rel=AGREE)
    _assert_same_mixture(new, reference, offset)
    at_zero, _, _ = fused_em_step(*_problem(kind, 2, False))  # the same fit, moved (x rounded at 1e8: 1.5e-8)
    for ca, cz in zip(new.components, at_zero.components):
        np.testing.assert_allclose(ca.mu - offset, cz.mu, atol=1e-7)
        np.testing.assert_allclose(_covariance(ca), _covariance(cz), atol=1e-7 * np.abs(_covariance(cz)).max())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_labelled_estimate_equals_the_general_one(kind, weighted, monkeypatch):
    """At any size: the labelled pass costs N·D (N·D²), not K times that as the general M-step."""
    monkeypatch.setattr(fused_step, "FUSED_MAX_ELEMENTS", 1)  # far below N·K here: it still applies
    enc, estimator, model = _problem(kind, 3, weighted)
    centres = np.array([c.mu for c in model.components])
    points = enc.values.numpy()
    labels = np.argmin(((points.T[:, None, :] - centres[None]) ** 2).sum(axis=2), axis=1)
    fused = fused_labelled_estimate(enc, estimator, centres, labels)
    acc = estimator.accumulator_factory().make()
    resp = torch.zeros(len(centres), len(enc), dtype=torch.float64)
    resp[torch.from_numpy(labels), torch.arange(len(enc))] = 1.0 if enc.weights is None else enc.weights
    acc.seq_update_responsibilities(enc, resp, references=centres)
    count = float(len(enc)) if enc.weights is None else float(enc.weights.sum())
    _assert_same_mixture(fused, m_step(estimator, count, acc))


def test_what_the_fused_step_leaves_to_the_general_one():
    enc, estimator, model = _problem("diag", 2, False)
    float32 = MixtureEstimator(estimator.estimators, dtype="float32")
    enc32 = seq_encode(enc.values.T.numpy(), estimator=float32)
    assert fused_em_step(enc32, float32, model) is None  # float32: the torch E-step
    assert em_step(enc32, float32, model).log_density == pytest.approx(general_step(enc, estimator, model)[2], rel=1e-6)
    full = mixture_estimator("full", 3, 2, 1e-6)
    assert fused_em_step(enc, full, model) is None  # a diagonal model under a full estimator


def test_fused_step_degenerate_component_raises_as_the_general_one():
    enc, estimator, model = _problem("diag", 2, False)
    far = model_from_parameters(
        "diag", [0.5, 0.25, 0.25], [[0.0, 0.0], [0.0, 0.0], [1e4, 1e4]], np.full((3, 2), 1e-6)
    )  # the third component takes no weight
    assert_raises_as_the_general_step(fused_em_step, enc, estimator, far)


@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_block_posterior_is_the_torch_posterior(weighted):
    """``fused_kernels.block_posterior`` (the tied and full steps' posterior) against
    ``mixture.block_posterior`` on a block longer than a tile, whose weights start ``start`` rows
    into the encoding's: terms far below the exp floor are 0, a row impossible under every
    component has no responsibility and makes the objective -inf, as torch's."""
    from mixle_nb.stats import fused_kernels
    from mixle_nb.stats.mixture import block_posterior

    rng = np.random.default_rng(int(weighted))
    k, rows, start = 4, 300, 17
    log_joint = rng.normal(-20.0, 30.0, size=(k, rows))
    log_joint[1, ::5] -= 900.0  # exp(term - peak) below exp(-700): exactly 0
    weights = rng.random(start + rows) * 2.0 if weighted else np.empty(0)
    if weighted:
        weights[start::11] = 0.0
    block_weights = torch.from_numpy(weights[start:]) if weighted else None
    expected, expected_objective = block_posterior(torch.from_numpy(log_joint.copy()), block_weights)
    resp = log_joint.copy()
    objective = fused_kernels.block_posterior(resp, weights, start)
    np.testing.assert_allclose(resp, expected.numpy(), rtol=1e-13, atol=1e-300)  # exp within 2 ulp
    assert (resp[1, ::5] == 0.0).all()
    assert objective == pytest.approx(expected_objective, rel=1e-13)

    impossible = log_joint.copy()
    impossible[:, 3] = -np.inf
    torch_resp, torch_objective = block_posterior(torch.from_numpy(impossible.copy()), None)
    objective = fused_kernels.block_posterior(impossible, np.empty(0), 0)
    assert (impossible[:, 3] == 0.0).all() and (torch_resp[:, 3] == 0.0).all()
    assert objective == torch_objective == -np.inf

"""Full covariance above D = 16 by banded products (``mixle_nb.stats.full_covariance``, issue 39).

The banded kernel is the same model as the quadratic features it replaces: from the same start,
EM's objective and fitted parameters agree with the feature path's to 1e-10 relative, and with
scikit-learn's iterations and an independent numpy E/M step, at offsets 0 and 1e6 and in mixed
units (coordinate spreads from 1e-3 to 1e3), for bands of equal and unequal widths; a float32 E-step
agrees with the float64 one to the float32 tolerance of tests/test_float32.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from offset_data import estimator_and_start, full_covariances, offset_problem, sklearn_start
from scipy.special import logsumexp
from sklearn.mixture import GaussianMixture

from mixle_nb.stats import (
    DiagonalGaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    em_step,
    full_covariance,
    seq_encode,
)
from mixle_nb.stats.frame import FullKernel, SharedFrameBlock, matmul
from mixle_nb.stats.full_covariance import BandedFullKernel, ScatterBlock, band_edges

STEPS = 4
AGREE = 1e-5  # float32 against float64 (tests/test_float32.py): means in spreads, covariances in spreads²


def _problem(offset, spread, dim, separation=2.0):
    """Three overlapping components (a shared frame) of 100 points each."""
    return offset_problem(offset, spread, dim, separation=separation, per=100, seed=4)


def _run(p, estimator, model, steps=STEPS, dtype=None):
    """``steps`` EM iterations: the fit, each step's objective, and the first step's kernel."""
    if dtype is not None:
        estimator = MixtureEstimator(estimator.estimators, dtype=dtype)
    enc = seq_encode(p.x, estimator=estimator)
    kernel = model._batched()
    history = []
    for _ in range(steps):
        step = em_step(enc, estimator, model)
        history.append(step.log_density)
        model = step.model
    return model, np.array(history), kernel


def _features_only(monkeypatch):
    """Every full-covariance mixture from here on takes the quadratic features (the path before)."""
    monkeypatch.setattr(full_covariance, "applies", lambda dim: False)


@pytest.mark.parametrize("offset, spread, separation", [(0.0, "mixed", 2.0), (1e6, 1.0, 2.0), (1e6, 1.0, 1e4)])
@pytest.mark.parametrize("dim", (17, 50, 64))
def test_banded_products_give_the_feature_path_s_fit(dim, offset, spread, separation, monkeypatch):
    """One band (D = 17), three of 17/16/17 (D = 50), four of 16 (D = 64); in mixed units (spreads
    1e-3 to 1e3), and at an offset of 1e6 spreads (where the data's own rounding is 1e-10);
    components 2 spreads apart (one shared point) and 1e4 (each component's own differences)."""
    p = _problem(offset, spread, dim, separation)
    estimator, start = estimator_and_start(p, "full", 1e-6 * float(np.min(p.scales)) ** 2)
    banded, banded_history, kernel = _run(p, estimator, start)
    assert isinstance(kernel, BandedFullKernel) and (kernel._c is not None) == (separation == 2.0)
    _features_only(monkeypatch)
    features, features_history, kernel = _run(p, estimator, MixtureDistribution(start.components, start.w))
    assert type(kernel) is FullKernel
    _assert_the_same_fit(p, offset, (banded, banded_history), (features, features_history))


def _assert_the_same_fit(p, offset, banded, features):
    """Two ``(model, history)`` fits of ``p`` agree to 1e-10 relative, and their means and
    covariances also to the data's own rounding at ``offset``."""
    np.testing.assert_allclose(banded[1], features[1], rtol=1e-10)
    (wa, ma, ca), (wb, mb, cb) = full_covariances(banded[0]), full_covariances(features[0])
    np.testing.assert_allclose(wa, wb, rtol=1e-10)
    rounding = 4 * np.spacing(offset) / np.min(p.scales)  # the data's own, in spreads
    np.testing.assert_allclose((ma - mb) / p.scales, 0.0, atol=1e-10 + rounding)
    scale = np.sqrt(np.einsum("kii->ki", cb))  # each covariance against its own diagonal
    # a difference to a mean moved by the rounding moves a covariance in spreads² by as much
    np.testing.assert_allclose((ca - cb) / (scale[:, :, None] * scale[:, None, :]), 0.0, atol=1e-10 + rounding)


def _numpy_step(x, w, means, covs, reg_covar):
    """One EM step from centred differences in numpy: the model and the objective before it."""
    terms = []
    for wk, mu, cov in zip(w, means, covs):
        chol = np.linalg.cholesky(cov)
        z = np.linalg.solve(chol, (x - mu).T)
        terms.append(
            np.log(wk) - 0.5 * (z * z).sum(0) - np.log(np.diag(chol)).sum() - 0.5 * len(mu) * np.log(2 * np.pi)
        )
    terms = np.array(terms)
    total = logsumexp(terms, axis=0)
    resp = np.exp(terms - total)
    n = resp.sum(1)
    new_means = np.array([r @ x / nk for r, nk in zip(resp, n)])
    new_covs = np.array(
        [(r * (x - m).T) @ (x - m) / nk + reg_covar * np.eye(x.shape[1]) for r, m, nk in zip(resp, new_means, n)]
    )
    return n / len(x), new_means, new_covs, total.sum()


@pytest.mark.parametrize("separation", (2.0, 1e4))
def test_a_banded_step_matches_numpy_and_its_iterations_match_scikit_learn(separation):
    """D = 40 (two bands), offset 1e6; components 2 spreads apart (one shared point) and 1e4
    (beyond the shared frame's reach: each component's own differences)."""
    p = _problem(1e6, 1.0, 40, separation)
    estimator, start = estimator_and_start(p, "full", 1e-6)
    model, history, kernel = _run(p, estimator, start, steps=1)
    assert isinstance(kernel, BandedFullKernel) and (kernel._c is not None) == (separation == 2.0)
    w, means, covs, objective = _numpy_step(p.x, *full_covariances(start), 1e-6)
    np.testing.assert_allclose(history[0], objective, rtol=1e-10)
    ours = full_covariances(model)
    np.testing.assert_allclose(ours[0], w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours[1] - 1e6, means - 1e6, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours[2], covs, rtol=0, atol=1e-8)
    model, _, _ = _run(p, estimator, start, steps=STEPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not converge": exactly STEPS iterations are asked
        gm = GaussianMixture(max_iter=STEPS, tol=0, reg_covar=1e-6, **sklearn_start(p, "full")).fit(p.x)
    ours = full_covariances(model)
    np.testing.assert_allclose(ours[0], gm.weights_, rtol=1e-6)
    np.testing.assert_allclose(ours[1] - 1e6, gm.means_ - 1e6, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours[2], gm.covariances_, rtol=0, atol=1e-6)


def test_a_float32_banded_e_step_agrees_with_float64():
    p = _problem(1e6, "mixed", 40)
    estimator, start = estimator_and_start(p, "full", 1e-6 * float(np.min(p.scales)) ** 2)
    exact, exact_history, _ = _run(p, estimator, start)
    single, single_history, kernel = _run(p, estimator, start, dtype="float32")
    assert isinstance(kernel, BandedFullKernel)
    (wa, ma, ca), (wb, mb, cb) = full_covariances(single), full_covariances(exact)
    assert np.abs(wa - wb).max() <= AGREE
    assert np.abs((ma - mb) / p.scales).max() <= AGREE
    assert np.abs((ca - cb) / np.outer(p.scales, p.scales)).max() <= AGREE
    np.testing.assert_allclose(single_history, exact_history, rtol=1e-6)


@pytest.mark.parametrize("separation", (2.0, 1e4))
def test_a_diagonal_estimator_on_a_banded_block_sums_the_squares(separation, monkeypatch):
    """A full model stepped by a diagonal estimator: the banded block's squares, not its scatter."""
    p = _problem(0.0, 1.0, 24, separation)
    d, k = 24, p.k
    estimator = MixtureEstimator([DiagonalGaussianEstimator(d)] * k)
    start = MixtureDistribution(
        [MultivariateGaussianDistribution(m, np.eye(d)) for m in p.start_means], np.full(k, 1 / k)
    )
    banded, banded_history, kernel = _run(p, estimator, start)
    assert isinstance(kernel, BandedFullKernel)
    _features_only(monkeypatch)
    features, features_history, _ = _run(p, estimator, MixtureDistribution(start.components, start.w))
    np.testing.assert_allclose(banded_history, features_history, rtol=1e-10)
    for a, b in zip(full_covariances(banded), full_covariances(features)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_the_scatter_unpacks_to_the_symmetric_weighted_sums():
    """Bands of 7, 6 and 7 coordinates: every band's columns land in place, mirrored below."""
    rng = np.random.default_rng(0)
    y, w = rng.normal(size=(20, 50)), rng.random((3, 50))
    block = ScatterBlock(np.zeros((3, 20)), torch.from_numpy(y), ((0, 7), (7, 13), (13, 20)))
    rows = block.sums(torch.from_numpy(w), True)
    np.testing.assert_allclose(rows[:, 0], w.sum(1), rtol=1e-14)
    np.testing.assert_allclose(rows[:, 1:21], w @ y.T, rtol=1e-13)
    np.testing.assert_allclose(rows[:, 21:].reshape(3, 20, 20), np.einsum("kn,in,jn->kij", w, y, y), rtol=1e-12)


def test_the_banded_kernel_is_chosen_above_the_stored_features_and_shares_bands_for_few_components():
    for dim, k, banded in [(16, 2, False), (17, 2, True), (32, 16, True), (64, 32, True)]:
        dists = [MultivariateGaussianDistribution(np.full(dim, float(i)), np.eye(dim)) for i in range(k)]
        kernel = MultivariateGaussianDistribution.stacked_kernel(dists)
        assert isinstance(kernel, BandedFullKernel) is banded, (dim, k)
    assert full_covariance.applies(17) and not full_covariance.applies(16)
    assert full_covariance.shared_bands(32, 15) and not full_covariance.shared_bands(32, 16)
    assert band_edges(17) == ((0, 17),) and band_edges(50) == ((0, 17), (17, 33), (33, 50))


@pytest.mark.parametrize("separation", (2.0, 1e4))
def test_many_components_take_the_features_within_the_reach_and_the_bands_beyond_it(separation, monkeypatch):
    """K = 9 >= D/2 (D = 18): within the shared frame's reach the features made per block
    (:class:`FullKernel`'s block), beyond it each component's own differences in bands; either
    way the feature path's fit, at an offset of 1e6 spreads."""
    p = offset_problem(1e6, 1.0, 18, separation=separation, k=9, per=40, seed=5)
    estimator, start = estimator_and_start(p, "full", 1e-6)
    banded, banded_history, kernel = _run(p, estimator, start)
    enc = seq_encode(p.x, estimator=estimator)
    block = kernel.joint(enc)[1]
    if separation == 2.0:
        assert kernel._c is not None and type(block) is SharedFrameBlock
    else:
        assert kernel._c is None and type(block) is ScatterBlock and block.y.ndim == 3
    _features_only(monkeypatch)
    features, features_history, _ = _run(p, estimator, MixtureDistribution(start.components, start.w))
    _assert_the_same_fit(p, 1e6, (banded, banded_history), (features, features_history))


def test_float64_cpu_products_are_numpy_s_on_one_thread_and_agree_with_torch_s():
    """Matrices and batches, transposed views among them: float64 by numpy on one torch thread
    and by torch on two, float32 by torch, each within rounding of torch's float64 product; NaN
    passes through unwarned."""
    rng = np.random.default_rng(1)
    a, b = torch.from_numpy(rng.normal(size=(3, 40, 24))), torch.from_numpy(rng.normal(size=(3, 30, 24)))
    threads = torch.get_num_threads()
    try:
        for x, y in [(a[0], b[0].T), (a, b.transpose(1, 2)), (a[:, :9], b[:, :5].transpose(1, 2))]:
            torch.set_num_threads(1)
            ours = matmul(x, y)
            np.testing.assert_array_equal(ours, np.matmul(x.numpy(), y.numpy()))
            np.testing.assert_allclose(ours, torch.matmul(x, y), rtol=1e-12, atol=1e-12)
            single = matmul(x.float(), y.float())
            assert single.dtype == torch.float32
            np.testing.assert_allclose(single, torch.matmul(x, y), rtol=1e-5, atol=1e-4)
            torch.set_num_threads(2)
            np.testing.assert_array_equal(matmul(x, y), torch.matmul(x, y))
        torch.set_num_threads(1)
        poisoned = a[0].clone()
        poisoned[2, 3] = float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = matmul(poisoned, b[0].T)
        assert torch.isnan(out[2]).all() and not torch.isnan(out[[0, 1]]).any()
    finally:
        torch.set_num_threads(threads)

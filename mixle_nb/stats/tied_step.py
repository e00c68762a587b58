"""One EM step of a Gaussian mixture whose components share one full covariance (scikit-learn's
``"tied"``), at the cost of one component's.

With one precision factor ``U`` (``Σ⁻¹ = U Uᵀ``) for every component, the whitened points
``y = (x - c) U`` are made once, not once per component, and the M-step needs of the second
moments only their sum over the components. Two ways to take them, chosen by where the means lie:

- **Within the shared frame's reach** of the mean of the means ``c``
  (:func:`~mixle_nb.stats.frame.shared_point`): each squared distance is expanded,
  ``‖y‖² - 2 y·m_k + ‖m_k‖²`` with ``m_k = (μ_k - c) U`` (one product with the K whitened means,
  losing at most ``eps·T²`` ≈ 2e-11 of its digits, as the shared frame's expansion does, see
  :mod:`.frame`), and the pooled second moment is the points' own scatter about ``c``,
  ``Σ w (x-c)(x-c)ᵀ``, whatever the responsibilities. A step costs ``N·(2D² + 2KD)`` instead of
  the per-component path's ``N·K·D²`` (at D = 64, K = 32 about 10× fewer operations). The values
  handed to the M-step are :func:`~mixle_nb.stats.centred_moments.pooled_values`' for
  references ``c``.
- **Beyond it** (components of a few points whose pooled covariance is far narrower than the
  distances between them), the squared distances are ``‖y - m_k‖²``, subtracted, not expanded,
  and the within scatter is taken about this step's own means ``x̄_k`` in two parts that are both
  sums of squares, so that nothing cancels however far apart the means are. With ``ρ_nk`` the
  responsibilities and ``x̂_n = Σ_k ρ_nk x̄_k``::

      Σ_k Σ_n w_n ρ_nk (x_n - x̄_k)(x_n - x̄_k)ᵀ
          = Σ_n w_n (x_n - x̂_n)(x_n - x̂_n)ᵀ + Σ_{k<l} C_kl (x̄_k - x̄_l)(x̄_k - x̄_l)ᵀ,

  ``C_kl = Σ_n w_n ρ_nk ρ_nl``. It keeps the responsibilities between its two passes, so it
  applies up to ``SEPARATED_MAX_ELEMENTS`` rows times components, at ``N·(2D² + 3KD + K²)
  + K²D²/2`` operations a step. The values handed to the M-step are about the new means (their
  first moments zero).

The products are numpy's and the posterior the compiled one
(:func:`~mixle_nb.stats.fused_kernels.block_posterior`): a step makes no torch call, so at two
threads no torch thread pool waits beside numpy's, and at one thread the sums took 0.38-0.74x the
time they took in torch's products and posterior (N = 1e2 to 1e4, D = 32 and 64; at N = 100,
D = 64, K = 2, 47 against 97 us).

Both agree with the per-component path to rounding (``tests/test_tied_step.py``). The step applies
to a local float64 encoding on the CPU fitted by our :class:`MixtureEstimator` of full Gaussians
with one covariance key, under a model whose components all have the same covariance (as the tied
M-step leaves them: one array shared, see
:meth:`~mixle_nb.stats.multivariate_gaussian.MultivariateGaussianEstimator.stacked_estimate`).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from .base import Distribution, Estimator
from .frame import shared_point
from .fused_step import compiled_weights, local_float64, mixture_family
from .mixture import MixtureDistribution
from .multivariate_gaussian import MultivariateGaussianDistribution

# Rows per block: the block's whitened points and log-densities stay within about this many
# floats, so memory is O(block·(D + K)) whatever N.
BLOCK_ELEMENTS = 1 << 18
# Rows times components up to which the step beyond the shared frame's reach keeps the
# responsibilities (32 MiB of float64) between its two passes.
SEPARATED_MAX_ELEMENTS = 1 << 22


def tied_em_step(enc: Any, estimator: Estimator, model: Distribution) -> tuple[Distribution, float, float] | None:
    """One EM step of a tied full-covariance mixture, where it applies (see the module docstring).

    Takes and returns what :func:`~mixle_nb.stats.fused_step.fused_em_step` does: ``(new model,
    count, log-density of model)``, or ``None`` where the step does not apply; the M-step's
    ``DegenerateComponentError`` as the general step raises it.
    """
    if type(model) is not MixtureDistribution or not local_float64(enc):
        return None
    components = model.components
    if mixture_family(estimator) != (True, (MultivariateGaussianDistribution,), True):
        return None
    if len(components) != len(estimator.estimators):  # type: ignore[attr-defined]
        return None
    if any(type(c) is not MultivariateGaussianDistribution for c in components):
        return None
    gaussians = cast(list[MultivariateGaussianDistribution], components)
    prec_chol = gaussians[0]._prec_chol
    if any(c._prec_chol is not prec_chol and not np.array_equal(c._prec_chol, prec_chol) for c in gaussians[1:]):
        return None  # a start whose components differ: the per-component step
    mu = np.array([c.mu for c in gaussians])
    log_const = model._log_w + gaussians[0]._log_norm
    centre = shared_point(mu, lambda c: (mu - c) @ prec_chol, torch.float64)
    if centre is not None:
        counts, moments, scatter, objective = _sums(enc, mu, prec_chol, centre, log_const)
    elif len(enc) * len(mu) <= SEPARATED_MAX_ELEMENTS:
        counts, moments, scatter, objective = _separated_sums(enc, mu, prec_chol, log_const)
    else:
        return None
    weights = enc.weights
    count = float(len(enc)) if weights is None else float(weights.sum())
    return estimator.estimate(count, (counts, _values(counts, moments, scatter))), count, objective


def _values(counts: np.ndarray, moments: tuple[np.ndarray, np.ndarray], scatter: np.ndarray) -> np.ndarray:
    """The M-step's stacked values ``[n, n·r, S1, S2]`` (K, 1 + 2D + D²) for weight totals
    ``counts``, ``moments`` ``(r, S1)`` (each (K, D): the references and the first moments about
    them) and the pooled second moment ``scatter`` (the sum of the components' own ``S2``): every
    component's ``S2`` rewritten so that its M-step yields the pooled scatter, as
    :func:`~mixle_nb.stats.centred_moments.pooled_values` does."""
    points, s1 = moments
    k, dim = points.shape
    values = np.empty((k, 1 + 2 * dim + dim * dim))
    values[:, 0] = counts
    np.multiply(counts[:, None], points, out=values[:, 1 : 1 + dim])
    values[:, 1 + dim : 1 + 2 * dim] = s1
    second = values[:, 1 + 2 * dim :].reshape(k, dim, dim)  # a view: made in place
    pooled_n = counts.sum()
    if pooled_n > 0:
        np.multiply(s1[:, :, None], (s1 / np.where(counts > 0, counts, 1.0)[:, None])[:, None, :], out=second)
        pooled = (scatter - second.sum(axis=0)) / pooled_n
        for row, count in zip(second, counts.tolist()):  # one (K, D, D) product added into the view took 13x as long
            row += count * pooled  # a component of no weight: 0
    else:
        second[...] = 0.0
    return values


def _sums(
    enc: Any, mu: np.ndarray, prec_chol: np.ndarray, centre: np.ndarray, log_const: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray, float]:
    """``(n_k, (c, Σ r·(x-c)), Σ w·(x-c)(x-c)ᵀ, Σ w·log p(x))`` over the encoding, block by
    block, within the shared frame's reach of ``c``."""
    from . import fused_kernels  # numba's import when first needed

    k, dim = mu.shape
    whitened_means = (mu - centre) @ prec_chol  # (K, D): m_k
    const = (log_const - 0.5 * np.einsum("kd,kd->k", whitened_means, whitened_means))[:, None]
    counts, s1, scatter = np.zeros(k), np.zeros((k, dim)), np.zeros((dim, dim))
    objective = 0.0
    points = enc.values.numpy()  # (D, N)
    weights = compiled_weights(enc)
    rows = max(1, BLOCK_ELEMENTS // (dim + k))
    for start in range(0, len(enc), rows):
        diff = points[:, start : start + rows].T - centre  # (B, D): x - c
        white = diff @ prec_chol
        log_joint = whitened_means @ white.T  # (K, B)
        log_joint -= 0.5 * np.einsum("bd,bd->b", white, white)
        log_joint += const
        objective += fused_kernels.block_posterior(log_joint, weights, start)
        counts += log_joint.sum(axis=1)
        s1 += log_joint @ diff
        scatter += (diff if enc.weights is None else diff * weights[start : start + rows, None]).T @ diff
    return counts, (np.broadcast_to(centre, mu.shape), s1), scatter, objective


def _separated_sums(
    enc: Any, mu: np.ndarray, prec_chol: np.ndarray, log_const: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray, float]:
    """``(n_k, (x̄_k, 0), within scatter about the x̄_k, Σ w·log p(x))`` beyond the shared frame's
    reach (the module docstring's second way), block by block: the first pass takes the
    responsibilities and the new means, the second the scatter about them."""
    from . import fused_kernels  # numba's import when first needed

    k, dim = mu.shape
    c = mu.mean(axis=0)  # the frame the points are taken in (its rounding cancels in every difference)
    means = ((mu - c) @ prec_chol)[:, None, :]  # (K, 1, D): m_k
    points = enc.values.numpy()  # (D, N)
    weights = compiled_weights(enc)
    resp = np.empty((k, len(enc)))
    s1 = np.zeros((k, dim))
    objective = 0.0
    rows = max(1, BLOCK_ELEMENTS // (dim * (k + 1)))
    blocks = [slice(start, start + rows) for start in range(0, len(enc), rows)]
    for block in blocks:
        diff = points[:, block].T - c  # (B, D): x - c
        distance = np.square((diff @ prec_chol)[None] - means).sum(axis=2)  # (K, B)
        log_joint = np.multiply(distance, -0.5, out=distance)
        log_joint += log_const[:, None]
        objective += fused_kernels.block_posterior(log_joint, weights, block.start)
        resp[:, block] = log_joint
        s1 += log_joint @ diff
    counts = resp.sum(axis=1)
    weighed = counts > 0
    new_means = np.zeros((k, dim))  # x̄_k - c; 0 for a component of no weight
    new_means[weighed] = s1[weighed] / counts[weighed, None]
    # ρ: the responsibilities without the sample weights (a row of weight 0 has none)
    shares = resp if enc.weights is None else resp / np.where(weights > 0, weights, 1.0)
    scatter = np.zeros((dim, dim))
    for block in blocks:
        residual = points[:, block].T - c - shares[:, block].T @ new_means  # x - x̂
        weighted = residual if enc.weights is None else residual * weights[block, None]
        scatter += weighted.T @ residual
    together = resp @ shares.T  # (K, K): C
    first, second = np.triu_indices(k, 1)
    apart = new_means[first] - new_means[second]  # (K(K-1)/2, D)
    scatter += (apart * together[first, second, None]).T @ apart
    references = c + new_means
    references[~weighed] = mu[~weighed]
    return counts, (references, np.zeros((k, dim))), scatter, objective

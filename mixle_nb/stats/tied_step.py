"""One EM step of a Gaussian mixture whose components share one full covariance (scikit-learn's
``"tied"``), at the cost of one component's.

With one precision factor ``U`` (``Σ⁻¹ = U Uᵀ``) for every component, the whitened points
``y = (x - c) U`` are made once, not once per component: each component's squared distance is
``‖y‖² - 2 y·m_k + ‖m_k‖²`` with ``m_k = (μ_k - c) U``, one product with the K whitened means.
The M-step needs of the second moments only their sum over the components, which is the points'
own scatter about ``c`` whatever the responsibilities: ``Σ w (x-c)(x-c)ᵀ`` once, not per component.
A step costs ``N·(2D² + 2KD)`` instead of the per-component path's ``N·K·D²`` (at D = 64, K = 32
about 10× fewer operations).

``c`` is the mean of the means (:func:`~mixle_nb.stats.frame.shared_point`), and the step applies
only while every ``m_k`` stays within the shared frame's reach of it: expanding the squared
distance then costs at most ``eps·T²`` (~2e-11) of its digits, as the shared frame's expansion
does (see :mod:`.frame`); the sums are about ``c``, so offsets cost nothing. The values handed to
the M-step are :func:`~mixle_nb.stats.centred_moments.pooled_values`' for references ``c``: the
same estimate as the per-component path's, to rounding (``tests/test_tied_step.py``).

It applies to a local float64 encoding on the CPU fitted by our :class:`MixtureEstimator` of full
Gaussians with one covariance key, under a model whose components all have the same covariance
(to ``SAME_COVARIANCE``; the first component's is used).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from .base import Distribution, Estimator
from .frame import shared_point
from .fused_step import local_float64, mixture_family
from .mixture import MixtureDistribution, block_posterior
from .multivariate_gaussian import MultivariateGaussianDistribution

# Rows per block: the block's whitened points and log-densities stay within about this many
# floats, so memory is O(block·(D + K)) whatever N.
BLOCK_ELEMENTS = 1 << 18
# Components whose precision factors differ by at most this, relative to the largest entry, share
# one covariance: a tied M-step leaves its K copies equal only to rounding (each is the pooled
# scatter plus and minus its own mean's outer product).
SAME_COVARIANCE = 1e-12


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
    scale = SAME_COVARIANCE * np.abs(prec_chol).max()
    if any(np.abs(c._prec_chol - prec_chol).max() > scale for c in gaussians[1:]):
        return None  # a start whose components differ: the per-component step
    mu = np.array([c.mu for c in gaussians])
    centre = shared_point(mu, lambda c: (mu - c) @ prec_chol, torch.float64)
    if centre is None:
        return None
    counts, s1, scatter, objective = _sums(enc, mu, prec_chol, centre, model._log_w + gaussians[0]._log_norm)
    k, dim = mu.shape
    weighed = counts > 0
    outer = np.zeros((k, dim, dim))
    outer[weighed] = s1[weighed, :, None] * s1[weighed, None, :] / counts[weighed, None, None]
    pooled_n = counts.sum()
    values = np.zeros((k, 1 + 2 * dim + dim * dim))
    values[:, 0] = counts
    values[:, 1 : 1 + dim] = counts[:, None] * centre
    values[:, 1 + dim : 1 + 2 * dim] = s1
    if pooled_n > 0:
        pooled = (scatter - outer.sum(axis=0)) / pooled_n
        values[weighed, 1 + 2 * dim :] = (counts[weighed, None, None] * pooled + outer[weighed]).reshape(-1, dim * dim)
    weights = enc.weights
    count = float(len(enc)) if weights is None else float(weights.sum())
    return estimator.estimate(count, (counts, values)), count, objective


def _sums(
    enc: Any, mu: np.ndarray, prec_chol: np.ndarray, centre: np.ndarray, log_const: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``(n_k, Σ r·(x-c), Σ w·(x-c)(x-c)ᵀ, Σ w·log p(x))`` over the encoding, block by block."""
    k, dim = mu.shape
    factor = torch.from_numpy(np.ascontiguousarray(prec_chol))
    c = torch.from_numpy(centre)
    whitened_means = (mu - centre) @ prec_chol  # (K, D): m_k
    means = torch.from_numpy(whitened_means)
    const = torch.from_numpy(log_const - 0.5 * np.einsum("kd,kd->k", whitened_means, whitened_means))[:, None]
    counts = torch.zeros(k, dtype=torch.float64)
    s1 = torch.zeros(k, dim, dtype=torch.float64)
    scatter = torch.zeros(dim, dim, dtype=torch.float64)
    objective = 0.0
    points = enc.values  # (D, N)
    rows = max(1, BLOCK_ELEMENTS // (dim + k))
    for start in range(0, len(enc), rows):
        diff = points[:, start : start + rows].T - c  # (B, D): x - c
        white = diff @ factor
        log_joint = torch.addmm(const, means, white.T).sub_(0.5 * (white * white).sum(dim=1))  # (K, B)
        weights = None if enc.weights is None else enc.weights[start : start + rows]
        resp, block_objective = block_posterior(log_joint, weights)
        objective += block_objective
        counts += resp.sum(dim=1)
        s1.addmm_(resp, diff)
        scatter.addmm_(diff.T if weights is None else (diff * weights[:, None]).T, diff)
    return counts.numpy(), s1.numpy(), scatter.numpy(), objective

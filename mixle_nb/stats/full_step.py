"""One EM step of a Gaussian mixture with its own full covariance per component, component by
component, as products of the machine's float64 BLAS through numpy.

Each component's differences ``x - μ_k`` are made for a block of rows, whitened by one product
(``y = (x - μ_k) U_k``, ``Σ_k⁻¹ = U_k U_kᵀ``), and, once the block's responsibilities ``r`` are
known, made again and summed: ``Σ r·(x - μ_k)`` and ``Σ r·(x - μ_k)(x - μ_k)ᵀ``, one product.
That is ``2·N·K·D²`` operations a step, scikit-learn's count, with the differences taken to each
component's own mean, so no digits are lost however far apart the components are. The sums are
about each component's mean, as :class:`~.centred_moments.CentredMoments` holds them, and the
estimator's own M-step follows; the step equals the general one to rounding
(``tests/test_full_step.py``).

Why numpy's products and not torch's: on the AMD EPYC CPU this was measured on, torch's float64
matrix product (Intel's MKL) took 1.3–1.7× numpy's (OpenBLAS) at these shapes (a 1,000 × 64
block times a 64 × 64 factor: 238 against 180 us; the general step's products are numpy's too,
:func:`.frame.matmul`). Yet K products a block lose to the general step's batched ones beyond a
few thousand rows times components or 8 components, so it applies only to a local float64
encoding on the CPU with more than ``MIN_DIM`` dimensions, at most ``MAX_COMPONENTS`` components
and at most ``MAX_ELEMENTS`` rows times components, fitted by our :class:`MixtureEstimator` of
full Gaussians without a tied covariance. There it is tried before the compiled pass of
:mod:`.fused_step` (measured, one thread: at N = 100, D = 64, K = 2 and 4, 0.76x and 0.78x the
compiled pass's time; at N = 400, D = 32, K = 2 and 4, 0.84x and 0.80x; at D = 32, N = 100 the
same). Its posterior is the compiled one (:func:`.fused_kernels.block_posterior`), so a step
makes no torch call: at two threads torch's and numpy's thread pools would wait on each other.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from .base import Distribution, Estimator
from .fused_step import compiled_weights, local_float64, mixture_family
from .mixture import MixtureDistribution
from .multivariate_gaussian import MultivariateGaussianDistribution

# Where it is faster than the general step, measured (one thread, process CPU time, the EPYC
# above; N = 1e2 to 1e4, D = 16 to 64, K = 2 to 32): at N = 1e2, D = 64, K = 2 and 8, 0.47x and
# 0.64x its time; at N = 1e3, K = 2, D = 32 and 64, 0.75x and 0.79x; at N·K = 3,200 (N = 1e2,
# K = 32) 0.87x (D = 64) to 1.04x (D = 32); from N·K = 8,000 1.04-3.4x; at D = 16 0.84-2.2x.
# Since the general step's products are numpy's too (a fit's iteration, interleaved runs): at
# N = 1e3, D = 64, K = 2 0.90x and D = 32, K = 4 0.94x its time, N = 1e2, D = 64, K = 8 0.79x;
# from K = 16 no faster: N = 1e2, D = 64, K = 16 1.0x, K = 32 1.17x; N = 250, K = 16 1.25x.
MIN_DIM = 16
MAX_ELEMENTS = 4096
MAX_COMPONENTS = 8
# Rows per block: a block's differences and log-densities stay within about this many floats.
BLOCK_ELEMENTS = 1 << 18


def full_em_step(enc: Any, estimator: Estimator, model: Distribution) -> tuple[Distribution, float, float] | None:
    """One EM step of a full-covariance mixture, component by component, where it applies (see
    the module docstring).

    Takes and returns what :func:`~mixle_nb.stats.fused_step.fused_em_step` does: ``(new model,
    count, log-density of model)``, or ``None`` where the step does not apply; the M-step's
    ``DegenerateComponentError`` as the general step raises it.
    """
    if type(model) is not MixtureDistribution or not local_float64(enc):
        return None
    k = len(model.components)
    if enc.dim <= MIN_DIM or k > MAX_COMPONENTS or len(enc) * k > MAX_ELEMENTS:
        return None
    if mixture_family(estimator) != (True, (MultivariateGaussianDistribution,), False):
        return None
    components = model.components
    if len(components) != len(estimator.estimators):  # type: ignore[attr-defined]
        return None
    if any(type(c) is not MultivariateGaussianDistribution for c in components):
        return None
    gaussians = cast(list[MultivariateGaussianDistribution], components)
    counts, values, objective = _sums(enc, gaussians, model._log_w)
    weights = enc.weights
    count = float(len(enc)) if weights is None else float(weights.sum())
    return estimator.estimate(count, (counts, values)), count, objective


def _sums(
    enc: Any, gaussians: list[MultivariateGaussianDistribution], log_w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(n_k, values [n, n·μ, S1, S2] about each μ_k (K, 1 + 2D + D²), Σ w·log p(x))``."""
    from . import fused_kernels  # numba's import when first needed

    k, dim = len(gaussians), enc.dim
    points = enc.values.numpy().T  # (N, D), a view
    weights = compiled_weights(enc)
    const = log_w + np.array([g._log_norm for g in gaussians])
    values = np.zeros((k, 1 + 2 * dim + dim * dim))
    s1 = values[:, 1 + dim : 1 + 2 * dim]
    s2 = np.zeros((k, dim, dim))
    objective = 0.0
    rows = max(1, BLOCK_ELEMENTS // (dim + k))
    for start in range(0, len(enc), rows):
        block = np.ascontiguousarray(points[start : start + rows])
        r = np.empty((k, len(block)))  # the log-joints, then the responsibilities
        for i, g in enumerate(gaussians):
            white = (block - g.mu) @ g._prec_chol
            r[i] = (white * white).sum(axis=1)
        r *= -0.5
        r += const[:, None]
        objective += fused_kernels.block_posterior(r, weights, start)
        for i, g in enumerate(gaussians):
            diff = block - g.mu
            s1[i] += r[i] @ diff
            s2[i] += (diff * r[i][:, None]).T @ diff
        values[:, 0] += r.sum(axis=1)
    counts = values[:, 0].copy()
    values[:, 1 : 1 + dim] = counts[:, None] * np.array([g.mu for g in gaussians])
    values[:, 1 + 2 * dim :] = s2.reshape(k, dim * dim)
    return counts, values, objective

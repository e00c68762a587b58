"""One EM step of a mixture of axis-aligned Gaussians (diagonal or spherical) with many
dimensions times components, as matrix products.

Each component's log-density is a quadratic in the differences ``y = x - c`` to one point ``c``
(the mean of the means): ``const_k + y·(p_k m_k) - ½ y²·p_k`` with ``p_k`` the precisions and
``m_k = μ_k - c``, so the K log-densities of a block are two products with the block's ``y`` and
``y²``, and the M-step's sums ``Σr``, ``Σr·y``, ``Σr·y²`` two more, at the speed of the machine's
matrix product rather than of one multiply-add a point, component and coordinate. Expanding the
square costs ``eps·T_k²`` of its digits, ``T_k`` the whitened distance of ``μ_k`` from ``c``
(see :mod:`.frame`); a component beyond the shared frame's reach (a component collapsed onto a
few points, whose variance is tiny) keeps its own differences ``x - μ_k``, alone, so one such
component does not send every other one to the per-component path. The sums are about each
component's reference (``c``, or its own mean), as :class:`~.centred_moments.CentredMoments`
holds them, and the estimator's own M-step follows; the step equals the general one within
``eps·T²`` (``tests/test_diagonal_step.py``).

It applies to a local float64 encoding on the CPU with at least ``MIN_WIDTH`` dimensions times
components and ``MIN_WORK`` rows times those, fitted by our :class:`MixtureEstimator` of one
diagonal or spherical family without tied variances; below them the compiled pass of
:mod:`.fused_step` is faster.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .base import Distribution, Estimator
from .frame import SHARED_FRAME_REACH
from .fused_step import local_float64, mixture_family
from .mixture import MixtureDistribution, block_posterior

# From these dimensions x components, and rows x dimensions x components, the products beat the
# compiled pass (one thread, process CPU time, diagonal and spherical): at N = 1e3, D·K = 2,048
# 0.57x/0.24x its time, at D·K = 512 0.8-1.07x; at N = 1e2 (2.0e5) 1.3-2.3x, the products'
# per-call cost; at N = 1e4 and 1e5 a third to a sixth of the general step's time.
MIN_WIDTH = 256
MIN_WORK = 1 << 19
# Rows per block: the block's differences, squares and log-densities stay within about this many
# floats, so memory is O(block·(D + K)) whatever N.
BLOCK_ELEMENTS = 1 << 18


def diagonal_em_step(enc: Any, estimator: Estimator, model: Distribution) -> tuple[Distribution, float, float] | None:
    """One EM step of a wide diagonal or spherical mixture, where it applies (see the module
    docstring).

    Takes and returns what :func:`~mixle_nb.stats.fused_step.fused_em_step` does: ``(new model,
    count, log-density of model)``, or ``None`` where the step does not apply; the M-step's
    ``DegenerateComponentError`` as the general step raises it.
    """
    if type(model) is not MixtureDistribution or not local_float64(enc):
        return None
    family = mixture_family(estimator)
    if family is None or family[0] or family[2]:  # full, or tied variances
        return None
    components = model.components
    width = enc.dim * len(components)
    if len(components) != len(estimator.estimators) or width < MIN_WIDTH or len(enc) * width < MIN_WORK:  # type: ignore[attr-defined]
        return None
    if any(type(c) not in family[1] for c in components):
        return None
    mu = np.array([c.mu for c in components])  # type: ignore[attr-defined]
    sigma2 = np.array([c.sigma2 for c in components])  # type: ignore[attr-defined]
    centre = mu.mean(axis=0)
    reach = np.sqrt(np.sum((mu - centre) ** 2 / sigma2, axis=1))
    near = reach <= SHARED_FRAME_REACH
    references = np.where(near[:, None], centre, mu)
    log_const = model._log_w - 0.5 * (mu.shape[1] * np.log(2.0 * np.pi) + np.log(sigma2).sum(axis=1))
    counts, s1, s2, objective = _sums(enc, mu, sigma2, log_const, centre, near)
    values = np.concatenate([counts[:, None], counts[:, None] * references, s1, s2], axis=1)
    weights = enc.weights
    count = float(len(enc)) if weights is None else float(weights.sum())
    return estimator.estimate(count, (counts, values)), count, objective


def _sums(
    enc: Any, mu: np.ndarray, sigma2: np.ndarray, log_const: np.ndarray, centre: np.ndarray, near: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``(Σr, Σr·d, Σr·d², Σ w·log p(x))`` over the encoding, block by block, ``d`` each
    component's difference to its reference (``centre`` where ``near``, else its mean)."""
    k, dim = mu.shape
    precision = 1.0 / sigma2
    expanded, own = np.flatnonzero(near), np.flatnonzero(~near)
    m = mu[expanded] - centre
    linear = torch.from_numpy(precision[expanded] * m)  # (A, D): p·m
    quadratic = torch.from_numpy(-0.5 * precision[expanded])  # (A, D): -½p
    const = torch.from_numpy(log_const[expanded] - 0.5 * np.sum(precision[expanded] * m * m, axis=1))[:, None]
    c, own_mu = torch.from_numpy(centre), torch.from_numpy(mu[own])
    own_half, own_const = torch.from_numpy(-0.5 * precision[own]), log_const[own]
    rows_of = torch.from_numpy(expanded)
    counts = torch.zeros(k, dtype=torch.float64)
    s1 = torch.zeros(k, dim, dtype=torch.float64)
    s2 = torch.zeros(k, dim, dtype=torch.float64)
    objective = 0.0
    rows = max(1, BLOCK_ELEMENTS // (2 * dim + k))
    for start in range(0, len(enc), rows):
        x = enc.values[:, start : start + rows].T  # (B, D)
        y = x - c
        square = y * y
        log_joint = torch.empty(k, len(x), dtype=torch.float64)
        log_joint[rows_of] = torch.addmm(const, linear, y.T).addmm_(quadratic, square.T)
        own_differences = [x - own_mu[j] for j in range(len(own))]  # read again by the sums below
        for j, (f, d) in enumerate(zip(own, own_differences)):
            log_joint[f] = (d * d) @ own_half[j] + own_const[j]
        weights = None if enc.weights is None else enc.weights[start : start + rows]
        resp, block_objective = block_posterior(log_joint, weights)
        objective += block_objective
        counts += resp.sum(dim=1)
        near_resp = resp[rows_of]
        s1[rows_of] += near_resp @ y
        s2[rows_of] += near_resp @ square
        for f, d in zip(own, own_differences):
            s1[f] += resp[f] @ d
            s2[f] += resp[f] @ (d * d)
    return counts.numpy(), s1.numpy(), s2.numpy(), objective

"""A Gaussian mixture's E-step and its M-step sums in one compiled pass (numba), for small data.

At a few thousand rows a torch E-step is mostly per-call overhead: the kernel, the posterior and
the sums take some twenty operations of a few microseconds each, whatever their size. Here one
call does a block's work, ``TILE`` rows at a time, component-major within a tile (the inner loops
run over the tile's rows and vectorise):

- each component's log-joint from the differences ``d = x - μ_k`` to its own mean, as the
  mixtures' :class:`~mixle_nb.stats.frame.CentredBlock` path (whitened: ``Σ_j d_j² / σ²_kj``, or
  ``‖U_kᵀ d‖²`` for a full covariance), so rounding is relative to the whitened distance whatever
  the data's offset and units;
- the posterior as :func:`mixle_nb.stats.mixture.posterior` makes it: each row's terms
  ``exp(lp - peak)`` about its largest (an impossible row's peak clamped to the lowest float, so
  it stays ``-inf``), their sum clamped at 1 before it divides, times the row's weight;
- the sums ``[Σw, Σw·d, Σw·d²]`` (diagonal) or ``[Σw, Σw·d, Σw·ddᵀ]`` (full) about each
  component's mean, the values :class:`~mixle_nb.stats.centred_moments.CentredMoments` holds;
- the objective ``Σ w·log p(x)`` (rows of weight 0 left out), in float64.

Compiled on first use and cached on disk (``cache=True``), as :mod:`mixle_nb.stats.hmm.compiled`.
"""

from __future__ import annotations

import math

import numpy as np

from .hmm.compiled import LOWEST, exp_nonpositive, jit

# Rows a tile: its (K, TILE) log-joint and its differences stay in the first-level cache.
TILE = 128


@jit
def _posterior_tile(
    lp: np.ndarray, m: int, weights: np.ndarray, start: int, peak: np.ndarray, summed: np.ndarray
) -> float:
    """Turn the tile's log-joints ``lp[:, :m]`` into weighted responsibilities in place; returns
    the tile's ``Σ w·log p(x)`` (unit weights when ``weights`` is empty)."""
    k = lp.shape[0]
    for t in range(m):
        peak[t] = lp[0, t]
    for c in range(1, k):
        for t in range(m):
            peak[t] = max(peak[t], lp[c, t])
    for t in range(m):
        peak[t] = max(peak[t], LOWEST)  # a row impossible under every component stays -inf
        summed[t] = 0.0
    for c in range(k):
        row = lp[c, :m]
        for t in range(m):
            row[t] -= peak[t]
        exp_nonpositive(row)
        for t in range(m):
            summed[t] += row[t]
    objective = 0.0
    unit = len(weights) == 0
    for t in range(m):
        weight = 1.0 if unit else weights[start + t]
        if unit or weight > 0:
            objective += weight * (peak[t] + math.log(summed[t]))
        summed[t] = weight / max(summed[t], 1.0)
    for c in range(k):
        for t in range(m):
            lp[c, t] *= summed[t]
    return objective


@jit
def diagonal_pass(
    points: np.ndarray,
    weights: np.ndarray,
    mu: np.ndarray,
    neg_half_precision: np.ndarray,
    const: np.ndarray,
    sums: np.ndarray,
) -> float:
    """E-step of axis-aligned Gaussians over ``points`` (D, N): adds ``[Σw, Σw·d, Σw·d²]`` about
    each mean ``mu`` (K, D) to ``sums`` (K, 1 + 2D) and returns ``Σ w·log p(x)``; the log-joint is
    ``const_k + Σ_j neg_half_precision_kj·d_j²`` (``const`` with the log-weights)."""
    dim, n = points.shape
    k = mu.shape[0]
    lp = np.empty((k, TILE))
    peak, summed, d = np.empty(TILE), np.empty(TILE), np.empty(TILE)
    objective = 0.0
    for start in range(0, n, TILE):
        m = min(TILE, n - start)
        for c in range(k):
            row = lp[c]
            for t in range(m):
                row[t] = const[c]
            for j in range(dim):
                x, centre, p = points[j, start : start + m], mu[c, j], neg_half_precision[c, j]
                for t in range(m):
                    y = x[t] - centre
                    row[t] += p * y * y
        objective += _posterior_tile(lp, m, weights, start, peak, summed)
        for c in range(k):
            r = lp[c]
            total = 0.0
            for t in range(m):
                total += r[t]
            sums[c, 0] += total
            for j in range(dim):
                x, centre = points[j, start : start + m], mu[c, j]
                first, second = 0.0, 0.0
                for t in range(m):
                    y = x[t] - centre
                    d[t] = r[t] * y
                    first += d[t]
                    second += d[t] * y
                sums[c, 1 + j] += first
                sums[c, 1 + dim + j] += second
    return objective


@jit
def full_pass(
    points: np.ndarray,
    weights: np.ndarray,
    mu: np.ndarray,
    whiten: np.ndarray,
    const: np.ndarray,
    sums: np.ndarray,
) -> float:
    """E-step of full-covariance Gaussians over ``points`` (D, N): adds ``[Σw, Σw·d, Σw·ddᵀ]``
    (the square flattened row-major) about each mean ``mu`` (K, D) to ``sums`` (K, 1 + D + D²) and
    returns ``Σ w·log p(x)``; the log-joint is ``const_k - ½‖whiten_k d‖²`` (``whiten`` (K, D, D)
    ``= U_kᵀ`` with ``Σ_k⁻¹ = U_k U_kᵀ``; ``const`` with the log-weights)."""
    dim, n = points.shape
    k = mu.shape[0]
    lp = np.empty((k, TILE))
    peak, summed, z, rd = np.empty(TILE), np.empty(TILE), np.empty(TILE), np.empty(TILE)
    d = np.empty((dim, TILE))
    objective = 0.0
    for start in range(0, n, TILE):
        m = min(TILE, n - start)
        for c in range(k):
            row = lp[c]
            for t in range(m):
                row[t] = const[c]
            for j in range(dim):
                x, centre = points[j, start : start + m], mu[c, j]
                for t in range(m):
                    d[j, t] = x[t] - centre
            for a in range(dim):
                for t in range(m):
                    z[t] = 0.0
                for b in range(dim):
                    u = whiten[c, a, b]
                    if u != 0.0:  # U is triangular: half the products are with zeros
                        for t in range(m):
                            z[t] += u * d[b, t]
                for t in range(m):
                    row[t] -= 0.5 * z[t] * z[t]
        objective += _posterior_tile(lp, m, weights, start, peak, summed)
        for c in range(k):
            r = lp[c]
            total = 0.0
            for t in range(m):
                total += r[t]
            sums[c, 0] += total
            for j in range(dim):
                x, centre = points[j, start : start + m], mu[c, j]
                for t in range(m):
                    d[j, t] = x[t] - centre
            for a in range(dim):
                first = 0.0
                for t in range(m):
                    rd[t] = r[t] * d[a, t]
                    first += rd[t]
                sums[c, 1 + a] += first
                for b in range(a, dim):
                    second = 0.0
                    for t in range(m):
                        second += rd[t] * d[b, t]
                    sums[c, 1 + dim + a * dim + b] += second
    for c in range(k):  # the lower triangle from the upper
        for a in range(dim):
            for b in range(a):
                sums[c, 1 + dim + a * dim + b] = sums[c, 1 + dim + b * dim + a]
    return objective

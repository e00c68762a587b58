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
- the sums ``[Σw, Σw·d, Σw·d²]`` (diagonal) or ``[Σw, Σw·d, Σw·ddᵀ]`` (full) of ``d = x - r``
  about the reference points the torch path takes (the kernels' shared point, the mean of the
  means, when every mean is within its reach, else each component's mean), written as the values
  ``[n, n·r, S1, S2]`` that :class:`~mixle_nb.stats.centred_moments.CentredMoments` holds;
- the objective ``Σ w·log p(x)`` (rows of weight 0 left out), in float64.

Compiled on first use and cached on disk (``cache=True``), as :mod:`mixle_nb.stats.hmm.compiled`.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from .frame import FLOAT64_EXP_FLOOR, LOG_2PI
from .hmm.compiled import LOWEST, exp_nonpositive


def jit(function: Any) -> Any:
    """``function`` compiled by numba, cached on disk, without the GIL; fused multiply-adds
    allowed but no reassociation, so every sum adds in the order written, whatever the arrays'
    alignment (a reassociated, vectorised sum's rounding depended on it: the same step could
    differ in its last bit from call to call)."""
    return numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"contract"})(function)


# Rows a tile: its (K, TILE) log-joint and its differences stay in the first-level cache.
TILE = 128
# exp(FLOAT64_EXP_FLOOR) and a little above (exp_nonpositive is within 2 ulp of exp): a term at
# most this is one that was below the floor (or within 1e-12 of it), and is set to 0.
AT_EXP_FLOOR = math.exp(FLOAT64_EXP_FLOOR) * (1.0 + 1e-12)


@jit
def _dot(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """``Σ_t x[t]·y[t]`` for ``t < m`` in four interleaved partial sums (fixed order: it vectorises
    without reassociation)."""
    a0, a1, a2, a3 = 0.0, 0.0, 0.0, 0.0
    t = 0
    while t + 4 <= m:
        a0 += x[t] * y[t]
        a1 += x[t + 1] * y[t + 1]
        a2 += x[t + 2] * y[t + 2]
        a3 += x[t + 3] * y[t + 3]
        t += 4
    while t < m:
        a0 += x[t] * y[t]
        t += 1
    return (a0 + a1) + (a2 + a3)


@jit
def _sum(x: np.ndarray, m: int) -> float:
    """``Σ_t x[t]`` for ``t < m`` in four interleaved partial sums (as :func:`_dot`)."""
    a0, a1, a2, a3 = 0.0, 0.0, 0.0, 0.0
    t = 0
    while t + 4 <= m:
        a0 += x[t]
        a1 += x[t + 1]
        a2 += x[t + 2]
        a3 += x[t + 3]
        t += 4
    while t < m:
        a0 += x[t]
        t += 1
    return (a0 + a1) + (a2 + a3)


@jit
def _diagonal_log_joint(
    points: np.ndarray,
    start: int,
    m: int,
    mu: np.ndarray,
    neg_half_precision: np.ndarray,
    const: float,
    row: np.ndarray,
) -> None:
    """``row[:m] = const + Σ_j p_j·(x_j - μ_j)²`` for the tile of ``m`` points from ``start`` of
    ``points`` (D, N), ``p`` the ``neg_half_precision``, added in the order of ``j`` four
    coordinates to a pass over the row (the same sums to the bit as one coordinate a pass, with a
    quarter of the row's loads and stores: 6-14 % faster a pass). The rows are sliced here: a
    row's slice is contiguous to numba, a slice of the rows is not, and would not vectorise."""
    dim = points.shape[0]
    tile = slice(start, start + m)
    for t in range(m):
        row[t] = const
    j = 0
    while j + 4 <= dim:
        x0, x1, x2, x3 = points[j, tile], points[j + 1, tile], points[j + 2, tile], points[j + 3, tile]
        c0, c1, c2, c3 = mu[j], mu[j + 1], mu[j + 2], mu[j + 3]
        q = neg_half_precision
        p0, p1, p2, p3 = q[j], q[j + 1], q[j + 2], q[j + 3]
        for t in range(m):
            total = row[t] + p0 * (x0[t] - c0) * (x0[t] - c0)
            total = total + p1 * (x1[t] - c1) * (x1[t] - c1)
            total = total + p2 * (x2[t] - c2) * (x2[t] - c2)
            row[t] = total + p3 * (x3[t] - c3) * (x3[t] - c3)
        j += 4
    while j < dim:
        x, centre, p = points[j, tile], mu[j], neg_half_precision[j]
        for t in range(m):
            row[t] += p * (x[t] - centre) * (x[t] - centre)
        j += 1


@jit
def _weighted_moments(x: np.ndarray, centre: float, r: np.ndarray, m: int) -> tuple[float, float]:
    """``(Σ_t r[t]·y[t], Σ_t r[t]·y[t]²)`` with ``y = x - centre``, for ``t < m``, in one pass of
    four interleaved partial sums each (as :func:`_dot`; 24 % faster than making ``y`` and
    ``r·y`` in buffers and summing them after, and the same sums to the bit)."""
    a0, a1, a2, a3 = 0.0, 0.0, 0.0, 0.0
    b0, b1, b2, b3 = 0.0, 0.0, 0.0, 0.0
    t = 0
    while t + 4 <= m:
        y0, y1, y2, y3 = x[t] - centre, x[t + 1] - centre, x[t + 2] - centre, x[t + 3] - centre
        d0, d1, d2, d3 = r[t] * y0, r[t + 1] * y1, r[t + 2] * y2, r[t + 3] * y3
        a0 += d0
        a1 += d1
        a2 += d2
        a3 += d3
        b0 += d0 * y0
        b1 += d1 * y1
        b2 += d2 * y2
        b3 += d3 * y3
        t += 4
    while t < m:
        y0 = x[t] - centre
        d0 = r[t] * y0
        a0 += d0
        b0 += d0 * y0
        t += 1
    return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)


@jit
def _posterior_tile(
    lp: np.ndarray,
    first: int,
    m: int,
    weights: np.ndarray,
    start: int,
    peak: np.ndarray,
    summed: np.ndarray,
    scratch: np.ndarray,
) -> float:
    """Turn the tile's log-joints ``lp[:, first : first + m]`` into weighted responsibilities in
    place; returns the tile's ``Σ w·log p(x)``, its rows' weights from ``weights[start]`` (unit
    weights when ``weights`` is empty). ``peak``, ``summed`` and ``scratch`` are buffers of a
    tile's length."""
    k = lp.shape[0]
    tile = slice(first, first + m)
    for t in range(m):
        peak[t] = lp[0, first + t]
    for c in range(1, k):
        row = lp[c, tile]
        for t in range(m):
            peak[t] = max(peak[t], row[t])
    for t in range(m):
        peak[t] = max(peak[t], LOWEST)  # a row impossible under every component stays -inf
        summed[t] = 0.0
    for c in range(k):
        row = lp[c, tile]
        for t in range(m):
            row[t] = max(row[t] - peak[t], FLOAT64_EXP_FLOOR)
        exp_nonpositive(row, scratch)
        for t in range(m):  # the terms that were below the floor: 0, as the torch step's
            row[t] = row[t] if row[t] > AT_EXP_FLOOR else 0.0
            summed[t] += row[t]
    objective = 0.0
    unit = len(weights) == 0
    for t in range(m):
        weight = 1.0 if unit else weights[start + t]
        if unit or weight > 0:
            objective += weight * (peak[t] + math.log(summed[t]))
        summed[t] = weight / max(summed[t], 1.0)
    for c in range(k):
        row = lp[c, tile]
        for t in range(m):
            row[t] *= summed[t]
    return objective


@jit
def block_posterior(lp: np.ndarray, weights: np.ndarray, start: int) -> float:
    """:func:`mixle_nb.stats.mixture.block_posterior` compiled, for a block's float64 log-joints
    ``lp`` (K, B) in a C-ordered array: turns them into weighted responsibilities in place and
    returns the block's ``Σ w·log p(x)``; the block's rows' weights are ``weights[start:]``
    (unit weights when ``weights`` is empty). A tile at a time, as the passes below take them."""
    n = lp.shape[1]
    peak, summed, scratch = np.empty(TILE), np.empty(TILE), np.empty(TILE)
    objective = 0.0
    for first in range(0, n, TILE):
        m = min(TILE, n - first)
        objective += _posterior_tile(lp, first, m, weights, start + first, peak, summed, scratch)
    return objective


@jit
def diagonal_pass(
    points: np.ndarray,
    weights: np.ndarray,
    mu: np.ndarray,
    sigma2: np.ndarray,
    log_w: np.ndarray,
    references: np.ndarray,
    sums: np.ndarray,
) -> float:
    """E-step of axis-aligned Gaussians (means ``mu``, variances ``sigma2``, (K, D); log-weights
    ``log_w``) over ``points`` (D, N): writes each component's value ``[Σw, Σw·r, Σw·d, Σw·d²]``
    about its reference ``r`` (``references`` (K, D), ``d = x - r``) into ``sums`` (K, 1 + 3D)
    and returns ``Σ w·log p(x)``."""
    dim, n = points.shape
    k = mu.shape[0]
    neg_half_precision = np.empty((k, dim))
    const = np.empty(k)
    for c in range(k):
        log_det = 0.0
        for j in range(dim):
            log_det += math.log(sigma2[c, j])
            neg_half_precision[c, j] = -0.5 / sigma2[c, j]
        const[c] = -0.5 * (dim * LOG_2PI + log_det) + log_w[c]
    sums[:] = 0.0
    lp = np.empty((k, TILE))
    peak, summed = np.empty(TILE), np.empty(TILE)
    scratch = np.empty(TILE)
    objective = 0.0
    for start in range(0, n, TILE):
        m = min(TILE, n - start)
        for c in range(k):
            _diagonal_log_joint(points, start, m, mu[c], neg_half_precision[c], const[c], lp[c])
        objective += _posterior_tile(lp, 0, m, weights, start, peak, summed, scratch)
        for c in range(k):
            r = lp[c]
            sums[c, 0] += _sum(r, m)
            for j in range(dim):
                first, second = _weighted_moments(points[j, start : start + m], references[c, j], r, m)
                sums[c, 1 + dim + j] += first
                sums[c, 1 + 2 * dim + j] += second
    _scaled_means(sums, references)
    return objective


@jit
def _scaled_means(sums: np.ndarray, mu: np.ndarray) -> None:
    """``Σw·μ`` of each component into its value's second part (the reference times its weight)."""
    for c in range(mu.shape[0]):
        for j in range(mu.shape[1]):
            sums[c, 1 + j] = sums[c, 0] * mu[c, j]


@jit
def full_pass(
    points: np.ndarray,
    weights: np.ndarray,
    mu: np.ndarray,
    prec_chol: np.ndarray,
    const: np.ndarray,
    references: np.ndarray,
    sums: np.ndarray,
) -> float:
    """E-step of full-covariance Gaussians (means ``mu`` (K, D)) over ``points`` (D, N): writes
    each component's value ``[Σw, Σw·r, Σw·d, Σw·ddᵀ]`` (the square flattened row-major) about its
    reference ``r`` (``references`` (K, D), ``d = x - r``) into ``sums`` (K, 1 + 2D + D²) and
    returns ``Σ w·log p(x)``; the log-joint is ``const_k - ½‖U_kᵀ (x - μ_k)‖²`` (``prec_chol``
    (K, D, D) the ``U_k`` of ``Σ_k⁻¹ = U_k U_kᵀ``; ``const`` with the log-weights)."""
    dim, n = points.shape
    k = mu.shape[0]
    sums[:] = 0.0
    lp = np.empty((k, TILE))
    peak, summed, z, rd = np.empty(TILE), np.empty(TILE), np.empty(TILE), np.empty(TILE)
    scratch = np.empty(TILE)
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
                    u = prec_chol[c, b, a]
                    if u != 0.0:  # U is triangular: half the products are with zeros
                        for t in range(m):
                            z[t] += u * d[b, t]
                for t in range(m):
                    row[t] -= 0.5 * z[t] * z[t]
        objective += _posterior_tile(lp, 0, m, weights, start, peak, summed, scratch)
        for c in range(k):
            r = lp[c]
            sums[c, 0] += _sum(r, m)
            for j in range(dim):
                x, centre = points[j, start : start + m], references[c, j]
                for t in range(m):
                    d[j, t] = x[t] - centre
            for a in range(dim):
                for t in range(m):
                    rd[t] = r[t] * d[a, t]
                sums[c, 1 + dim + a] += _sum(rd, m)
                for b in range(a, dim):
                    sums[c, 1 + 2 * dim + a * dim + b] += _dot(rd, d[b], m)
    for c in range(k):  # the lower triangle from the upper
        for a in range(dim):
            for b in range(a):
                sums[c, 1 + 2 * dim + a * dim + b] = sums[c, 1 + 2 * dim + b * dim + a]
    _scaled_means(sums, references)
    return objective


@jit
def labelled_pass(
    points: np.ndarray, weights: np.ndarray, labels: np.ndarray, centres: np.ndarray, full: bool, sums: np.ndarray
) -> None:
    """Hard-label statistics: writes each centre's value ``[Σw, Σw·c, Σw·d, Σw·d²]`` (or, ``full``,
    ``Σw·ddᵀ``) about that centre ``c`` (``centres`` (K, D)) over the points (D, N) labelled with
    it into ``sums`` (K, 1 + 2D + S); unit weights when ``weights`` is empty."""
    dim, n = points.shape
    sums[:] = 0.0
    unit = len(weights) == 0
    d = np.empty(dim)
    for i in range(n):
        c = labels[i]
        w = 1.0 if unit else weights[i]
        sums[c, 0] += w
        for a in range(dim):
            d[a] = points[a, i] - centres[c, a]
            sums[c, 1 + dim + a] += w * d[a]
        if full:
            for a in range(dim):
                wd = w * d[a]
                for b in range(dim):
                    sums[c, 1 + 2 * dim + a * dim + b] += wd * d[b]
        else:
            for a in range(dim):
                sums[c, 1 + 2 * dim + a] += w * d[a] * d[a]
    _scaled_means(sums, centres)

"""Forward–backward on the CPU as compiled loops (numba): a whole packed batch in one call.

The torch pass (:mod:`.forward_backward`) pays a few microseconds of per-call overhead for each
of the handful of operations a time step takes; compiled, a step is its arithmetic alone. Both
implementations keep the torch pass's numerics (which stays the reference, and the pass on any
other device):

- ``"scaling"`` (:mod:`.scaled_kernel`, which makes the emission terms and statistics of
  some families inside the pass): each column's emission probabilities relative to its
  largest, ``exp(log_b - peak)`` (no underflow however far an observation lies from every
  state), the forward variables divided by their sum ``c_t`` at every step, the backward ones
  by the same ``c_t``; its matrix–vector products combine four states a pass
  (:func:`combine_rows`, :func:`add_dots`), one load and store of the target per four products;
- ``"log"`` (:func:`log_forward`, :func:`log_backward`): the two time loops in
  log-probabilities, each step's sum over states taken about its largest term; the posteriors
  and expected transitions then in bulk, in torch.

The innermost loops run over the running sequences of a step (contiguous in the packed,
state-major layout) and vectorise; their exponentials are :func:`exp_nonpositive`'s, a
polynomial that vectorises (numba's ``math.exp`` is a scalar call, several times slower).
Sums are reassociated where they vectorise (fixed code, so the results stay deterministic) and
agree with the torch pass within 1e-12.

Compiled on first use (about 6 s of CPU for all of them, measured on a loaded 2-core Xeon) and
cached on disk (numba's ``cache=True``): a later process loads them in about 0.7 s (with
numba's import, which waits until a CPU pass first runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

LOWEST = np.finfo(np.float64).min
# exp's argument reduction (fdlibm's split of ln 2) and the shift that keeps 2**n normal
LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
TWO_TO_MINUS_600 = 2.0**-600


def jit(function: Callable[..., Any]) -> Any:
    """``function`` compiled by numba with this module's options: cached on disk, without the
    GIL, reassociation (the innermost sums vectorise) and fused multiply-adds allowed."""
    return numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})(function)


@jit
def exp_nonpositive(values: np.ndarray, scratch: np.ndarray) -> None:
    """``values = exp(values)`` in place for ``values <= 0`` (-inf included), in loops that
    vectorise (numba's ``math.exp`` is a scalar call, several times slower): ``x = n ln 2
    + r``, ``|r| <= ln 2 / 2``, ``exp(r)`` by its Taylor series to degree 12 (within 2 ulp),
    times ``2**(n + 600)`` (exact), times ``2**-600``, so that results below the normal range
    round as a plain product does. ``scratch`` (float64, at least as long) holds the powers of
    two: made in a buffer of their own, not in ``values``'s bits, the loops need no runtime
    check of two views of one array (measured: 13 % faster)."""
    powers = scratch[: len(values)]
    bits = powers.view(np.int64)
    for j in range(len(values)):
        x = max(values[j], -746.0)
        n = math.floor(x * LOG2E + 0.5)
        r = (x - n * LN2_HI) - n * LN2_LO
        p = 1.0 / 479001600.0
        for d in (39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0):
            p = p * r + 1.0 / d
        values[j] = p
        bits[j] = (np.int64(n) + 1623) << 52  # 2**(n + 600): n + 600 + 1023 in the exponent field
    for j in range(len(values)):
        values[j] = values[j] * powers[j] * TWO_TO_MINUS_600


@jit
def combine_rows(coefficients: np.ndarray, source: np.ndarray, m: int, target: np.ndarray) -> None:
    """``target[j] = Σ_i coefficients[i] source[i, j]`` for ``j < m``, four rows of ``source``
    a pass (each pass loads and stores ``target`` once: a row a pass is bound by those stores)."""
    k = len(coefficients)
    i = min(k, 4)
    c0 = coefficients[0]
    if i == 4:
        c1, c2, c3 = coefficients[1], coefficients[2], coefficients[3]
        for j in range(m):
            target[j] = c0 * source[0, j] + c1 * source[1, j] + c2 * source[2, j] + c3 * source[3, j]
    else:
        i = 1
        for j in range(m):
            target[j] = c0 * source[0, j]
    while i + 4 <= k:
        c0, c1, c2, c3 = coefficients[i], coefficients[i + 1], coefficients[i + 2], coefficients[i + 3]
        for j in range(m):
            target[j] += c0 * source[i, j] + c1 * source[i + 1, j] + c2 * source[i + 2, j] + c3 * source[i + 3, j]
        i += 4
    while i < k:
        c0 = coefficients[i]
        for j in range(m):
            target[j] += c0 * source[i, j]
        i += 1


@jit
def add_dots(row: np.ndarray, others: np.ndarray, m: int, out: np.ndarray) -> None:
    """``out[s] += Σ_j row[j] others[s, j]`` for ``j < m``, four rows of ``others`` a pass (one
    load of ``row`` for four products)."""
    k = others.shape[0]
    s = 0
    while s + 4 <= k:
        d0, d1, d2, d3 = 0.0, 0.0, 0.0, 0.0
        for j in range(m):
            x = row[j]
            d0 += x * others[s, j]
            d1 += x * others[s + 1, j]
            d2 += x * others[s + 2, j]
            d3 += x * others[s + 3, j]
        out[s] += d0
        out[s + 1] += d1
        out[s + 2] += d2
        out[s + 3] += d3
        s += 4
    while s < k:
        d0 = 0.0
        for j in range(m):
            d0 += row[j] * others[s, j]
        out[s] += d0
        s += 1


@jit
def log_sum_product(
    terms: np.ndarray, first: int, n: int, matrix: np.ndarray, work: np.ndarray, out: np.ndarray, at: int
) -> None:
    """``out[s, at + j] = log Σ_i exp(terms[i, first + j]) matrix[i, s]`` for ``j < n``,
    the sum taken about each column's largest term (at least ``LOWEST``); ``work`` (2K + 2,
    at least n) is scratch."""
    k = terms.shape[0]
    top, exps, sums, scratch = work[k], work[:k], work[k + 1 : 2 * k + 1], work[2 * k + 1]
    for j in range(n):
        top[j] = LOWEST
    for i in range(k):
        row = terms[i, first : first + n]
        for j in range(n):
            top[j] = max(top[j], row[j])
    for i in range(k):
        row, e = terms[i, first : first + n], exps[i]
        for j in range(n):
            e[j] = row[j] - top[j]
        exp_nonpositive(e[:n], scratch)
    for s in range(k):
        total = sums[s]
        for j in range(n):
            total[j] = 0.0
        for i in range(k):
            a, e = matrix[i, s], exps[i]
            for j in range(n):
                total[j] += a * e[j]
        target = out[s, at : at + n]
        for j in range(n):
            target[j] = math.log(total[j]) + top[j]


@jit
def log_forward(
    log_b: np.ndarray,
    sizes: np.ndarray,
    offsets: np.ndarray,
    log_start: np.ndarray,
    transmat: np.ndarray,
    la: np.ndarray,
    work: np.ndarray,
) -> None:
    """Forward log-variables ``la`` (K, rows): ``la_t = log Σ_i exp(la_{t-1, i}) A_i + log b_t``."""
    k = log_b.shape[0]
    for s in range(k):
        for j in range(sizes[0]):
            la[s, j] = log_start[s] + log_b[s, j]
    for t in range(1, len(sizes)):
        n, o = sizes[t], offsets[t]
        log_sum_product(la, offsets[t - 1], n, transmat, work, la, o)
        for s in range(k):
            row, emission = la[s, o : o + n], log_b[s, o : o + n]
            for j in range(n):
                row[j] += emission[j]


@jit
def log_backward(
    log_b: np.ndarray,
    sizes: np.ndarray,
    offsets: np.ndarray,
    transposed: np.ndarray,
    lbeta: np.ndarray,
    after: np.ndarray,
    work: np.ndarray,
) -> None:
    """Backward log-variables ``lbeta`` (K, rows), 0 at each sequence's last step, and
    ``after = log b + lbeta``: ``lbeta_{t-1} = log Σ_s A_s exp(after_t, s)``."""
    k = log_b.shape[0]
    last = len(sizes) - 1
    o = offsets[last]
    for s in range(k):
        for j in range(sizes[last]):
            lbeta[s, o + j] = 0.0
            after[s, o + j] = log_b[s, o + j]
    for t in range(last, 0, -1):
        n, o, n_prev, p = sizes[t], offsets[t], sizes[t - 1], offsets[t - 1]
        log_sum_product(after, o, n, transposed, work, lbeta, p)
        for s in range(k):
            row, emission, total = lbeta[s, p : p + n_prev], log_b[s, p : p + n_prev], after[s, p : p + n_prev]
            for j in range(n, n_prev):
                row[j] = 0.0  # these sequences end at step t - 1
            for j in range(n_prev):
                total[j] = emission[j] + row[j]


@jit
def gather_columns(table: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    """``out[k, r] = table[k, index[r]]``: each row's entry of a per-state table."""
    for s in range(table.shape[0]):
        row, target = table[s], out[s]
        for r in range(len(index)):
            target[r] = row[index[r]]


@jit
def scatter_columns(values: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    """``out[k, i] = Σ_{r: index[r] = i} values[k, r]``, in row order. Row by row, each row's
    K additions go to K different counts: runs of one label (an HMM's sticky states) make no
    chain of additions into one count, waiting on each other, as a state-by-state loop does."""
    out[:] = 0.0
    k = values.shape[0]
    for r in range(len(index)):
        i = index[r]
        for s in range(k):
            out[s, i] += values[s, r]


@jit
def diagonal_log_b(
    points: np.ndarray, mu: np.ndarray, neg_half_precision: np.ndarray, const: np.ndarray, out: np.ndarray
) -> None:
    """``out[k, r] = const_k + Σ_d neg_half_precision[k, d] (points[d, r] - mu[k, d])²``: each
    state's axis-aligned Gaussian log-density of each point, centred on the state's mean. The
    first dimension's pass writes the row (the constant with it), the others add to it: one
    pass over the (K, N) output per dimension."""
    for s in range(mu.shape[0]):
        row, bias = out[s], const[s]
        for d in range(points.shape[0]):
            x, centre, factor = points[d], mu[s, d], neg_half_precision[s, d]
            if d == 0:
                for r in range(points.shape[1]):
                    y = x[r] - centre
                    row[r] = bias + factor * y * y
            else:
                for r in range(points.shape[1]):
                    y = x[r] - centre
                    row[r] += factor * y * y


@jit
def centred_sums(points: np.ndarray, mu: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    """``out[k] = [Σ w, Σ w (x - mu_k), Σ w (x - mu_k)²]`` (1 + 2D) over the points, ``w`` row
    ``k`` of ``weights`` (K, N); ``Σ w`` in the first dimension's pass, so that 1-D data reads
    the weights once."""
    dim = points.shape[0]
    for s in range(mu.shape[0]):
        w = weights[s]
        for d in range(dim):
            x, centre = points[d], mu[s, d]
            total, first, second = 0.0, 0.0, 0.0
            for r in range(points.shape[1]):
                y = x[r] - centre
                total += w[r]
                first += w[r] * y
                second += w[r] * y * y
            out[s, 0] = total  # the same sum in every dimension's pass
            out[s, 1 + d] = first
            out[s, 1 + dim + d] = second

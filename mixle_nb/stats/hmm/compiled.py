"""Forward–backward on the CPU as compiled loops (numba): a whole packed batch in one call.

The torch pass (:mod:`.forward_backward`) pays a few microseconds of per-call overhead for each
of the handful of operations a time step takes; compiled, a step of 1,000 sequences x 8 states
is its arithmetic alone. Both implementations keep the torch pass's numerics:

- ``"scaling"``: each column's emission probabilities relative to its largest (no underflow
  however far an observation lies from every state), the forward variables divided by their
  sum at every step (the scaling factor ``c_t``), the backward ones by the same ``c_t``;
- ``"log"``: log-probabilities, each step's sum over states taken about its largest term.

Loops run over time steps outside, states, then the running sequences inside (contiguous in
the packed, state-major ``(K, rows)`` layout, so the innermost loops vectorise); sums over
sequences (the expected transitions) go into one partial sum per sequence and are added up at
the end, so no floating-point sum is reordered and the results are deterministic. The
exponentials of the scaled pass are NumPy's (vectorised: several times a scalar ``exp``).

Compiled on first use (about 2 s per implementation) and cached on disk (numba's
``cache=True``) for later processes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

LOWEST = np.finfo(np.float64).min
# Sequences a scaled pass works at once (the innermost loops' length): their lattices, steps x
# states x TILE, stay in the cache from the forward pass to the backward
TILE = 256
# Columns whose emission probabilities are made at once (K x BLOCK: a cache-sized block)
BLOCK = 16384


@functools.cache
def kernels() -> SimpleNamespace:
    """The compiled kernels, built (or loaded from numba's cache) on the first call."""
    import numba

    jit = functools.partial(numba.njit, cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})

    @jit
    def shifted(log_b: np.ndarray, first: int, end: int, peak: np.ndarray, out: np.ndarray) -> None:
        """Columns ``first:end``: ``peak`` each column's largest log-term (at least ``LOWEST``),
        ``out = log_b - peak``."""
        k = log_b.shape[0]
        top = peak[first:end]
        for j in range(end - first):
            top[j] = LOWEST
        for s in range(k):
            row = log_b[s, first:end]
            for j in range(end - first):
                top[j] = max(top[j], row[j])
        for s in range(k):
            row, shifted_row = log_b[s, first:end], out[s, first:end]
            for j in range(end - first):
                shifted_row[j] = row[j] - top[j]

    @jit
    def scaled_tiles(
        b: np.ndarray,
        peak: np.ndarray,
        sizes: np.ndarray,
        offsets: np.ndarray,
        startprob: np.ndarray,
        transmat: np.ndarray,
        weights: np.ndarray,
        posteriors: bool,
        alpha: np.ndarray,
        scale: np.ndarray,
        log_likelihood: np.ndarray,
        start: np.ndarray,
        transitions: np.ndarray,
    ) -> None:
        """The scaled pass, ``TILE`` sequences at a time (each tile's lattices, ``alpha``
        (steps, K, TILE) and ``scale`` (steps, TILE), stay in the cache). Forward: ``alpha_t``
        normalised by ``c_t``; backward: ``u_t = b_t beta_t / c_t``, ``beta_{t-1} = A u_t``.
        With ``posteriors``, each column's posterior ``alpha beta`` times its sequence's weight
        replaces ``b`` there (read just before), and the expected starts and transitions
        ``Σ_t alpha_{t-1} u_tᵀ * A`` are summed."""
        k = b.shape[0]
        n0 = sizes[0]
        work = np.empty((k + 1, TILE))
        beta = np.empty((k, TILE))
        u = np.empty((k, TILE))
        uw = np.empty((k, TILE))
        start[:] = 0.0
        transitions[:] = 0.0
        for j0 in range(0, n0, TILE):
            # forward: step t holds the tile's first m = min(sizes[t] - j0, TILE) sequences
            steps = 0
            while steps < len(sizes) and sizes[steps] > j0:
                steps += 1
            total = work[k]
            ll = log_likelihood[j0 : j0 + min(TILE, n0 - j0)]
            for j in range(len(ll)):
                ll[j] = 0.0
            for t in range(steps):
                m, o = min(sizes[t] - j0, TILE), offsets[t] + j0
                if t == 0:
                    for s in range(k):
                        start_s, out, b_s = startprob[s], work[s, :m], b[s, o : o + m]
                        for j in range(m):
                            out[j] = start_s * b_s[j]
                else:
                    for s in range(k):
                        out = work[s, :m]
                        for j in range(m):
                            out[j] = 0.0
                    for i in range(k):
                        previous = alpha[t - 1, i, :m]
                        for s in range(k):
                            a, out = transmat[i, s], work[s, :m]
                            for j in range(m):
                                out[j] += a * previous[j]
                    for s in range(k):
                        out, b_s = work[s, :m], b[s, o : o + m]
                        for j in range(m):
                            out[j] *= b_s[j]
                for j in range(m):
                    total[j] = 0.0
                for s in range(k):
                    out = work[s, :m]
                    for j in range(m):
                        total[j] += out[j]
                c, top = scale[t, :m], peak[o : o + m]
                for j in range(m):
                    c[j] = total[j]
                    ll[j] += math.log(total[j]) + top[j]
                    total[j] = 1.0 / total[j]
                for s in range(k):
                    out, alpha_s = work[s, :m], alpha[t, s, :m]
                    for j in range(m):
                        alpha_s[j] = out[j] * total[j]
            if not posteriors:
                continue
            # backward, from the tile's last step
            beta[:] = 1.0
            w = weights[j0 : j0 + len(ll)]
            for t in range(steps - 1, -1, -1):
                m, o = min(sizes[t] - j0, TILE), offsets[t] + j0
                c = scale[t, :m]
                for s in range(k):
                    b_s, beta_s, alpha_s, u_s = b[s, o : o + m], beta[s, :m], alpha[t, s, :m], u[s, :m]
                    for j in range(m):
                        u_s[j] = b_s[j] * beta_s[j] / c[j]
                        b_s[j] = alpha_s[j] * beta_s[j] * w[j]
                if t == 0:
                    break
                m_prev = min(sizes[t - 1] - j0, TILE)
                for s in range(k):
                    u_s, uw_s = u[s, :m], uw[s, :m]
                    for j in range(m):
                        uw_s[j] = u_s[j] * w[j]
                for i in range(k):
                    previous = alpha[t - 1, i, :m]
                    for s in range(k):
                        uw_s = uw[s, :m]
                        dot = 0.0
                        for j in range(m):
                            dot += previous[j] * uw_s[j]
                        transitions[i, s] += dot
                for i in range(k):
                    beta_i = beta[i, :m_prev]
                    for j in range(m):
                        beta_i[j] = 0.0
                    for j in range(m, m_prev):
                        beta_i[j] = 1.0  # these sequences end at step t - 1
                    for s in range(k):
                        a, u_s = transmat[i, s], u[s, :m]
                        for j in range(m):
                            beta_i[j] += a * u_s[j]
            for s in range(k):
                b_s = b[s, j0 : j0 + len(ll)]
                for j in range(len(ll)):
                    start[s] += b_s[j]
        for i in range(k):
            for s in range(k):
                transitions[i, s] *= transmat[i, s]

    @jit
    def log_sum_product(
        terms: np.ndarray, first: int, n: int, matrix: np.ndarray, work: np.ndarray, out: np.ndarray, at: int
    ) -> None:
        """``out[s, at + j] = log Σ_i exp(terms[i, first + j]) matrix[i, s]`` for ``j < n``,
        the sum taken about each column's largest term (at least ``LOWEST``)."""
        k = terms.shape[0]
        top, exps, sums = work[k], work[:k], work[k + 1 :]
        for j in range(n):
            top[j] = LOWEST
        for i in range(k):
            row = terms[i, first : first + n]
            for j in range(n):
                top[j] = max(top[j], row[j])
        for i in range(k):
            row, e = terms[i, first : first + n], exps[i]
            for j in range(n):
                e[j] = math.exp(row[j] - top[j])
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
        log_b: np.ndarray, sizes: np.ndarray, offsets: np.ndarray, log_start: np.ndarray, transmat: np.ndarray,
        la: np.ndarray, work: np.ndarray,
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
        log_b: np.ndarray, sizes: np.ndarray, offsets: np.ndarray, transposed: np.ndarray,
        lbeta: np.ndarray, after: np.ndarray, work: np.ndarray,
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

    return SimpleNamespace(
        shifted=shifted, scaled_tiles=scaled_tiles, log_forward=log_forward, log_backward=log_backward
    )


def scaled_pass(
    log_b: np.ndarray,
    sizes: np.ndarray,
    offsets: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    weights: np.ndarray,
    posteriors: bool,
    buffer: Callable[[str, tuple], np.ndarray],
) -> tuple:
    """The scaled forward–backward of one packed batch (state-major ``log_b`` (K, rows)).

    ``weights`` (B,) weigh each sequence's statistics; ``buffer(name, shape)`` gives reusable
    float64 scratch arrays. Returns the log-likelihoods (B,) and, with ``posteriors``, the
    weighted posteriors (K, rows) (in the ``"emissions"`` buffer), the expected starts (K,)
    and transitions (K, K)."""
    compiled = kernels()
    k, rows = log_b.shape
    n0 = int(sizes[0])
    peak = buffer("peak", (rows,))
    b = buffer("emissions", (k, rows))
    for first in range(0, rows, BLOCK):  # a block's exponentials while it is in the cache
        end = min(rows, first + BLOCK)
        compiled.shifted(log_b, first, end, peak, b)
        np.exp(b[:, first:end], out=b[:, first:end])
    steps = len(sizes)
    log_likelihood, start, transitions = np.empty(n0), np.empty(k), np.empty((k, k))
    compiled.scaled_tiles(
        b, peak, sizes, offsets, startprob, transmat, weights, posteriors,
        buffer("forward", (steps, k, TILE)), buffer("scale", (steps, TILE)), log_likelihood, start, transitions,
    )
    if not posteriors:
        return log_likelihood, None, None, None
    return log_likelihood, b, start, transitions

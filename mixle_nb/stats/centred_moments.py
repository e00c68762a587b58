"""Gaussian statistics about a reference point, and the M-steps that read them.

An accumulator's value is ``[n, n·c, S1, S2]``: the weight ``n = Σw``, the reference point
``c`` (D,) times ``n``, and the centred sums ``S1 = Σw(x - c)`` and ``S2 = Σw(x - c)²`` per
coordinate (diagonal families) or ``Σw(x - c)(x - c)ᵀ`` flattened (full). The mean is
``c + S1/n`` and the (co)variance ``S2/n - (S1/n)²``, which keeps its digits because ``c``
is near the data: during EM the model's component mean, or the mean of its component means
when they are near each other (:mod:`.frame`'s shared frame), the k-means centre for a k-means
start, the first observation for a local random start.

Why ``n·c`` and not ``c``: under one model every rank centres on the same ``c``, so every
number in the value is a plain sum and the handle's fold adds them as one vector (``c`` itself
would not add). ``combine`` of values about different references (keys that tie components,
a random start's chunks) first moves one to the other's reference, exactly in algebra.

``init='random'`` on a multi-rank handle has no model and no shared point, so it sums about
the origin: beyond ``|mean| / σ ≈ 1e6`` such a start's variances are below rounding and are
taken as 0, i.e. ``reg_covar`` (k-means starts, the default, centre on their centres).

Degenerate components raise :class:`DegenerateComponentError`: one with no weight, or whose
variance is 0 to within rounding (collapsed onto one point) when ``reg_covar`` is 0. With
``reg_covar > 0`` a collapsed component gets variance ``reg_covar``, as in scikit-learn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import Accumulator, Encoder, merge_into
from .frame import CentredBlock, PointEncoding, SharedFrameBlock, centred, moved, weighted_sums

# A variance below this fraction of the mean squared difference to the reference has lost
# all but ~3 of its digits to cancellation; it is taken as 0 (collapsed, or unresolvable).
RESOLUTION = 1e4 * np.finfo(np.float64).eps
NO_WEIGHT_FIX = "start elsewhere (another seed, init='kmeans++') or fit fewer components"
COLLAPSE_FIX = "set reg_covar > 0 (scikit-learn's default is 1e-6), fit fewer components, or start elsewhere"


class DegenerateComponentError(ValueError):
    """The M-step cannot estimate a component: it has no weight, or it collapsed.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import DegenerateComponentError, MultivariateGaussianEstimator, seq_encode, seq_estimate
    >>> x = np.array([[0.0, 1.0], [2.0, 5.0]])  # two points: a covariance of rank 1
    >>> estimator = MultivariateGaussianEstimator(reg_covar=0.0)
    >>> try:
    ...     seq_estimate(seq_encode(x, estimator=estimator), estimator, None)
    ... except DegenerateComponentError as error:
    ...     print(str(error)[:60])
    collapsed in the M-step: its covariance is singular to withi
    """


def check_reg_covar(reg_covar: float) -> float:
    """``reg_covar`` as a float: finite and >= 0."""
    value = float(reg_covar)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"reg_covar must be a finite number >= 0 (scikit-learn's default is 1e-6); got {reg_covar!r}")
    return value


def _dim(size: int, full: bool) -> int:
    return math.isqrt(size) - 1 if full else (size - 1) // 3


def _split(stats: np.ndarray, full: bool) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """Views ``n, n·c, S1, S2`` of a value (S2 (D, D) when ``full``)."""
    d = _dim(len(stats), full)
    s2 = stats[1 + 2 * d :]
    return stats[0], stats[1 : 1 + d], stats[1 + d : 1 + 2 * d], s2.reshape(d, d) if full else s2


class CentredMoments(Accumulator):
    """Weighted Gaussian statistics about a reference point (see the module docstring).

    ``tie_key`` (a family's ``variance_key`` / ``covariance_key``) pools the within-component
    scatter ``S2 - S1·S1ᵀ/n`` of every accumulator with that key: one shared (co)variance,
    each component keeping its own mean, as scikit-learn's ``"tied"``.
    """

    def __init__(
        self, dim: int | None, keys: str | None, encoder: Encoder, tie_key: str | None = None, full: bool = False
    ):
        self.full, self.keys, self.encoder, self.tie_key = full, keys, encoder, tie_key
        self.stats = np.zeros(0 if dim is None else 1 + 2 * dim + (dim * dim if full else dim))
        self.reference: np.ndarray | None = None

    def set_reference(self, point: ArrayLike) -> None:
        """Centre the sums to come at ``point`` (a start with no model; before any update)."""
        if self.stats.size == 0 or self.stats[0] == 0:
            self.reference = np.array(point, dtype=np.float64).reshape(-1)

    def _reference_for(self, model: Any, enc: PointEncoding) -> np.ndarray:
        """The model's mean; without a model, this accumulator's reference, else the origin."""
        if model is not None:
            return np.atleast_1d(np.asarray(model.mu, dtype=np.float64))
        return self.reference if self.reference is not None else np.zeros(enc.dim)

    def add_sums(self, reference: np.ndarray, sums: np.ndarray) -> None:
        """Add ``[n, S1, S2]`` taken about ``reference``."""
        d = len(reference)
        if self.stats.size == 0:
            self.stats = np.zeros(1 + 2 * d + (d * d if self.full else d))
        n, nc, s1, s2 = _split(self.stats, self.full)
        add_n, add_s1 = sums[0], sums[1 : 1 + d]
        add_s2 = sums[1 + d :].reshape(s2.shape)
        if self.reference is None or (n == 0 and not np.array_equal(reference, self.reference)):
            self.reference = np.array(reference, dtype=np.float64)
        elif not np.array_equal(reference, self.reference):
            add_s1, add_s2 = moved(add_n, add_s1, add_s2, reference - self.reference, self.full)
        self.stats[0] += add_n
        s1 += add_s1
        s2 += add_s2
        nc[:] = self.stats[0] * self.reference

    def value(self) -> np.ndarray:
        return self.stats.copy()

    def from_value(self, value: ArrayLike) -> CentredMoments:
        self.stats = np.array(value, dtype=np.float64)
        self.reference = None
        if self.stats.size:
            n, nc, _, _ = _split(self.stats, self.full)
            if n > 0:
                self.reference = nc / n
        return self

    def combine(self, value: ArrayLike) -> CentredMoments:
        """Add another value; one about another reference is first moved to this one's."""
        value = np.asarray(value, dtype=np.float64)
        if value.size == 0:
            return self
        n, nc, s1, s2 = _split(value, self.full)
        if n == 0:
            return self
        if self.stats.size == 0 or self.stats[0] == 0:
            return self.from_value(value + (self.stats if self.stats.size else 0.0))
        reference = nc / n
        if self.reference is not None and np.array_equal(reference, self.reference):
            self.stats += value
        else:
            self.add_sums(reference, np.concatenate([[n], s1, s2.reshape(-1)]))
        return self

    def key_merge(self, stats: dict) -> None:
        super().key_merge(stats)
        if self.tie_key is not None and self.stats.size:
            n, _, s1, s2 = _split(self.stats, self.full)
            within = (s2 - (np.outer(s1, s1) if self.full else s1 * s1) / n) if n > 0 else 0 * s2
            merge_into(stats, self.tie_key, np.concatenate([[n], within.reshape(-1)]))

    def key_replace(self, stats: dict) -> None:
        super().key_replace(stats)
        if self.tie_key is not None and self.stats.size:
            pooled = stats[self.tie_key].stats
            n, _, s1, s2 = _split(self.stats, self.full)
            if n > 0 and pooled[0] > 0:  # rewrite S2 so this component's M-step yields the pooled scatter
                s2[...] = (
                    n * pooled[1:].reshape(s2.shape) / pooled[0] + (np.outer(s1, s1) if self.full else s1 * s1) / n
                )

    def seq_update(self, enc: PointEncoding, weights: np.ndarray | torch.Tensor | None, model: Any) -> None:
        reference = self._reference_for(model, enc)
        self.add_sums(reference, weighted_sums(enc, weights, reference[None], self.full)[0])

    @staticmethod
    def stacked_seq_update(
        accumulators: Sequence[CentredMoments],
        enc: PointEncoding,
        resp: torch.Tensor,
        block: CentredBlock | SharedFrameBlock | None = None,
        references: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add column k of ``resp`` as the weights of accumulator k, about the E-step's
        ``block`` references, else ``references``, else each accumulator's own; returns each
        one's weight total."""
        full = accumulators[0].full
        if any(acc.full != full for acc in accumulators):  # diagonal and full components in one mixture
            own: np.ndarray | Sequence[np.ndarray]
            if references is not None:
                own = references
            elif block is not None:
                own = block.references
            else:
                own = [acc._reference_for(None, enc) for acc in accumulators]
            for acc, reference, w in zip(accumulators, own, resp):
                acc.add_sums(reference, weighted_sums(enc, w, reference[None], acc.full)[0])
            return resp.sum(dim=1, dtype=torch.float64).cpu().numpy()
        if block is None:
            if references is None:
                references = np.stack([acc._reference_for(None, enc) for acc in accumulators])
            block = centred(enc, np.asarray(references, dtype=np.float64))
        sums = block.sums(resp, full)
        for acc, reference, row in zip(accumulators, block.references, sums):
            acc.add_sums(reference, row)
        return sums[:, 0]

    @staticmethod
    def stacked_block_sums(accumulators: Sequence[CentredMoments]) -> BlockSums | None:
        """An E-step's :class:`BlockSums` for these accumulators; ``None`` when diagonal and
        full ones are mixed (each then takes its own sums, block by block)."""
        full = accumulators[0].full
        return BlockSums(accumulators) if all(acc.full == full for acc in accumulators) else None

    def acc_to_encoder(self) -> Encoder:
        return self.encoder


def pooled_values(values: np.ndarray, full: bool) -> np.ndarray:
    """Stacked values (K, 1 + 2D + S) of components that share one (co)variance, tied as
    :meth:`CentredMoments.key_merge` and :meth:`CentredMoments.key_replace` tie them: each
    component's within scatter ``S2 - S1·S1ᵀ/n`` added up in component order, and every ``S2``
    rewritten so that its M-step yields the pooled scatter (a copy; components of no weight kept).
    The same arithmetic as theirs, in place on the weighed rows (at K = 32, D = 64 a tenth of the
    passes over K·D² floats that whole-array temporaries took)."""
    d = _dim(values.shape[1], full)
    tied = values.copy()
    n = values[:, 0]
    rows = np.flatnonzero(n > 0)
    pooled_n = 0.0
    for count in n.tolist():  # in component order, as key_merge adds them
        pooled_n += count
    if len(rows) == 0 or pooled_n <= 0:
        return tied
    counts, s1 = n[rows, None], values[rows, 1 + d : 1 + 2 * d]
    own = (s1[:, :, None] * s1[:, None, :]).reshape(len(rows), -1) if full else s1 * s1
    own /= counts  # each component's S1·S1ᵀ/n
    within = values[rows, 1 + 2 * d :] - own
    pooled = within.sum(axis=0)  # a (K, S) array's sum over axis 0 adds its rows in order
    within = np.multiply(counts, pooled, out=within)
    within /= pooled_n
    within += own
    tied[rows, 1 + 2 * d :] = within
    return tied


class BlockSums:
    """An E-step's weighted sums for accumulator k from row k of each block's responsibilities,
    added up on the device block by block (the blocks of one model on one encoding: the same
    references and layout), and handed to the accumulators once, after the last block."""

    def __init__(self, accumulators: Sequence[CentredMoments]):
        self.accumulators, self.full = accumulators, accumulators[0].full
        self.total: torch.Tensor | None = None
        self.block: CentredBlock | SharedFrameBlock | None = None

    def add(self, block: CentredBlock | SharedFrameBlock, resp: torch.Tensor) -> None:
        sums = block.device_sums(resp, self.full)
        self.total = sums if self.total is None else self.total.add_(sums)
        self.block = block

    def hand_over(self) -> np.ndarray:
        """Add the sums to the accumulators; returns each one's weight total."""
        if self.total is None or self.block is None:
            return np.zeros(len(self.accumulators))
        rows = self.block.rows(self.total, self.full)
        for acc, reference, row in zip(self.accumulators, self.block.references, rows):
            acc.add_sums(reference, row)
        return rows[:, 0]


def _centred_parts(value: np.ndarray, full: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n``, the mean and the mean squared difference (``S2/n``) from a value; raises when
    the component has no weight."""
    n, nc, s1, s2 = _split(np.asarray(value, dtype=np.float64), full)
    if not n > 0:
        raise DegenerateComponentError(
            f"received no weight in the M-step (its responsibilities sum to {float(n)!r}): "
            f"it has nothing to estimate from. Fix: {NO_WEIGHT_FIX}"
        )
    shift = s1 / n
    mean = nc / n + shift
    if not (np.isfinite(mean).all() and np.isfinite(s2).all()):
        raise DegenerateComponentError(f"has non-finite statistics in the M-step. Fix: {NO_WEIGHT_FIX}")
    return mean, shift, s2 / n


@overload
def diagonal_estimate(
    value: np.ndarray, reg_covar: float, spherical: Literal[False] = False
) -> tuple[np.ndarray, np.ndarray]: ...


@overload
def diagonal_estimate(value: np.ndarray, reg_covar: float, spherical: Literal[True]) -> tuple[np.ndarray, float]: ...


def diagonal_estimate(
    value: np.ndarray, reg_covar: float, spherical: bool = False
) -> tuple[np.ndarray, np.ndarray | float]:
    """Means and variances (D,) from a diagonal value, ``reg_covar`` added; ``spherical``: the
    variance is the coordinates' mean (a float)."""
    mean, shift, second = _centred_parts(value, False)
    variance = second - shift * shift
    variance = np.where(variance > RESOLUTION * second, variance, 0.0)
    if spherical:
        variance = float(variance.mean())
    variance = variance + reg_covar
    if (np.asarray(variance) <= 0).any():
        where = "" if spherical else f" in coordinate {int(np.argmax(np.atleast_1d(variance) <= 0))}"
        raise DegenerateComponentError(
            f"collapsed onto a single point in the M-step: its variance{where} is 0 "
            f"to within rounding. Fix: {COLLAPSE_FIX}"
        )
    return mean, variance


def full_estimate(value: np.ndarray, reg_covar: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean (D,), covariance (D, D) and its Cholesky factor from a full value, ``reg_covar``
    added to the diagonal."""
    mean, shift, second = _centred_parts(value, True)
    covar = second - np.outer(shift, shift)
    covar = 0.5 * (covar + covar.T)
    covar[np.diag_indices(len(mean))] += reg_covar
    try:
        chol = np.linalg.cholesky(covar)
    except np.linalg.LinAlgError:
        chol = None
    # each coordinate's conditional variance, against its own scale (features may differ by 1e6)
    if chol is None or (reg_covar == 0 and np.any(np.diag(chol) ** 2 <= RESOLUTION * np.diag(second))):
        raise DegenerateComponentError(
            "collapsed in the M-step: its covariance is singular to within rounding (its data lie on "
            f"one point or a lower-dimensional set). Fix: {COLLAPSE_FIX}"
        )
    return mean, covar, chol


def stacked_estimate(
    values: Sequence[np.ndarray], reg_covar: float, full: bool, spherical: bool = False, tied: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """:func:`diagonal_estimate` or :func:`full_estimate` of K components at once, the same
    arithmetic on stacked arrays (one batched Cholesky; ``values`` a sequence of K values or
    one (K, size) float64 array): means (K, D), variances (K, D) or
    (K,) (``spherical``) or covariances (K, D, D) and their Cholesky factors (``full``).
    With ``tied`` (values pooled by :func:`pooled_values`, each row's M-step the same covariance
    to rounding) only the first row's covariance is made: one (1, D, D) and its factor.
    ``None`` when any component is degenerate: the per-component estimates then raise, with
    their messages."""
    if isinstance(values, np.ndarray) and values.ndim == 2:
        stats = values
    elif len({np.size(v) for v in values}) != 1:
        return None
    else:
        stats = np.array([np.asarray(v, dtype=np.float64) for v in values])
    d = _dim(stats.shape[1], full)
    n = stats[:, :1]
    if d == 0 or not (n > 0).all():
        return None
    shift = stats[:, 1 + d : 1 + 2 * d] / n
    mean = stats[:, 1 : 1 + d] / n + shift
    s2 = stats[:, 1 + 2 * d :]
    if not (np.isfinite(mean).all() and np.isfinite(s2).all()):
        return None
    if not full:
        second = s2 / n
        variance = second - shift * shift
        variance = np.where(variance > RESOLUTION * second, variance, 0.0)
        if spherical:
            variance = variance.mean(axis=1)
        variance = variance + reg_covar
        return (mean, variance, None) if (variance > 0).all() else None
    if tied:
        stats, n, shift, s2 = stats[:1], n[:1], shift[:1], s2[:1]
    second = s2.reshape(len(stats), d, d) / n[:, :, None]
    covar = second - shift[:, :, None] * shift[:, None, :]
    covar = 0.5 * (covar + np.swapaxes(covar, 1, 2))
    diagonal = np.arange(d)
    covar[:, diagonal, diagonal] += reg_covar
    try:
        chol = np.linalg.cholesky(covar)
    except np.linalg.LinAlgError:
        return None
    if reg_covar == 0 and (chol[:, diagonal, diagonal] ** 2 <= RESOLUTION * second[:, diagonal, diagonal]).any():
        return None
    return mean, covar, chol

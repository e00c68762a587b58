"""One EM step of a Gaussian mixture on small local data: the compiled pass of
:mod:`.fused_kernels`, then the estimator's own M-step.

The general step (:func:`~mixle_nb.stats.estimation.em_step`) walks a fold of accumulator
objects, a kernel object and a dozen torch calls a block; at a few thousand rows that overhead,
not the arithmetic, is the step. This step takes the same statistics in one compiled call and
hands them to the same M-step (:meth:`MixtureEstimator.estimate`, the families'
``stacked_estimate`` and their degenerate-component errors): the values are exactly what
:class:`~mixle_nb.stats.centred_moments.CentredMoments` would hold about the points the torch
kernels centre on (:func:`~mixle_nb.stats.frame.shared_point`), and a tied covariance is pooled by :func:`~mixle_nb.stats.centred_moments.pooled_values`, the
key-tying's arithmetic on stacked values. Both steps agree within 1e-12 (``tests/test_fused_step.py``).

It applies to a local float64 encoding on the CPU of at most ``FUSED_MAX_ELEMENTS`` rows times
components (and ``FUSED_MAX_WORK`` of those times D, or D² for a full covariance,
``FUSED_MAX_TIED_WORK`` for a tied one below ``TIED_STEP_DIM`` dimensions), fitted by our
:class:`MixtureEstimator` of one Gaussian family (diagonal, spherical or full; untied or with one
tied (co)variance) under a model of the same family; anything else takes the general step.
The M-step from a k-means start's hard labels (:func:`fused_labelled_estimate`) takes one
compiled pass of such an encoding and family at any size.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .base import Distribution, Estimator
from .centred_moments import pooled_values
from .diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from .frame import PointEncoding, shared_point
from .mixture import MixtureDistribution, MixtureEstimator
from .multivariate_gaussian import MultivariateGaussianDistribution, MultivariateGaussianEstimator
from .spherical_gaussian import SphericalGaussianDistribution, SphericalGaussianEstimator

_UNIT = np.empty(0)  # no sample weights: every row weighs 1
# Rows x components, and rows x components x D (diagonal) or D² (full), up to which the compiled
# pass runs (one thread) instead of torch's blocks: measured (one thread, CPU time, load ~10) at
# N = 1e4, K = 8, D = 8, 0.96x torch's step diagonal (N·K·D = 6.4e5) but 1.4x it full (N·K·D² =
# 5.1e6, where torch's step is one product with the stored features); full at K = 2 (1.3e6) 0.92x.
FUSED_MAX_ELEMENTS = 1 << 17
FUSED_MAX_WORK = 1 << 21
# A tied full covariance: the compiled pass runs below TIED_STEP_DIM dimensions and up to this
# work; elsewhere the tied step (:mod:`.tied_step`, N·D² work, not N·K·D²) is faster. Measured (one
# thread, CPU time, a fit's iterations): at D = 2 the compiled pass 0.75-0.91x the tied step's time
# (N = 1e2 and 1e3, K = 2 to 32); at D = 8 0.89-1.5x, at D = 32 0.98-1.11x; at N = 1e3, D = 32, K = 2
# (N·K·D² = 2.0e6) 3.60 ms compiled, 1.74 ms tied.
FUSED_MAX_TIED_WORK = 1 << 19
TIED_STEP_DIM = 8
DIAGONAL_MODELS = (DiagonalGaussianDistribution, SphericalGaussianDistribution)
FAMILIES: dict[type, tuple[bool, tuple[type, ...]]] = {  # estimator -> (full, its models' classes)
    DiagonalGaussianEstimator: (False, DIAGONAL_MODELS),
    SphericalGaussianEstimator: (False, DIAGONAL_MODELS),
    MultivariateGaussianEstimator: (True, (MultivariateGaussianDistribution,)),
}


_FAMILIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tie_key(estimator: Any) -> str | None:
    return getattr(estimator, "variance_key", None) or getattr(estimator, "covariance_key", None)


def mixture_family(estimator: Estimator) -> tuple[bool, tuple[type, ...], bool] | None:
    """``(full, model classes, tied)`` of a mixture estimator the fused step takes, else ``None``
    (decided once per estimator and list of components)."""
    if type(estimator) is not MixtureEstimator:
        return None
    components = estimator.estimators
    found = _FAMILIES.get(estimator)
    if found is None or found[0] is not components:
        found = _FAMILIES[estimator] = (components, _decided_family(estimator))
    return found[1]


def _decided_family(estimator: MixtureEstimator) -> tuple[bool, tuple[type, ...], bool] | None:
    if estimator.keys is not None:
        return None
    if estimator.dtype not in (None, torch.float64):
        return None
    components = estimator.estimators
    kind = type(components[0])
    family = FAMILIES.get(kind)
    if family is None or any(type(e) is not kind or e.keys is not None for e in components):
        return None
    ties = {_tie_key(e) for e in components}
    if len(ties) != 1:
        return None
    return (*family, ties.pop() is not None)


def fused_em_step(enc: Any, estimator: Estimator, model: Distribution) -> tuple[Distribution, float, float] | None:
    """One EM step by the compiled pass, where it applies (see the module docstring).

    Parameters
    ----------
    enc : object
        The data: a local encoding (a :class:`~mixle_nb.stats.frame.PointEncoding` on the CPU).
    estimator : Estimator
        The mixture's estimator.
    model : Distribution
        The model the step starts from.

    Returns
    -------
    tuple or None
        ``(new model, count, log-density of model)`` as :func:`~mixle_nb.stats.estimation.em_step`
        reports them; ``None`` where the step does not apply (the caller takes the general one).

    Raises
    ------
    DegenerateComponentError
        From the M-step, as the general step raises it.
    """
    if type(model) is not MixtureDistribution or not local_float64(enc):
        return None
    components = model.components
    if len(enc) * len(components) > FUSED_MAX_ELEMENTS:
        return None
    family = mixture_family(estimator)
    if family is None or len(components) != len(estimator.estimators):  # type: ignore[attr-defined]
        return None
    full, models, tied = family
    work = len(enc) * len(components) * (enc.dim * enc.dim if full else enc.dim)
    if work > (FUSED_MAX_TIED_WORK if full and tied else FUSED_MAX_WORK) or (
        full and tied and enc.dim >= TIED_STEP_DIM
    ):
        return None
    if any(type(c) not in models for c in components):
        return None
    counts, values, objective = _statistics(enc, components, model._log_w, full)
    if tied:
        values = pooled_values(values, full)
    weights = enc.weights
    count = float(len(enc)) if weights is None else float(weights.sum())
    new = estimator.estimate(count, (counts, values))
    return new, count, objective


def fused_labelled_estimate(
    enc: Any, estimator: Estimator, centres: np.ndarray, labels: np.ndarray
) -> Distribution | None:
    """The M-step from hard labels (a k-means start's): each row wholly its label's component,
    with statistics about that component's centre, from one compiled pass, where the fused
    step's family applies to ``enc`` and ``estimator``, at any size: the pass costs N·D (N·D²
    full), not K times that as the general M-step over one-hot responsibilities does. Measured
    (one thread): diagonal N = 1e4, D = 64, K = 32 0.84 against 122 ms (the general path with
    its nearest centres), N = 1e6, D = 8, K = 2 14 against 105 ms; full N = 1e5, D = 64, K = 2
    81 against 90 ms, K = 8 81 against 298 ms; at two threads the general path was slower still.

    Parameters
    ----------
    enc : object
        The data: a local encoding.
    estimator : Estimator
        The mixture's estimator.
    centres : numpy.ndarray
        ``(K, D)``: the centres the statistics are taken about.
    labels : numpy.ndarray
        ``(N,)`` int64: each row's component.

    Returns
    -------
    Distribution or None
        The estimated mixture; ``None`` where the fused step does not apply.

    Raises
    ------
    DegenerateComponentError
        From the M-step, as the general one raises it.
    """
    if not local_float64(enc):
        return None
    family = mixture_family(estimator)
    if family is None or len(centres) != len(estimator.estimators):  # type: ignore[attr-defined]
        return None
    full, _, tied = family
    from . import fused_kernels  # numba's import when first needed

    centres = np.ascontiguousarray(centres, dtype=np.float64)
    k, dim = centres.shape
    values = np.empty((k, 1 + 2 * dim + (dim * dim if full else dim)))
    fused_kernels.labelled_pass(enc.values.numpy(), compiled_weights(enc), labels, centres, full, values)
    if tied:
        values = pooled_values(values, full)
    count = float(len(enc)) if enc.weights is None else float(enc.weights.sum())
    return estimator.estimate(count, (values[:, 0].copy(), values))


def local_float64(enc: Any) -> bool:
    """Whether ``enc`` is a non-empty local float64 encoding of points on the CPU."""
    return (
        isinstance(enc, PointEncoding)
        and enc.offset is None
        and enc.values.dtype == torch.float64
        and enc.values.device.type == "cpu"
        and len(enc) > 0
    )


def compiled_weights(enc: PointEncoding) -> np.ndarray:
    """The rows' sample weights as the compiled kernels take them: an empty array where every
    row weighs 1."""
    return _UNIT if enc.weights is None else enc.weights.numpy()


def _references(mu: np.ndarray, whitened_offsets: Any) -> np.ndarray:
    """The points the sums are taken about, as the torch kernels choose them
    (:func:`~mixle_nb.stats.frame.shared_point`): the mean of the means for every component when
    all are within its reach, else each component's own mean."""
    c = shared_point(mu, whitened_offsets, torch.float64)
    return mu if c is None else np.ascontiguousarray(np.broadcast_to(c, mu.shape))


def _statistics(
    enc: PointEncoding, components: Sequence[Any], log_w: np.ndarray, full: bool
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(counts, values, Σ w·log p(x))``: the components' weight totals, their values ``[n, n·r,
    S1, S2]`` about the torch path's references ``r`` (K, 1 + 2D + S) and the objective, from one
    compiled pass."""
    from . import fused_kernels  # numba's import when first needed

    points, weights = enc.values.numpy(), compiled_weights(enc)
    mu = np.array([c.mu for c in components])
    k, dim = mu.shape
    values = np.empty((k, 1 + 2 * dim + (dim * dim if full else dim)))
    if full:
        prec_chol = np.array([c._prec_chol for c in components])
        whiten = np.swapaxes(prec_chol, 1, 2)
        references = _references(mu, lambda c: np.einsum("kij,kj->ki", whiten, mu - c))
        const = np.array([c._log_norm for c in components]) + log_w
        objective = fused_kernels.full_pass(points, weights, mu, prec_chol, const, references, values)
    else:
        sigma2 = np.array([c.sigma2 for c in components])
        references = _references(mu, lambda c: (mu - c) / np.sqrt(sigma2))
        objective = fused_kernels.diagonal_pass(points, weights, mu, sigma2, log_w, references, values)
    return values[:, 0].copy(), values, objective

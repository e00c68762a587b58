"""One EM step of a Gaussian mixture on small local data: the compiled pass of
:mod:`.fused_kernels`, then the estimator's own M-step.

The general step (:func:`~mixle_nb.stats.estimation.em_step`) walks a fold of accumulator
objects, a kernel object and a dozen torch calls a block; at a few thousand rows that overhead,
not the arithmetic, is the step. This step takes the same statistics in one compiled call and
hands them to the same M-step (:meth:`MixtureEstimator.estimate`, the families'
``stacked_estimate`` and their degenerate-component errors): the values are exactly what
:class:`~mixle_nb.stats.centred_moments.CentredMoments` would hold about each component's mean,
and a tied covariance is pooled by :func:`~mixle_nb.stats.centred_moments.pooled_values`, the
key-tying's arithmetic on stacked values. Both steps agree within 1e-12 (``tests/test_fused_step.py``).

It applies to a local float64 encoding on the CPU of at most ``FUSED_MAX_ELEMENTS`` rows times
components, fitted by our :class:`MixtureEstimator` of one Gaussian family (diagonal, spherical
or full; untied or with one tied (co)variance) under a model of the same family; anything else
takes the general step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .base import Distribution, Estimator
from .centred_moments import pooled_values
from .diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from .frame import LOG_2PI, PointEncoding
from .mixture import MixtureDistribution, MixtureEstimator
from .multivariate_gaussian import MultivariateGaussianDistribution, MultivariateGaussianEstimator
from .spherical_gaussian import SphericalGaussianDistribution, SphericalGaussianEstimator

# Rows x components up to which the compiled pass runs (one thread) instead of torch's blocks.
FUSED_MAX_ELEMENTS = 1 << 17
DIAGONAL_MODELS = (DiagonalGaussianDistribution, SphericalGaussianDistribution)
FAMILIES: dict[type, tuple[bool, tuple[type, ...]]] = {  # estimator -> (full, its models' classes)
    DiagonalGaussianEstimator: (False, DIAGONAL_MODELS),
    SphericalGaussianEstimator: (False, DIAGONAL_MODELS),
    MultivariateGaussianEstimator: (True, (MultivariateGaussianDistribution,)),
}


def _tie_key(estimator: Any) -> str | None:
    return getattr(estimator, "variance_key", None) or getattr(estimator, "covariance_key", None)


def _family(estimator: Estimator) -> tuple[bool, tuple[type, ...], bool] | None:
    """``(full, model classes, tied)`` of a mixture estimator the fused step takes, else ``None``."""
    if type(estimator) is not MixtureEstimator or estimator.keys is not None:
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
    if not isinstance(enc, PointEncoding) or enc.offset is not None or enc.values.dtype != torch.float64:
        return None
    if enc.values.device.type != "cpu" or type(model) is not MixtureDistribution:
        return None
    components = model.components
    if len(enc) * len(components) > FUSED_MAX_ELEMENTS or not len(enc):
        return None
    family = _family(estimator)
    if family is None or len(components) != len(estimator.estimators):  # type: ignore[attr-defined]
        return None
    full, models, tied = family
    if any(type(c) not in models for c in components):
        return None
    counts, values, objective = _statistics(enc, components, model._log_w, full)
    if tied:
        values = pooled_values(values, full)
    weights = enc.weights
    count = float(len(enc)) if weights is None else float(weights.sum())
    new = estimator.estimate(count, (counts, list(values)))
    return new, count, objective


def _statistics(
    enc: PointEncoding, components: Sequence[Any], log_w: np.ndarray, full: bool
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(counts, values, Σ w·log p(x))``: the components' weight totals, their values ``[n, n·μ,
    S1, S2]`` about their means (K, 1 + 2D + S) and the objective, from one compiled pass."""
    from . import fused_kernels  # numba's import when first needed

    points = enc.values.numpy()
    weights = np.empty(0) if enc.weights is None else enc.weights.numpy()
    mu = np.stack([c.mu for c in components])
    k, dim = mu.shape
    sums = np.zeros((k, 1 + dim + (dim * dim if full else dim)))
    if full:
        whiten = np.ascontiguousarray(np.stack([c._prec_chol for c in components]).transpose(0, 2, 1))
        const = np.array([c._log_norm for c in components]) + log_w
        objective = fused_kernels.full_pass(points, weights, mu, whiten, const, sums)
    else:
        sigma2 = np.stack([c.sigma2 for c in components])
        const = -0.5 * (dim * LOG_2PI + np.log(sigma2).sum(axis=1)) + log_w
        objective = fused_kernels.diagonal_pass(points, weights, mu, -0.5 / sigma2, const, sums)
    counts = sums[:, 0].copy()
    values = np.concatenate([sums[:, :1], sums[:, :1] * mu, sums[:, 1:]], axis=1)
    return counts, values, float(objective)

"""A Gaussian mixture per state: hmmlearn's ``GMMHMM`` emissions in the HMM family.

State k emits from a :class:`~mixle_nb.stats.MixtureDistribution` of Gaussian components. The
E-step gives each observation's posterior of state k; state k's mixture accumulator splits it
among the state's components (the posterior times the component's responsibility within the
state), and the components add their centred weighted sums. Every statistic is a plain sum, so
the fold, logical shards, ranks and checkpoints work unchanged, and the emission kernel, the
sampling, the decoders and the free-parameter count are the mixture's own.

hmmlearn keeps such a model in compact arrays: ``weights`` (K, M), ``means`` (K, M, D) and
``covars`` in the shape of the covariance type: (K, M) ``"spherical"``, (K, M, D) ``"diag"``,
(K, M, D, D) ``"full"``, and (K, D, D) ``"tied"`` (one covariance for the components of each
state). This module turns those arrays into the states' mixtures and back, and builds the
family's estimator for each covariance type.

``"tied"`` pools the scatter of a state's components inside the state's own estimate
(:class:`StateTiedMixtureEstimator`), not by a key shared through the whole model: a copy of the
state's estimator (K states of one family, as choosing the number of states builds them) ties
only its own components, never the covariances of different states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..centred_moments import CentredMoments
from ..diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from ..mixture import MixtureDistribution, MixtureEstimator
from ..multivariate_gaussian import MultivariateGaussianDistribution, MultivariateGaussianEstimator
from ..parameters import ParameterCount
from ..spherical_gaussian import SphericalGaussianDistribution, SphericalGaussianEstimator
from .model import HiddenMarkovEstimator

MIXTURE_COVARIANCE_TYPES = ("spherical", "diag", "full", "tied")
STATE_COVARIANCE = "the state's covariance"  # the tie, local to one state's estimate


class StateTiedMixtureEstimator(MixtureEstimator):
    """A state's mixture of full-covariance Gaussians sharing one covariance (hmmlearn's
    ``GMMHMM`` ``"tied"``): its estimate pools the components' scatter about their own means,
    each component keeping its mean. The pooling is local to the estimate, so copies of this
    estimator (one per state) stay independent of each other."""

    def estimate(self, nobs: float | None, value: tuple) -> MixtureDistribution:
        counts, component_values = value
        pooled: dict = {}
        accumulators = []
        for estimator, component_value in zip(self.estimators, component_values):
            accumulator = estimator.accumulator_factory().make()
            assert isinstance(accumulator, CentredMoments)  # the Gaussian families' statistics
            accumulator.from_value(component_value).tie_key = STATE_COVARIANCE  # a fresh one, tied here only
            accumulator.key_merge(pooled)
            accumulators.append(accumulator)
        for accumulator in accumulators:
            accumulator.key_replace(pooled)
        return super().estimate(nobs, (counts, [a.value() for a in accumulators]))

    def free_parameters(self, model: MixtureDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # as MixtureEstimator's
        """The weights, every component's mean and one covariance."""
        d = len(np.atleast_1d(model.components[0].mu))  # type: ignore[attr-defined]  # Gaussian components
        return super().free_parameters(model, count) - (len(model.components) - 1) * d * (d + 1) // 2


def _checked_type(covariance_type: str) -> str:
    """``covariance_type`` if it is one of the four, else the error naming them."""
    if covariance_type not in MIXTURE_COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {MIXTURE_COVARIANCE_TYPES}; got {covariance_type!r}")
    return covariance_type


def gaussian_mixture_states(
    weights: ArrayLike, means: ArrayLike, covars: ArrayLike, covariance_type: str
) -> list[MixtureDistribution]:
    """Each state's Gaussian mixture, from hmmlearn's compact arrays.

    Parameters
    ----------
    weights : array-like, shape (K, M)
        The mixture weights of each state, each row summing to 1.
    means : array-like, shape (K, M, D)
        The components' means.
    covars : array-like
        The components' covariances: (K, M) ``"spherical"``, (K, M, D) ``"diag"``,
        (K, M, D, D) ``"full"``, (K, D, D) ``"tied"`` (shared by the components of a state).
    covariance_type : {"spherical", "diag", "full", "tied"}
        The components' family.

    Returns
    -------
    list of MixtureDistribution
        K mixtures of M :class:`~mixle_nb.stats.SphericalGaussianDistribution`,
        :class:`~mixle_nb.stats.DiagonalGaussianDistribution` or
        :class:`~mixle_nb.stats.MultivariateGaussianDistribution` components.

    Raises
    ------
    ValueError
        An unknown ``covariance_type``, shapes that disagree, weights that are not stochastic
        or covariances that are not positive (definite).

    Examples
    --------
    >>> import numpy as np
    >>> states = gaussian_mixture_states(
    ...     [[0.3, 0.7]], [[[0.0, 0.0], [4.0, 4.0]]], [[1.0, 2.0]], "spherical"
    ... )
    >>> states[0].components[1]
    SphericalGaussianDistribution(mu=[4.0, 4.0], variance=2.0)
    """
    _checked_type(covariance_type)
    w = np.asarray(weights, dtype=np.float64)
    mu = np.asarray(means, dtype=np.float64)
    cv = np.asarray(covars, dtype=np.float64)
    if mu.ndim != 3 or w.shape != mu.shape[:2]:
        raise ValueError(f"means must be (K, M, D) and weights (K, M); got {mu.shape} and {w.shape}")
    k, m, d = mu.shape
    expected = {"spherical": (k, m), "diag": (k, m, d), "full": (k, m, d, d), "tied": (k, d, d)}[covariance_type]
    if cv.shape != expected:
        raise ValueError(f"{covariance_type!r} covars must have shape {expected}; got {cv.shape}")
    states = []
    for i in range(k):
        if covariance_type == "spherical":
            components: list[Any] = [SphericalGaussianDistribution(mu[i, j], cv[i, j]) for j in range(m)]
        elif covariance_type == "diag":
            components = [DiagonalGaussianDistribution(mu[i, j], cv[i, j]) for j in range(m)]
        else:
            full = cv[i] if covariance_type == "full" else np.broadcast_to(cv[i], (m, d, d))
            components = [MultivariateGaussianDistribution(mu[i, j], full[j]) for j in range(m)]
        states.append(MixtureDistribution(components, w[i]))
    return states


def gaussian_mixture_arrays(
    states: Sequence[MixtureDistribution], covariance_type: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """hmmlearn's compact arrays of the states' Gaussian mixtures (the inverse of
    :func:`gaussian_mixture_states`).

    Parameters
    ----------
    states : sequence of MixtureDistribution
        Each state's mixture of Gaussian components, all with M components.
    covariance_type : {"spherical", "diag", "full", "tied"}
        The layout of the covariances returned (``"tied"``: each state's first component's).

    Returns
    -------
    weights : numpy.ndarray, shape (K, M)
    means : numpy.ndarray, shape (K, M, D)
    covars : numpy.ndarray
        (K, M), (K, M, D), (K, M, D, D) or (K, D, D), as ``covariance_type``.

    Raises
    ------
    ValueError
        An unknown ``covariance_type``.

    Examples
    --------
    >>> states = gaussian_mixture_states([[1.0]], [[[0.0, 1.0]]], [[[2.0, 0.5], [0.5, 1.0]]], "tied")
    >>> [a.shape for a in gaussian_mixture_arrays(states, "tied")]
    [(1, 1), (1, 1, 2), (1, 2, 2)]
    """
    _checked_type(covariance_type)
    weights = np.stack([s.w for s in states])
    parts: list[list[Any]] = [list(s.components) for s in states]  # the Gaussian families' fields
    means = np.stack([np.stack([np.asarray(c.mu, dtype=np.float64) for c in p]) for p in parts])
    if covariance_type == "spherical":
        covars = np.array([[float(c.sigma2[0]) for c in p] for p in parts])
    elif covariance_type == "diag":
        covars = np.stack([np.stack([c.sigma2 for c in p]) for p in parts])
    elif covariance_type == "full":
        covars = np.stack([np.stack([c.covar for c in p]) for p in parts])
    else:
        covars = np.stack([p[0].covar for p in parts])
    return weights, means, covars


def gaussian_mixture_estimator(
    n_states: int,
    n_mix: int,
    covariance_type: str = "diag",
    dim: int | None = None,
    reg_covar: float = 1e-6,
    implementation: str = "log",
) -> HiddenMarkovEstimator:
    """The HMM family whose states emit from a mixture of ``n_mix`` Gaussians.

    Maximum likelihood; ``"tied"`` shares one covariance among the components of each state
    (``StateTiedMixtureEstimator``, a tie within each state), as hmmlearn's ``GMMHMM`` does.

    Parameters
    ----------
    n_states : int
        The number of states K.
    n_mix : int
        The number of components M of each state's mixture.
    covariance_type : {"spherical", "diag", "full", "tied"}
        The components' covariances.
    dim : int, optional
        The dimension D (default: taken from the data).
    reg_covar : float
        Added to the diagonal of every estimated covariance.
    implementation : {"log", "scaling"}
        The forward–backward arithmetic.

    Returns
    -------
    HiddenMarkovEstimator
        K :class:`~mixle_nb.stats.MixtureEstimator` emissions.

    Raises
    ------
    ValueError
        An unknown ``covariance_type``, or fewer than one state or component.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import em_step, free_parameters
    >>> from mixle_nb.stats.hmm import HiddenMarkovDistribution
    >>> states = gaussian_mixture_states(
    ...     np.full((2, 2), 0.5), [[[0.0], [1.0]], [[5.0], [6.0]]], np.ones((2, 2, 1)), "diag"
    ... )
    >>> start = HiddenMarkovDistribution(states, [0.5, 0.5], [[0.9, 0.1], [0.1, 0.9]])
    >>> estimator = gaussian_mixture_estimator(2, 2, "diag", dim=1)
    >>> enc = start.dist_to_encoder().seq_encode([np.array([[0.1], [0.9], [5.2], [6.1]])])
    >>> step = em_step(enc, estimator, start)
    >>> free_parameters(estimator, step.model)  # 1 + 2 chain, 2 x (1 weight + 2 x 2 Gaussian)
    13
    """
    _checked_type(covariance_type)
    if n_states < 1 or n_mix < 1:
        raise ValueError(f"a Gaussian-mixture HMM needs n_states >= 1 and n_mix >= 1; got {n_states}, {n_mix}")
    return HiddenMarkovEstimator(
        [state_estimator(n_mix, covariance_type, dim, reg_covar)] * n_states, implementation=implementation
    )


def state_estimator(n_mix: int, covariance_type: str, dim: int | None, reg_covar: float) -> MixtureEstimator:
    """One state's mixture estimator of ``n_mix`` Gaussians of ``covariance_type``."""
    if covariance_type == "tied":
        return StateTiedMixtureEstimator([MultivariateGaussianEstimator(dim, reg_covar=reg_covar)] * n_mix)
    component: Any = {
        "spherical": SphericalGaussianEstimator,
        "diag": DiagonalGaussianEstimator,
        "full": MultivariateGaussianEstimator,
    }[covariance_type](dim, reg_covar=reg_covar)
    return MixtureEstimator([component] * n_mix)


__all__ = [
    "gaussian_mixture_arrays",
    "gaussian_mixture_estimator",
    "gaussian_mixture_states",
]

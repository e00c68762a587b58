"""scikit-learn's Gaussian-mixture parameters as our estimators and models, and back.

One place knows how each ``covariance_type`` maps onto a component family:

==========  ==========================================  =============================
type        D > 1                                       D = 1
==========  ==========================================  =============================
full        ``MultivariateGaussianEstimator``           ``DiagonalGaussianEstimator``
tied        the same with one ``covariance_key``        the same with one ``variance_key``
diag        ``DiagonalGaussianEstimator``               ``DiagonalGaussianEstimator``
spherical   ``SphericalGaussianEstimator``              ``DiagonalGaussianEstimator``
==========  ==========================================  =============================

In one dimension every type is the same model, and the diagonal family the cheapest. Every
family reads the same encoding of the points, so a handle built for one serves them all.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from numpy.typing import ArrayLike

from ..stats import (
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    Distribution,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    SphericalGaussianDistribution,
    SphericalGaussianEstimator,
)
from ..stats.base import Estimator
from ..stats.multivariate_gaussian import kernel_constants

TIED_KEY = "tied covariance"


def full_family(covariance_type: str, n_features: int) -> bool:
    """Whether the type takes the full-covariance family (else the diagonal or spherical one)."""
    return covariance_type in ("full", "tied") and n_features > 1


def mixture_estimator(
    covariance_type: str, n_components: int, n_features: int, reg_covar: float, dtype: Any = None
) -> MixtureEstimator:
    """The estimator EM runs with (``dtype``: its E-step's, float64 by default)."""
    key = TIED_KEY if covariance_type == "tied" else None
    if full_family(covariance_type, n_features):

        def component() -> Estimator:
            return MultivariateGaussianEstimator(dim=n_features, reg_covar=reg_covar, covariance_key=key, dtype=dtype)
    elif covariance_type == "spherical" and n_features > 1:

        def component() -> Estimator:
            return SphericalGaussianEstimator(dim=n_features, reg_covar=reg_covar, dtype=dtype)
    else:

        def component() -> Estimator:
            return DiagonalGaussianEstimator(dim=n_features, reg_covar=reg_covar, variance_key=key, dtype=dtype)

    return MixtureEstimator([component() for _ in range(n_components)])


def model_from_parameters(
    covariance_type: str, weights: ArrayLike, means: ArrayLike, covariances: ArrayLike
) -> MixtureDistribution:
    """The mixture with scikit-learn's ``weights_``, ``means_`` and ``covariances_``."""
    means = np.asarray(means, dtype=np.float64)
    k, d = means.shape
    covariances = np.asarray(covariances, dtype=np.float64)
    if covariance_type == "tied":
        covariances = np.broadcast_to(covariances, (k, d, d))
    components: list[Distribution]
    if full_family(covariance_type, d):
        components = [MultivariateGaussianDistribution(m, c) for m, c in zip(means, covariances)]
    elif covariance_type == "spherical" and d > 1:
        components = [SphericalGaussianDistribution(m, c) for m, c in zip(means, covariances)]
    else:  # diag, or 1-D of any type: (K, 1, 1) and (K,) covariances are one variance each
        variances = covariances if covariance_type == "diag" else covariances.reshape(k, 1)
        components = [DiagonalGaussianDistribution(m, v) for m, v in zip(means, variances)]
    weights = np.asarray(weights, dtype=np.float64)
    return MixtureDistribution(components, weights / weights.sum())


def parameters_from_model(covariance_type: str, model: Distribution) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(weights_, means_, covariances_)`` in scikit-learn's shapes for ``covariance_type``.

    Parameters
    ----------
    covariance_type : {"full", "tied", "diag", "spherical"}
        The shapes to report in.
    model : MixtureDistribution
        A mixture of our Gaussian families.

    Returns
    -------
    tuple of numpy.ndarray
        ``weights_`` ``(K,)``, ``means_`` ``(K, D)`` and ``covariances_`` in the type's shape.

    Raises
    ------
    TypeError
        If ``model`` is not a mixture of Gaussians.
    """
    if not isinstance(model, MixtureDistribution):
        raise TypeError(f"a Gaussian mixture's model must be a MixtureDistribution; got {type(model).__name__}")
    means = np.stack([np.atleast_1d(_gaussian(c).mu) for c in model.components])
    full = np.stack([_full_covariance(_gaussian(c)) for c in model.components])
    if covariance_type == "full":
        covariances = full
    elif covariance_type == "tied":
        covariances = full[0]
    elif covariance_type == "diag":
        covariances = np.stack([np.diag(f) for f in full])
    else:
        covariances = np.array([np.diag(f).mean() for f in full])
    return model.w.copy(), means, covariances


def _gaussian(component: Distribution) -> DiagonalGaussianDistribution | MultivariateGaussianDistribution:
    """A component of the Gaussian families scikit-learn's mixture has (spherical is diagonal)."""
    if not isinstance(component, (DiagonalGaussianDistribution, MultivariateGaussianDistribution)):
        raise TypeError(f"a Gaussian mixture's component must be a Gaussian; got {type(component).__name__}")
    return component


def _full_covariance(component: DiagonalGaussianDistribution | MultivariateGaussianDistribution) -> np.ndarray:
    if isinstance(component, MultivariateGaussianDistribution):
        return component.covar
    return np.diag(np.atleast_1d(component.sigma2))


def precisions_cholesky(covariance_type: str, covariances: np.ndarray, model: MixtureDistribution) -> np.ndarray:
    """scikit-learn's ``precisions_cholesky_``: ``U`` with ``precision = U Uᵀ``, from
    ``covariances`` (scikit-learn's shape); a full or tied model's multivariate components
    already keep theirs for their log-densities
    (:attr:`~mixle_nb.stats.MultivariateGaussianDistribution.precision_cholesky`), and those
    are taken, not made again (32 of D = 64 took 2.8 ms, as long as an EM iteration at N = 100)."""
    if covariance_type in ("diag", "spherical"):
        return 1.0 / np.sqrt(covariances)
    components = model.components
    if not all(isinstance(c, MultivariateGaussianDistribution) for c in components):  # D = 1: 1-D Gaussians
        return kernel_constants(np.linalg.cholesky(covariances))[0]
    factors = [cast(MultivariateGaussianDistribution, c).precision_cholesky for c in components]
    return factors[0].copy() if covariance_type == "tied" else np.stack(factors)  # the fit's own arrays


def precisions_from_cholesky(covariance_type: str, chol: np.ndarray) -> np.ndarray:
    """scikit-learn's ``precisions_``: ``U Uᵀ`` of each factor, one batched product."""
    if covariance_type in ("diag", "spherical"):
        return chol**2
    return chol @ np.swapaxes(chol, -1, -2)


def covariances_from_precisions(covariance_type: str, precisions: np.ndarray) -> np.ndarray:
    """The covariances a ``precisions_init`` stands for."""
    if covariance_type in ("diag", "spherical"):
        return 1.0 / precisions
    return np.linalg.inv(precisions)

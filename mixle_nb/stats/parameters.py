"""How many free parameters a fitted model has, for BIC and AIC.

Counted from the estimator (which says what is tied) and the model (which says the sizes).
Statistics tied by a key are counted once per key: ``keys`` on a component ties all of it;
``keys`` on a mixture ties its weights; ``variance_key`` / ``covariance_key`` tie only the
(co)variance, each component keeping its own mean. The counts agree with scikit-learn's
``GaussianMixture`` for ``full``, ``diag``, ``tied`` and ``spherical`` covariances.
"""
from __future__ import annotations

from .base import Distribution, Estimator
from .categorical import CategoricalEstimator
from .diagonal_gaussian import DiagonalGaussianEstimator
from .mixture import MixtureEstimator
from .multivariate_gaussian import MultivariateGaussianEstimator
from .poisson import PoissonEstimator
from .spherical_gaussian import SphericalGaussianEstimator


def free_parameters(estimator: Estimator, model: Distribution) -> int:
    """The number of free parameters of ``model`` as ``estimator`` fits it."""
    return _count(estimator, model, set())


def _tied(seen: set, kind: str, key) -> bool:
    """Whether ``key`` was counted already (and from now on, it is)."""
    if key is None:
        return False
    if (kind, key) in seen:
        return True
    seen.add((kind, key))
    return False


def _count(estimator: Estimator, model: Distribution, seen: set) -> int:
    if isinstance(estimator, MixtureEstimator):
        weights = 0 if _tied(seen, "weights", estimator.keys) else len(model.components) - 1
        return weights + sum(_count(e, c, seen) for e, c in zip(estimator.estimators, model.components))
    if _tied(seen, "all", getattr(estimator, "keys", None)):
        return 0
    if isinstance(estimator, SphericalGaussianEstimator):
        dim = len(model.mu)
        return dim + (0 if _tied(seen, "variance", estimator.variance_key) else 1)
    if isinstance(estimator, DiagonalGaussianEstimator):  # also the 1-D GaussianEstimator
        dim = len(model.mu) if hasattr(model.mu, "__len__") else 1
        return dim + (0 if _tied(seen, "variance", estimator.variance_key) else dim)
    if isinstance(estimator, MultivariateGaussianEstimator):
        dim = len(model.mu)
        return dim + (0 if _tied(seen, "covariance", estimator.covariance_key) else dim * (dim + 1) // 2)
    if isinstance(estimator, CategoricalEstimator):
        return len(model.pmap) - 1
    if isinstance(estimator, PoissonEstimator):
        return 1
    raise TypeError(f"no free-parameter count for {type(estimator).__name__}: pass n_parameters= "
                    "to bic()/aic() yourself")

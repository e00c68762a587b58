"""How many free parameters a fitted model has, for BIC and AIC.

Counted from the estimator (which says what is tied) and the model (which says the sizes).
Statistics tied by a key are counted once per key: ``keys`` on a component ties all of it;
``keys`` on a mixture ties its weights; ``variance_key`` / ``covariance_key`` tie only the
(co)variance, each component keeping its own mean. The counts agree with scikit-learn's
``GaussianMixture`` for ``full``, ``diag``, ``tied`` and ``spherical`` covariances.
"""

from __future__ import annotations

from .base import Distribution, Estimator


def free_parameters(estimator: Estimator, model: Distribution) -> int:
    """The number of free parameters of ``model`` as ``estimator`` fits it.

    Statistics tied by a key (``keys``, ``variance_key``, ``covariance_key``) are counted once.

    Parameters
    ----------
    estimator : Estimator
        The estimator ``model`` was fitted with.
    model : Distribution
        The fitted model.

    Returns
    -------
    int
        The number of free parameters (what BIC and AIC charge).

    Raises
    ------
    TypeError
        A family this package cannot count (mixle's): pass ``n_parameters=`` to
        :func:`~mixle_nb.inference.bic` instead.

    Examples
    --------
    Three 1-D Gaussian components: 2 weights and 3 means and variances; with one shared
    variance, 2 weights, 3 means and 1 variance:

    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, free_parameters
    >>> from mixle_nb.stats import MixtureDistribution, MixtureEstimator
    >>> model = MixtureDistribution([GaussianDistribution(0.0, 1.0)] * 3, [1 / 3] * 3)
    >>> free_parameters(MixtureEstimator([GaussianEstimator()] * 3), model)
    8
    >>> free_parameters(MixtureEstimator([GaussianEstimator(variance_key="v")] * 3), model)
    6
    """
    return ParameterCount().of(estimator, model)


class ParameterCount:
    """One count over a model's tree: each family says its own (``Estimator.free_parameters``),
    asking :meth:`tied` whether a statistic was counted already."""

    def __init__(self) -> None:
        self._seen: set = set()

    def of(self, estimator: Estimator, model: Distribution) -> int:
        count = getattr(estimator, "free_parameters", None)
        if count is None:  # another package's estimator
            raise TypeError(
                f"no free-parameter count for {type(estimator).__name__}: pass n_parameters= to bic()/aic() yourself"
            )
        return count(model, self)

    def tied(self, kind: str, key: str | None) -> bool:
        """Whether the statistic ``kind`` under ``key`` was counted already (from now on, it is);
        never for ``key=None``."""
        if key is None:
            return False
        if (kind, key) in self._seen:
            return True
        self._seen.add((kind, key))
        return False

"""The scikit-learn internals ``mixle_nb.mixture`` uses where no public API does the same:
every use is here, and nowhere else.

- ``sklearn.mixture.GaussianMixture._parameter_constraints`` and
  ``BayesianGaussianMixture._parameter_constraints``: the declared constraints of each
  parameter, so that ours are scikit-learn's, message for message;
- ``sklearn.base.BaseEstimator._validate_params``: checks an estimator's parameters against
  its ``_parameter_constraints`` (scikit-learn's own estimators call it from ``fit``).

Both are in scikit-learn since 1.2; ``validate_data`` (public) since 1.6. The ``sklearn``
extra in ``pyproject.toml`` pins :data:`CHECKED_RANGE`; the tests ran here against
scikit-learn 1.9.1. On another version :func:`check_internals` (called by the tests) names
what is missing, so a break reads as one clear message, not as an ``AttributeError`` in ``fit``.
"""

from __future__ import annotations

from typing import Any

import sklearn
from sklearn.base import BaseEstimator
from sklearn.mixture import BayesianGaussianMixture as ScikitBayesianGaussianMixture
from sklearn.mixture import GaussianMixture as ScikitGaussianMixture

CHECKED_RANGE = ">=1.6,<1.10"  # the sklearn extra's pin (pyproject.toml); a test keeps them equal
GAUSSIAN_MIXTURE_PARAMETERS = (
    "n_components",
    "covariance_type",
    "tol",
    "reg_covar",
    "max_iter",
    "n_init",
    "init_params",
    "weights_init",
    "means_init",
    "precisions_init",
    "random_state",
    "warm_start",
    "verbose",
    "verbose_interval",
)


def parameter_constraints() -> dict[str, list[Any]]:
    """scikit-learn's declared constraints of ``GaussianMixture``'s parameters (a copy).

    Returns
    -------
    dict
        Parameter name to its list of constraints, as ``_parameter_constraints`` declares it.
    """
    return dict(ScikitGaussianMixture._parameter_constraints)


def bayesian_parameter_constraints() -> dict[str, list[Any]]:
    """scikit-learn's declared constraints of ``BayesianGaussianMixture``'s parameters (a copy).

    Returns
    -------
    dict
        Parameter name to its list of constraints, as ``_parameter_constraints`` declares it.
    """
    return dict(ScikitBayesianGaussianMixture._parameter_constraints)


def validate_params(estimator: BaseEstimator) -> None:
    """Check ``estimator``'s parameters against its ``_parameter_constraints``.

    Parameters
    ----------
    estimator : sklearn.base.BaseEstimator
        An estimator declaring ``_parameter_constraints``.

    Raises
    ------
    sklearn.utils._param_validation.InvalidParameterError
        (a ``ValueError`` and ``TypeError``) naming the parameter, with scikit-learn's message.
    """
    estimator._validate_params()


def check_internals() -> None:
    """Fail with one clear message if this scikit-learn lacks what :mod:`mixle_nb.mixture` uses.

    Raises
    ------
    RuntimeError
        Naming the installed version, what is missing, and the range the use was checked against.
    """
    missing = []
    constraints = getattr(ScikitGaussianMixture, "_parameter_constraints", None)
    if not isinstance(constraints, dict):
        missing.append("sklearn.mixture.GaussianMixture._parameter_constraints (a dict)")
    else:
        missing += [
            f"GaussianMixture._parameter_constraints[{name!r}]"
            for name in GAUSSIAN_MIXTURE_PARAMETERS
            if name not in constraints
        ]
    if not isinstance(getattr(ScikitBayesianGaussianMixture, "_parameter_constraints", None), dict):
        missing.append("sklearn.mixture.BayesianGaussianMixture._parameter_constraints (a dict)")
    if not callable(getattr(BaseEstimator, "_validate_params", None)):
        missing.append("sklearn.base.BaseEstimator._validate_params")
    if missing:
        raise RuntimeError(
            f"scikit-learn {sklearn.__version__} lacks what mixle_nb.mixture uses: {', '.join(missing)}. "
            f"It was checked against scikit-learn{CHECKED_RANGE}: install a version in that range "
            "(pip install 'mixle_nb[sklearn]'), or port mixle_nb/mixture/scikit_internals.py"
        )

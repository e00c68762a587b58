"""The priors of ``BayesianGaussianMixture``: those given checked with scikit-learn's messages,
those left ``None`` taken from the data (numpy's moments of an array, its rows weighted where
given; folded passes on a handle)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils import check_array

from ..stats.estimation import is_handle
from ..stats.variational_gaussian import full_statistics
from .bayesian_handles import check_weight_for_priors, handle_moments
from .initial_parameters import checked_precisions


def prior_attributes(
    bgm: Any, data: Any, n_features: int, weights: np.ndarray | None = None, dtype: type = np.float64
) -> dict[str, Any]:
    """The ``*_prior_`` attributes of a fit of ``bgm`` (a ``BayesianGaussianMixture``) on
    ``data``, an array (its rows weighted by ``weights`` where given) or a handle. Those taken
    from the data are in ``dtype``, the input array's, where scikit-learn's are (the mean, and
    the diagonal and spherical covariances: its moments of a float32 array); the rest float64.

    Raises
    ------
    ValueError
        On a prior of the wrong shape or value, or weights too light for the covariance prior
        taken from the data (scikit-learn's messages), before any work.
    """
    d, kind = n_features, bgm.covariance_type
    if bgm.degrees_of_freedom_prior is not None and not bgm.degrees_of_freedom_prior > d - 1.0:
        raise ValueError(
            f"The parameter 'degrees_of_freedom_prior' should be greater than {d - 1}, "
            f"but got {bgm.degrees_of_freedom_prior:.3f}."
        )
    mean = None if bgm.mean_prior is None else _checked_shape(bgm.mean_prior, (d,), "means")
    covariance: Any = None
    if bgm.covariance_prior is not None and kind in ("full", "tied"):
        covariance = _checked_shape(bgm.covariance_prior, (d, d), f"{kind} covariance_prior")
        checked_precisions(covariance if kind == "tied" else covariance[None], kind, 1, d)  # scikit-learn's check
    elif bgm.covariance_prior is not None and kind == "diag":
        covariance = _checked_shape(bgm.covariance_prior, (d,), f"{kind} covariance_prior")
        if np.any(covariance <= 0):
            raise ValueError(f"'{kind} precision' should be positive")
    elif bgm.covariance_prior is not None:
        covariance = float(bgm.covariance_prior)  # a real, by the constraints
    if covariance is None and weights is not None:
        check_weight_for_priors(float(weights.sum()))
    if mean is None or covariance is None:
        data_mean, data_covariance = _data_moments(data, d, full_statistics(kind, d), weights)
        mean = data_mean.astype(dtype) if mean is None else mean
        if covariance is None:
            covariance = {
                "full": np.atleast_2d(data_covariance),
                "tied": np.atleast_2d(data_covariance),
                "diag": np.diag(np.atleast_2d(data_covariance)).astype(dtype),
                "spherical": dtype(np.diag(np.atleast_2d(data_covariance)).mean()),
            }[kind]
    return {
        "weight_concentration_prior_": (
            1.0 / bgm.n_components if bgm.weight_concentration_prior is None else bgm.weight_concentration_prior
        ),
        "mean_precision_prior_": 1.0 if bgm.mean_precision_prior is None else bgm.mean_precision_prior,
        "mean_prior_": mean,
        "degrees_of_freedom_prior_": d if bgm.degrees_of_freedom_prior is None else bgm.degrees_of_freedom_prior,
        "covariance_prior_": covariance,
    }


def _checked_shape(values: object, shape: tuple[int, ...], name: str) -> np.ndarray:
    """``values`` as a float array of ``shape``, with scikit-learn's message otherwise."""
    array = check_array(values, dtype=[np.float64, np.float32], ensure_2d=False)
    if array.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, but got {array.shape}")
    return np.asarray(array, dtype=np.float64)


def _data_moments(
    data: Any, n_features: int, full: bool, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The data's mean and covariance (``ddof=1``; its diagonal only unless ``full``): on an
    array numpy's, as scikit-learn's priors, the rows counted ``weights`` times where given;
    on a handle from folded passes (``bayesian_handles.handle_moments``)."""
    if is_handle(data):
        return handle_moments(data, n_features, full)
    if weights is None:
        return data.mean(axis=0), np.atleast_2d(np.cov(data.T))
    mean = weights @ data / weights.sum()
    centred = data - mean
    return mean, np.atleast_2d((centred.T * weights) @ centred / (weights.sum() - 1.0))

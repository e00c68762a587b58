"""``BayesianGaussianMixture`` on a handle (a ``TorchRunEncodedData``, every rank calling) and
through a cluster reference (``mixle.handle(name)``): what a reference runs on the ranks and
brings back, a handle's checks before any work, the data's mean and covariance for the priors
from folded passes, and the start from our k-means‖ or random start where the data live."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import inference
from ..inference.fitting import streaming_accumulate
from ..stats import MixtureDistribution
from ..stats.centred_moments import _split
from ..stats.handle import EncodedDataHandle
from ..stats.variational_gaussian import (
    VariationalGaussianMixture,
    VariationalGaussianMixtureEstimator,
    gaussian_components,
)
from .gaussian_mixture import STARTS, _handle_features
from .handle_weights import checked_total_weight
from .translation import mixture_estimator

PRIORS = (
    "weight_concentration_prior_",
    "mean_precision_prior_",
    "mean_prior_",
    "degrees_of_freedom_prior_",
    "covariance_prior_",
)
FITTED = (
    "weight_concentration_",
    "mean_precision_",
    "means_",
    "degrees_of_freedom_",
    "covariances_",
    "precisions_",
    "precisions_cholesky_",
    "weights_",
    "converged_",
    "n_iter_",
    "lower_bound_",
    "lower_bounds_",
    "n_features_in_",
    "feature_names_in_",
    *PRIORS,
)


def on_rank(handle: EncodedDataHandle, estimator: Any, method: str, *args: Any) -> Any:
    """What a cluster reference runs on every rank: the same method on the rank's handle; a
    fit brings back the fitted attributes (and ``partial_fit``'s running statistics)."""
    out = getattr(estimator, method)(handle, *args)
    if method not in ("fit", "partial_fit"):
        return out
    kept = (*FITTED, "_stepwise")
    return {name: value for name, value in vars(estimator).items() if name in kept}


def handle_features(handle: Any, expected: int | None = None) -> int:
    """``n_features`` of ``handle``'s rows; scikit-learn's error where ``expected`` differs."""
    n_features = _handle_features(handle)
    if expected is not None and n_features != expected:
        raise ValueError(
            f"X has {n_features} features, but BayesianGaussianMixture is expecting {expected} features as input."
        )
    return n_features


def check_weight_for_priors(weight: float) -> None:
    """The covariance prior taken from the data needs a total weight above 1 (``n_samples >= 2``)."""
    if not weight > 1.0:
        raise ValueError(
            f"The sample weights sum to {weight:g}: the covariance prior taken from the data "
            "needs a total weight above 1 (as n_samples >= 2); give covariance_prior or larger weights."
        )


def check_handle_weight(handle: Any, priors_from_data: bool) -> None:
    """Refuse a handle whose rows all weigh 0 (or, when the covariance prior is taken from its
    data, whose total weight is at most 1) before any work, with scikit-learn's message."""
    weight = checked_total_weight(handle)
    if priors_from_data:
        check_weight_for_priors(weight)


def handle_moments(handle: Any, n_features: int, full: bool) -> tuple[np.ndarray, np.ndarray]:
    """The mean and covariance (``ddof=1``; its diagonal only unless ``full``) of ``handle``'s
    rows (weighted rows weighted) from two folded passes, about the origin for the mean and
    then about the mean."""
    kind = "full" if full else "diag"
    estimator = mixture_estimator(kind, 1, n_features, 0.0)
    mean = np.zeros(n_features)
    unit = np.eye(n_features)[None] if full else np.ones((1, n_features))
    for _ in range(2):
        model = MixtureDistribution(gaussian_components(kind, mean[None], unit), [1.0])
        _, folded = streaming_accumulate(handle, estimator, model)
        n, nc, s1, s2 = _split(np.asarray(folded.value()[1][0], dtype=np.float64), full)
        centre = nc / n
        mean = centre + s1 / n
    offset = mean - centre
    if full:
        scatter = s2 - np.outer(s1, offset) - np.outer(offset, s1) + n * np.outer(offset, offset)
    else:
        scatter = np.diag(s2 - 2.0 * offset * s1 + n * offset * offset)
    return mean, scatter / (n - 1.0)


def handle_start(
    handle: Any, gaussian_estimator: Any, estimator: VariationalGaussianMixtureEstimator, init_params: str, rng: Any
) -> VariationalGaussianMixture:
    """The variational start on a handle: the responsibilities of our start of ``init_params``
    (``gaussian_estimator``'s mixture), folded across the ranks."""
    start = inference.initial_model(handle, gaussian_estimator, STARTS[init_params], rng, init_p=1.0)
    _, folded = streaming_accumulate(handle, estimator.gaussian_estimator(), start)
    return estimator.start(folded.value())

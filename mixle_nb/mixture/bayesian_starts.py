"""The start of ``BayesianGaussianMixture`` on an array: scikit-learn's ``_initialize`` from its
own starting responsibilities (its ``KMeans``, ``kmeans_plusplus`` and random draws), the rows
weighted where given. (On a handle: ``bayesian_handles.handle_start``.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.cluster import KMeans, kmeans_plusplus

from ..stats import seq_encode
from ..stats.variational_gaussian import VariationalGaussianMixture, VariationalGaussianMixtureEstimator


def array_start(
    data: np.ndarray,
    enc: Any,
    estimator: VariationalGaussianMixtureEstimator,
    init_params: str,
    rng: np.random.RandomState,
    weights: np.ndarray | None = None,
    device: Any = None,
) -> VariationalGaussianMixture:
    """scikit-learn's start on the array ``data`` (encoded as ``enc``): its draws'
    responsibilities, times the rows' ``weights`` where given, through the variational update."""
    n_components, covariance_type = estimator.n_components, estimator.priors.covariance_type
    resp = _starting_responsibilities(init_params, data, n_components, rng, weights)
    unweighted = resp.any(axis=1)
    if weights is not None:
        resp *= weights[:, None]
    unassigned = None
    rows = np.flatnonzero(resp.any(axis=1))
    if covariance_type == "tied" and not unweighted.all():
        # scikit-learn's tied start takes XᵀX over every row, those without responsibility too
        left = np.flatnonzero(~unweighted)
        counted = data[left] if weights is None else data[left] * weights[left, None]
        unassigned = counted.T @ data[left]
    if len(rows) < len(data):  # observations as centres: only their rows count
        enc, data, resp = seq_encode(data[rows], estimator=estimator, device=device), data[rows], resp[rows]
    acc = estimator.gaussian_estimator().make_accumulator()
    counts = resp.sum(axis=0)
    references = (resp.T @ data) / np.where(counts > 0, counts, 1.0)[:, None]
    acc.seq_update_responsibilities(enc, torch.from_numpy(np.ascontiguousarray(resp.T)), references)
    return estimator.start(acc.value(), unassigned)


def _starting_responsibilities(
    init_params: str, X: np.ndarray, n_components: int, rng: np.random.RandomState, weights: np.ndarray | None = None
) -> np.ndarray:
    """scikit-learn's starting responsibilities (``BaseMixture._initialize_parameters``); with
    ``weights``, its k-means starts weighted and ``"random_from_data"`` drawing rows in
    proportion to them."""
    n = len(X)
    resp = np.zeros((n, n_components))
    if init_params == "kmeans":
        labels = KMeans(n_clusters=n_components, n_init=1, random_state=rng).fit(X, sample_weight=weights).labels_
        resp[np.arange(n), labels] = 1.0
    elif init_params == "random":
        resp = rng.uniform(size=(n, n_components))
        resp /= resp.sum(axis=1)[:, None]
    elif init_params == "random_from_data":
        p = None if weights is None else weights / weights.sum()
        resp[rng.choice(n, size=n_components, replace=False, p=p), np.arange(n_components)] = 1.0
    else:
        _, indices = kmeans_plusplus(X, n_components, sample_weight=weights, random_state=rng)
        resp[indices, np.arange(n_components)] = 1.0
    return resp

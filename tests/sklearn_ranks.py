"""The problems tests/test_sklearn_mixture.py fits, and what its gloo ranks run: a module of
its own, light to import, since every spawned rank imports it."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from mixle_nb.mixture import GaussianMixture

TYPES = ("full", "tied", "diag", "spherical")
ATTRIBUTES = (
    "weights_",
    "means_",
    "covariances_",
    "precisions_",
    "precisions_cholesky_",
    "lower_bound_",
    "lower_bounds_",
)
CASES = [(t, d) for t in TYPES for d in (1, 3)]
CHUNKS = 3  # partial_fit's chunks in weighted_rank_fits


def blobs(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """Overlapping clusters, so EM is still moving after the fixed iterations compared."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * 2.0 / np.sqrt(d)
    return centres[rng.integers(k, size=n)] + rng.normal(size=(n, d)) * (0.5 + rng.random(d))


def start(covariance_type: str, x: np.ndarray, k: int, seed: int = 1) -> dict:
    """A start both libraries take: weights_init, means_init, precisions_init."""
    rng = np.random.default_rng(seed)
    d = x.shape[1]
    precisions = {
        "full": np.stack([np.eye(d) * (1 + i) for i in range(k)]),
        "tied": np.eye(d),
        "diag": 1 + rng.random((k, d)),
        "spherical": 1 + rng.random(k),
    }[covariance_type]
    return dict(
        weights_init=np.full(k, 1 / k), means_init=x[rng.choice(len(x), k, replace=False)], precisions_init=precisions
    )


def settings(covariance_type: str, x: np.ndarray, k: int = 3, **extra) -> dict:
    return dict(
        n_components=k, covariance_type=covariance_type, tol=0, max_iter=12, **start(covariance_type, x, k), **extra
    )


def fit_quietly(estimator, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(x)


def fitted(estimator) -> dict:
    return {name: getattr(estimator, name) for name in ATTRIBUTES + ("n_iter_", "converged_")}


def rank_fits(rank, world):
    """Every case, fitted through a TorchRunEncodedData in one group, with all six scores."""
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    dist.init_process_group("gloo")  # one group for every handle (each would otherwise form its own)
    out = []
    for covariance_type, d in CASES:
        x = blobs(301, d, 3)
        estimator = GaussianMixture(**settings(covariance_type, x))
        with TorchRunEncodedData(x, estimator=estimator.mixture_estimator(d)) as h:
            fit_quietly(estimator, h)
            out.append(
                {
                    **fitted(estimator),
                    **{
                        m: getattr(estimator, m)(h)
                        for m in ("predict", "predict_proba", "score_samples", "score", "bic", "aic")
                    },
                }
            )
    dist.destroy_process_group()
    return out


def weighted_rank_fits(rank, world, path, bad_path):
    """Each rank reads its rows of ``path`` (points, then the weight column) with the weighted-rows
    encoder and fits every covariance type from the same start; then builds a handle of
    ``bad_path`` (a negative weight on one rank); then partial_fit over :data:`CHUNKS` chunks of
    the points, a handle each, unweighted and weighted. Returns the fitted attributes, the error, the online
    fit, the error of all-zero weights (a random start) and the weighted online fit."""
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    dist.init_process_group("gloo")
    x = np.load(path)[:, :-1]
    fits = []
    fits_encoder = GaussianMixture(2).weighted_rows_encoder(x.shape[1])
    for covariance_type in TYPES:
        estimator = GaussianMixture(**settings(covariance_type, x))
        with TorchRunEncodedData.from_npy(path, encoder=estimator.weighted_rows_encoder(x.shape[1])) as h:
            fit_quietly(estimator, h)
            fits.append(fitted(estimator))
    try:
        TorchRunEncodedData.from_npy(bad_path, encoder=GaussianMixture(2).weighted_rows_encoder(x.shape[1]))
        error = "no error"
    except Exception as exc:  # every rank raises together: the failed rank its own error
        error = f"{type(exc).__name__}: {exc}"
    with TorchRunEncodedData(np.column_stack([x, np.zeros(len(x))]), encoder=fits_encoder) as zero:
        try:
            GaussianMixture(2, init_params="random", random_state=0).fit(zero)
            error_of_zeros = "no error"
        except ValueError as exc:
            error_of_zeros = str(exc)
    online, weighted_online = GaussianMixture(**settings("full", x)), GaussianMixture(**settings("full", x))
    rows = np.load(path)
    for part in np.array_split(np.arange(len(x)), CHUNKS):
        with TorchRunEncodedData(x[part], estimator=online.mixture_estimator(x.shape[1])) as h:
            online.partial_fit(h)
        with TorchRunEncodedData(rows[part], encoder=weighted_online.weighted_rows_encoder(x.shape[1])) as h:
            weighted_online.partial_fit(h)
    dist.destroy_process_group()
    return fits, error, fitted(online), error_of_zeros, fitted(weighted_online)

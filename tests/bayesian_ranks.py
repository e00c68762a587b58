"""The problems tests/test_bayesian_mixture.py fits, and what its gloo ranks run: a module of
its own, light to import, since every spawned rank imports it."""

from __future__ import annotations

import copy
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from mixle_nb.mixture import BayesianGaussianMixture

TYPES = ("full", "tied", "diag", "spherical")
PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
INITS = ("kmeans", "k-means++", "random", "random_from_data")
ATTRIBUTES = (
    "weights_",
    "means_",
    "covariances_",
    "precisions_",
    "precisions_cholesky_",
    "mean_precision_",
    "degrees_of_freedom_",
    "lower_bound_",
    "lower_bounds_",
    "mean_prior_",
    "covariance_prior_",
)
# every covariance type, both prior types, and one dimension
RANK_CASES = [(t, PRIOR_TYPES[i % 2], 3) for i, t in enumerate(TYPES)] + [("full", PRIOR_TYPES[1], 1)]
WARM_ITERATIONS, RANK_ITERATIONS = 2, 6


def blobs(n: int, d: int, k: int, seed: int = 0) -> np.ndarray:
    """Overlapping clusters away from the origin, so the fit still moves after the iterations compared."""
    rng = np.random.default_rng(seed)
    centres = 5.0 + rng.normal(size=(k, d)) * 2.0 / np.sqrt(d)
    return centres[rng.integers(k, size=n)] + rng.normal(size=(n, d)) * (0.5 + rng.random(d))


def settings(covariance_type: str, prior_type: str, **extra) -> dict:
    return dict(
        n_components=4,
        covariance_type=covariance_type,
        weight_concentration_prior_type=prior_type,
        random_state=0,
        **extra,
    )


def fit_quietly(estimator, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(x)


def warm_started(estimator_class, covariance_type: str, prior_type: str, x: np.ndarray):
    """A fit of ``WARM_ITERATIONS`` from scikit-learn's random-from-data start, set to go on
    for ``RANK_ITERATIONS`` more from where it is (``warm_start``)."""
    options = settings(covariance_type, prior_type, init_params="random_from_data", tol=0, warm_start=True)
    estimator = fit_quietly(estimator_class(max_iter=WARM_ITERATIONS, **options), x)
    return estimator.set_params(max_iter=RANK_ITERATIONS)


def fitted(estimator) -> dict:
    return {name: getattr(estimator, name) for name in ATTRIBUTES + ("n_iter_", "converged_", "weight_concentration_")}


def rank_fits(rank, world):
    """Every case continued through a TorchRunEncodedData in one group, and a fit from the
    handle's own k-means‖ start."""
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    dist.init_process_group("gloo")
    out = []
    for covariance_type, prior_type, d in RANK_CASES:
        x = blobs(240, d, 3)
        estimator = warm_started(BayesianGaussianMixture, covariance_type, prior_type, x)
        with TorchRunEncodedData(x, estimator=estimator.mixture_estimator(d)) as h:
            fit_quietly(estimator, h)
            own_start = fit_quietly(BayesianGaussianMixture(**settings(covariance_type, prior_type, max_iter=10)), h)
            out.append(
                {
                    **fitted(estimator),
                    "predict": estimator.predict(h),
                    "predict_proba": estimator.predict_proba(h),
                    "score_samples": estimator.score_samples(h),
                    "own_start": fitted(own_start),
                }
            )
    dist.destroy_process_group()
    return out


def continued_rank_fits(rank, world):
    """Every case continued through a TorchRunEncodedData in one group: the fit alone (the
    4-rank check; the scores and the handle's own start are checked on 2 ranks)."""
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    dist.init_process_group("gloo")
    out = []
    for covariance_type, prior_type, d in RANK_CASES:
        x = blobs(240, d, 3)
        estimator = warm_started(BayesianGaussianMixture, covariance_type, prior_type, x)
        with TorchRunEncodedData(x, estimator=estimator.mixture_estimator(d)) as h:
            out.append(fitted(fit_quietly(estimator, h)))
    dist.destroy_process_group()
    return out


def weights_problem(covariance_type: str):
    """The rows, their integer weights and the warm start (``max_iter`` 20) of the one-process
    weights test, and the rows of each ``partial_fit`` chunk."""
    x = blobs(120, 3, 3, seed=5)
    w = np.random.default_rng(1).integers(0, 4, size=len(x)).astype(np.float64)
    start = warm_started(BayesianGaussianMixture, covariance_type, "dirichlet_process", x).set_params(max_iter=20)
    return x, w, start, np.array_split(np.arange(len(x)), 3)


def weighted_and_partial_rank_fits(rank, world):
    """For every covariance type, in one group: the warm fit of a handle of the weighted rows
    (the weight as the last column), and ``partial_fit`` over the chunks from the unweighted
    warm start, a handle of each chunk (its rows split across the ranks)."""
    import torch.distributed as dist

    from mixle_nb.parallel import TorchRunEncodedData

    dist.init_process_group("gloo")
    out = []
    for covariance_type in TYPES:
        x, w, start, chunks = weights_problem(covariance_type)
        weighted = copy.deepcopy(start)
        encoder = weighted.weighted_rows_encoder(x.shape[1])
        with TorchRunEncodedData(np.column_stack([x, w]), encoder=encoder) as h:
            fit_quietly(weighted, h)
        online = warm_started(BayesianGaussianMixture, covariance_type, "dirichlet_process", x)
        for rows in chunks:
            with TorchRunEncodedData(x[rows], estimator=online.mixture_estimator(x.shape[1])) as h:
                online.partial_fit(h)
        out.append({"weighted": fitted(weighted), "partial_fit": fitted(online)})
    dist.destroy_process_group()
    return out

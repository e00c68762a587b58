"""Data sets far from the origin and in awkward units, their starts, and independent numpy
references (tests/test_numerics.py; importable by the ranks of a process group)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

KINDS = ("full", "tied", "diag", "spherical")


@dataclass
class OffsetProblem:
    x: np.ndarray  # (N, D)
    labels: np.ndarray
    scales: np.ndarray  # (D,) spread of each coordinate
    start_means: np.ndarray  # (K, D)
    k: int


def offset_problem(
    offset: float, spread, dim: int, separation: float = 1e4, k: int = 3, per: int = 60, seed: int = 0
) -> OffsetProblem:
    """``k`` components ``separation`` spreads apart, at ``offset``; ``spread`` a number or
    ``"mixed"`` (coordinates' spreads from 1e-3 to 1e3). The start's means are the true ones
    moved by half a spread."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(1e-3, 1e3, dim) if spread == "mixed" else np.full(dim, float(spread))
    direction = rng.normal(size=dim)
    direction /= np.linalg.norm(direction)
    means = offset + separation * np.arange(k)[:, None] * direction[None, :] * scales
    labels = np.repeat(np.arange(k), per)
    mixing = np.eye(dim) + 0.3 * rng.normal(size=(k, dim, dim))  # correlated, each its own shape
    z = np.einsum("nij,nj->ni", mixing[labels], rng.standard_normal((len(labels), dim)))
    x = means[labels] + z * scales
    return OffsetProblem(x, labels, scales, means + 0.5 * scales * rng.normal(size=(k, dim)), k)


def labelled_fit(p: OffsetProblem, kind: str, reg_covar: float):
    """EM's fixed point when responsibilities are 0 or 1: each component's sample weight, mean and
    (co)variance (``kind`` as scikit-learn's ``covariance_type``), as full (K, D, D) covariances."""
    d = p.x.shape[1]
    w, means, covs = [], [], []
    for j in range(p.k):
        xj = p.x[p.labels == j]
        mean = xj.mean(axis=0)
        diff = xj - mean
        shift = diff.mean(axis=0)  # the rounding of ``mean``, taken out exactly
        means.append(mean + shift)
        covs.append((diff.T @ diff) / len(xj) - np.outer(shift, shift))
        w.append(len(xj) / len(p.x))
    covs = np.array(covs)
    if kind == "tied":
        covs[:] = np.einsum("k,kij->ij", np.array(w), covs)
    elif kind == "diag":
        covs = np.array([np.diag(np.diag(c)) for c in covs])
    elif kind == "spherical":
        covs = np.array([np.eye(d) * np.diag(c).mean() for c in covs])
    return np.array(w), np.array(means), covs + reg_covar * np.eye(d)


def average_log_likelihood(x: np.ndarray, w, means, covs) -> float:
    """Mean log-density of a Gaussian mixture, from centred differences (numpy, independent of
    mixle_nb and scikit-learn's raw expansions)."""
    terms = []
    for wk, mu, cov in zip(w, means, covs):
        chol = np.linalg.cholesky(cov)
        z = np.linalg.solve(chol, (x - mu).T)
        terms.append(
            np.log(wk) - 0.5 * (z * z).sum(axis=0) - np.log(np.diag(chol)).sum() - 0.5 * len(mu) * np.log(2 * np.pi)
        )
    return float(logsumexp(np.array(terms), axis=0).mean())


def full_covariances(model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(w, means (K, D), covariances (K, D, D))`` of one of our Gaussian mixtures."""
    means, covs = [], []
    for c in model.components:
        means.append(np.atleast_1d(c.mu))
        covs.append(c.covar if hasattr(c, "covar") else np.diag(np.atleast_1d(c.sigma2)))
    return np.asarray(model.w), np.array(means), np.array(covs)


def sklearn_covariances(gm, kind: str, k: int, d: int) -> np.ndarray:
    c = gm.covariances_
    if kind == "tied":
        return np.tile(c, (k, 1, 1))
    if kind == "diag":
        return np.array([np.diag(v) for v in c])
    if kind == "spherical":
        return np.array([np.eye(d) * v for v in c])
    return c


def estimator_and_start(p: OffsetProblem, kind: str, reg_covar: float):
    """Our mixture estimator of ``kind`` and the start (weights 1/K, covariance spread²·I)."""
    from mixle_nb.stats import (
        DiagonalGaussianDistribution,
        DiagonalGaussianEstimator,
        GaussianDistribution,
        GaussianEstimator,
        MixtureDistribution,
        MixtureEstimator,
        MultivariateGaussianDistribution,
        MultivariateGaussianEstimator,
        SphericalGaussianDistribution,
        SphericalGaussianEstimator,
    )

    d, k, var = p.x.shape[1], p.k, p.scales**2
    if d == 1 and kind in ("full", "tied"):  # the 1-D family: variance_key ties its variance
        ests = [GaussianEstimator(reg_covar=reg_covar, variance_key="v" if kind == "tied" else None)] * k
        comps = [GaussianDistribution(m[0], var[0]) for m in p.start_means]
    elif kind in ("full", "tied"):
        ests = [
            MultivariateGaussianEstimator(d, reg_covar=reg_covar, covariance_key="c" if kind == "tied" else None)
        ] * k
        comps = [MultivariateGaussianDistribution(m, np.diag(var)) for m in p.start_means]
    elif kind == "diag":
        ests = [DiagonalGaussianEstimator(d, reg_covar=reg_covar)] * k
        comps = [DiagonalGaussianDistribution(m, var) for m in p.start_means]
    else:
        ests = [SphericalGaussianEstimator(d, reg_covar=reg_covar)] * k
        comps = [SphericalGaussianDistribution(m, float(var.mean())) for m in p.start_means]
    return MixtureEstimator(ests), MixtureDistribution(comps, np.full(k, 1.0 / k))


def sklearn_start(p: OffsetProblem, kind: str) -> dict:
    """``GaussianMixture`` keywords for the same start as :func:`estimator_and_start`."""
    k, var = p.k, p.scales**2
    precisions = {
        "full": np.tile(np.diag(1 / var), (k, 1, 1)),
        "tied": np.diag(1 / var),
        "diag": np.tile(1 / var, (k, 1)),
        "spherical": np.full(k, 1 / var.mean()),
    }[kind]
    return dict(
        n_components=k,
        covariance_type=kind,
        weights_init=np.full(k, 1.0 / k),
        means_init=p.start_means,
        precisions_init=precisions,
        init_params="random",
        random_state=0,
    )

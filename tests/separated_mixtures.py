"""Ten generated datasets of well-separated Gaussian mixtures (1-D and D = 2..8, K = 3..8,
full and diagonal covariances), shared by the initialisation and model-choice tests and by
benchmarks/em_bench.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixle_nb.stats import (
    DiagonalGaussianEstimator,
    GaussianEstimator,
    MixtureEstimator,
    MultivariateGaussianEstimator,
)

# (D, K, covariance): "full" or "diag"; in 1-D both are the plain Gaussian.
SHAPES = [
    (1, 3, "full"),
    (1, 5, "diag"),
    (2, 3, "full"),
    (2, 4, "diag"),
    (3, 5, "full"),
    (4, 6, "diag"),
    (5, 4, "full"),
    (6, 7, "diag"),
    (7, 3, "full"),
    (8, 8, "full"),
]
POINTS_PER_COMPONENT = 120


@dataclass
class Dataset:
    name: str
    x: np.ndarray  # (N, D), or (N,) in 1-D
    dim: int
    k: int
    covariance: str

    def estimator(self, k: int = None) -> MixtureEstimator:
        k = self.k if k is None else k
        if self.dim == 1:
            return MixtureEstimator([GaussianEstimator() for _ in range(k)])
        if self.covariance == "diag":
            return MixtureEstimator([DiagonalGaussianEstimator(self.dim) for _ in range(k)])
        return MixtureEstimator([MultivariateGaussianEstimator(self.dim) for _ in range(k)])

    @property
    def sklearn_covariance(self) -> str:
        return "diag" if self.dim > 1 and self.covariance == "diag" else "full"


def separated_means(rng: np.random.Generator, dim: int, k: int, gap: float) -> np.ndarray:
    """``k`` means in a box, every pair at least ``gap`` apart (rejection sampling)."""
    side = gap * k ** (1.0 / dim) * 1.5
    means = [rng.uniform(-side, side, dim)]
    while len(means) < k:
        m = rng.uniform(-side, side, dim)
        if min(np.linalg.norm(m - other) for other in means) >= gap:
            means.append(m)
    return np.array(means)


def dataset(index: int) -> Dataset:
    dim, k, covariance = SHAPES[index]
    rng = np.random.default_rng(1000 + index)
    means = separated_means(rng, dim, k, gap=10.0)
    weights = rng.uniform(0.6, 1.4, k)
    counts = np.maximum((weights / weights.sum() * POINTS_PER_COMPONENT * k).astype(int), 20)
    parts = []
    for mean, n in zip(means, counts):
        if covariance == "full" and dim > 1:
            q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
            cov = q @ np.diag(rng.uniform(0.4, 1.6, dim)) @ q.T
        else:
            cov = np.diag(rng.uniform(0.4, 1.6, dim))
        parts.append(rng.multivariate_normal(mean, cov, size=n))
    x = rng.permutation(np.concatenate(parts))
    return Dataset(f"D={dim} K={k} {covariance}", x[:, 0] if dim == 1 else x, dim, k, covariance)


def datasets() -> list[Dataset]:
    return [dataset(i) for i in range(len(SHAPES))]

"""Gaussian with diagonal covariance in D dimensions.

Encoded as the points themselves; log-densities from whitened differences to each mean and
statistics about a reference point (:mod:`.frame`, :mod:`.centred_moments`), so fits do not
depend on where the data sit or on their units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import Distribution, Encoder, Estimator, check_finite, resolve_device
from .centred_moments import CentredMoments, check_reg_covar, diagonal_estimate, stacked_estimate
from .frame import DiagonalKernel, PointEncoding, point_encoding
from .sampler import Sampler

if TYPE_CHECKING:
    from .parameters import ParameterCount


def check_vectors(data: ArrayLike, dim: int | None, name: str) -> np.ndarray:
    x = np.asarray(data, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(
            f"{name} expects an (N, D) array of vectors; got shape {x.shape}. "
            "Reshape 1-D data with x[:, None] or use GaussianEstimator for scalars"
        )
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} has dimension {dim} but the data has {x.shape[1]} columns")
    return check_finite(x, name)


class DiagonalGaussianEncoder(Encoder):
    def __init__(self, dim: int | None = None):
        self.dim = dim

    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> PointEncoding:
        return point_encoding(check_vectors(data, self.dim, "DiagonalGaussian"), resolve_device(device))


class DiagonalGaussianDistribution(Distribution):
    """Independent Gaussians per coordinate: means ``mu`` (D,), variances ``sigma2`` (D,)."""

    def __init__(self, mu: ArrayLike, sigma2: ArrayLike):
        self.mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
        self.sigma2 = np.atleast_1d(np.asarray(sigma2, dtype=np.float64))
        if self.mu.shape != self.sigma2.shape or self.mu.ndim != 1:
            raise ValueError(f"mu {self.mu.shape} and sigma2 {self.sigma2.shape} must both be (D,)")
        if not (np.isfinite(self.mu).all() and (self.sigma2 > 0).all() and np.isfinite(self.sigma2).all()):
            raise ValueError("mu must be finite and every sigma2 finite and > 0")

    @classmethod
    def _estimated(cls, mu: np.ndarray, sigma2: np.ndarray) -> DiagonalGaussianDistribution:
        """An M-step's estimate (:func:`.centred_moments.diagonal_estimate`: finite means,
        variances > 0 by construction), without the checks again."""
        dist = cls.__new__(cls)
        dist.mu, dist.sigma2 = mu, sigma2
        return dist

    def __repr__(self) -> str:
        return f"DiagonalGaussianDistribution(mu={self.mu.tolist()}, sigma2={self.sigma2.tolist()})"

    @staticmethod
    def stacked_kernel(
        dists: Sequence[DiagonalGaussianDistribution], log_weights: np.ndarray | None = None
    ) -> DiagonalKernel:
        """``enc -> (K, N)`` log-densities of ``dists`` (+ ``log_weights``), parameters prepared
        here once per model (:class:`.frame.DiagonalKernel`)."""
        mu = np.stack([np.atleast_1d(d.mu) for d in dists])
        sigma2 = np.stack([np.atleast_1d(d.sigma2) for d in dists])
        return DiagonalKernel(mu, sigma2, log_weights)

    def device_log_density(self, enc: PointEncoding) -> torch.Tensor:
        return self.stacked_kernel([self])(enc)[0]

    def dist_to_encoder(self) -> Encoder:
        return DiagonalGaussianEncoder(len(self.mu))

    def estimator(self, **kwargs: Any) -> Estimator:  # the spherical subclass has its own estimator family
        return DiagonalGaussianEstimator(dim=len(self.mu), **kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.mu + np.sqrt(self.sigma2) * rng.standard_normal((n, len(self.mu)))

    def sampler(self, seed: int | np.random.SeedSequence | None = None) -> Sampler:
        return Sampler(self.draw, seed)


class DiagonalGaussianEstimator(Estimator):
    """M-step for a diagonal Gaussian. ``reg_covar`` is added to every estimated variance
    (scikit-learn's ``reg_covar``; with ``variance_key``, to the pooled variance). ``keys`` ties
    all statistics; ``variance_key`` ties only the variances (components sharing one variance)."""

    def __init__(
        self, dim: int | None = None, reg_covar: float = 1e-6, keys: str | None = None, variance_key: str | None = None
    ):
        self.dim, self.reg_covar, self.keys, self.variance_key = dim, check_reg_covar(reg_covar), keys, variance_key

    def make_accumulator(self) -> CentredMoments:
        return CentredMoments(self.dim, self.keys, DiagonalGaussianEncoder(self.dim), self.variance_key)

    def estimate(self, nobs: float | None, value: np.ndarray) -> DiagonalGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("DiagonalGaussianEstimator saw no data and has no dim; pass dim=D")
        return DiagonalGaussianDistribution._estimated(*diagonal_estimate(value, self.reg_covar))

    @staticmethod
    def stacked_estimate(
        estimators: Sequence[DiagonalGaussianEstimator], values: Sequence[np.ndarray]
    ) -> list[DiagonalGaussianDistribution] | None:
        """Every component's :meth:`estimate` at once (:func:`.centred_moments.stacked_estimate`);
        ``None`` for a subclass's estimators (the 1-D family's), when they differ in
        ``reg_covar`` or when one is degenerate (each then estimates alone)."""
        reg_covar = estimators[0].reg_covar
        if type(estimators[0]) is not DiagonalGaussianEstimator or any(e.reg_covar != reg_covar for e in estimators):
            return None
        found = stacked_estimate(values, reg_covar, full=False)
        if found is None:
            return None
        mean, variance, _ = found
        return [DiagonalGaussianDistribution._estimated(m, v) for m, v in zip(mean, variance)]

    def free_parameters(self, model: DiagonalGaussianDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # Estimator is not generic in its model: each family counts only its own
        """Also the 1-D :class:`GaussianEstimator`'s (its ``mu`` a number)."""
        if count.tied("all", self.keys):
            return 0
        dim = len(model.mu) if hasattr(model.mu, "__len__") else 1
        return dim + (0 if count.tied("variance", self.variance_key) else dim)

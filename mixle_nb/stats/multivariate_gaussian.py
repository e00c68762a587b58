"""Gaussian with full covariance.

Encoded as the points and, up to D = 16, their features ``[1, y, y_i·y_j]`` about the
encoding's own origin (``y = x - o``, exact); log-densities from those features or from
whitened differences ``Uᵀ(x - μ)`` (one product per block of rows) and statistics ``[n, n·c,
Σw(x-c), Σw(x-c)(x-c)ᵀ]`` about a reference point (:mod:`.frame`, :mod:`.centred_moments`), so
fits do not depend on where the data sit or on their units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import Distribution, Encoder, Estimator, resolve_device
from .centred_moments import CentredMoments, check_reg_covar, full_estimate
from .diagonal_gaussian import check_vectors
from .frame import LOG_2PI, FullKernel, PointEncoding, point_encoding
from .sampler import Sampler

if TYPE_CHECKING:
    from .parameters import ParameterCount


class MultivariateGaussianEncoder(Encoder):
    def __init__(self, dim: int | None = None):
        self.dim = dim

    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> PointEncoding:
        return point_encoding(
            check_vectors(data, self.dim, "MultivariateGaussian"), resolve_device(device), products=True
        )


class MultivariateGaussianDistribution(Distribution):
    """Mean ``mu`` (D,) and symmetric positive-definite covariance ``covar`` (D, D)."""

    def __init__(self, mu: ArrayLike, covar: ArrayLike):
        self.mu = np.asarray(mu, dtype=np.float64).reshape(-1)
        self.covar = np.asarray(covar, dtype=np.float64)
        d = len(self.mu)
        if self.covar.shape != (d, d):
            raise ValueError(f"covar must be ({d}, {d}) to match mu; got {self.covar.shape}")
        if not (np.isfinite(self.mu).all() and np.isfinite(self.covar).all()):
            raise ValueError("mu and covar must be finite")
        # np.allclose(covar, covar.T, rtol=1e-10, atol=0), without its per-call overhead
        if not (np.abs(self.covar - self.covar.T) <= 1e-10 * np.abs(self.covar.T)).all():
            raise ValueError("covar must be symmetric")
        try:
            chol = np.linalg.cholesky(self.covar)
        except np.linalg.LinAlgError:
            raise ValueError("covar is not positive definite; add a small multiple of the identity") from None
        self._set_cholesky(chol)

    def _set_cholesky(self, chol: np.ndarray) -> None:
        """The kernel's constants from the covariance's Cholesky factor ``chol``."""
        # Σ⁻¹ = U Uᵀ with U = L⁻ᵀ, so the Mahalanobis term is ‖(x - μ)ᵀ U‖².
        self._prec_chol = np.linalg.inv(chol).T
        self._log_norm = -0.5 * len(self.mu) * LOG_2PI - np.log(np.diagonal(chol)).sum()

    @classmethod
    def _estimated(cls, mu: np.ndarray, covar: np.ndarray, chol: np.ndarray) -> MultivariateGaussianDistribution:
        """An M-step's estimate: ``covar`` symmetric by construction and ``chol`` its Cholesky
        factor, already computed (:func:`.centred_moments.full_estimate`), so no checks again."""
        dist = cls.__new__(cls)
        dist.mu, dist.covar = mu, covar
        dist._set_cholesky(chol)
        return dist

    def __repr__(self) -> str:
        return f"MultivariateGaussianDistribution(mu={self.mu.tolist()}, covar={self.covar.tolist()})"

    @staticmethod
    def stacked_kernel(
        dists: Sequence[MultivariateGaussianDistribution], log_weights: np.ndarray | None = None
    ) -> FullKernel:
        """``enc -> (K, N)`` log-densities (+ ``log_weights``), parameters prepared here once
        per model (:class:`.frame.FullKernel`)."""
        return FullKernel(
            np.stack([m.mu for m in dists]),
            np.stack([m._prec_chol for m in dists]),
            np.array([m._log_norm for m in dists]),
            log_weights,
        )

    def device_log_density(self, enc: PointEncoding) -> torch.Tensor:
        return self.stacked_kernel([self])(enc)[0]

    def dist_to_encoder(self) -> Encoder:
        return MultivariateGaussianEncoder(len(self.mu))

    def estimator(self, **kwargs: Any) -> MultivariateGaussianEstimator:
        return MultivariateGaussianEstimator(dim=len(self.mu), **kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.multivariate_normal(self.mu, self.covar, size=n, method="cholesky")

    def sampler(self, seed: int | np.random.SeedSequence | None = None) -> Sampler:
        return Sampler(self.draw, seed)


class MultivariateGaussianEstimator(Estimator):
    """M-step for a full-covariance Gaussian.

    ``reg_covar`` is added to the covariance's diagonal (scikit-learn's meaning; with
    ``covariance_key``, once to the pooled within-component covariance, scikit-learn's
    ``"tied"``). ``keys`` ties all statistics; ``covariance_key`` ties only the covariance.
    """

    def __init__(
        self,
        dim: int | None = None,
        reg_covar: float = 1e-6,
        keys: str | None = None,
        covariance_key: str | None = None,
    ):
        self.dim, self.reg_covar, self.keys, self.covariance_key = dim, check_reg_covar(reg_covar), keys, covariance_key

    def make_accumulator(self) -> CentredMoments:
        return CentredMoments(
            self.dim, self.keys, MultivariateGaussianEncoder(self.dim), self.covariance_key, full=True
        )

    def estimate(self, nobs: float | None, value: np.ndarray) -> MultivariateGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("MultivariateGaussianEstimator saw no data and has no dim; pass dim=D")
        return MultivariateGaussianDistribution._estimated(*full_estimate(value, self.reg_covar))

    def free_parameters(self, model: MultivariateGaussianDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # Estimator is not generic in its model: each family counts only its own
        if count.tied("all", self.keys):
            return 0
        dim = len(model.mu)
        return dim + (0 if count.tied("covariance", self.covariance_key) else dim * (dim + 1) // 2)

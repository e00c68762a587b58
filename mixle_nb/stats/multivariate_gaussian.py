"""Gaussian with full covariance; statistics are ``[n, Σx, Σxxᵀ]`` flattened.

Log-densities and statistics are both products with the raw moments ``[1, x, xxᵀ]``, which
lose precision when the data sit far from the origin relative to their spread (|x| / σ above
about 1e4): centre such data before fitting.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np
import torch

from .base import (CPU, ArrayAccumulator, Distribution, Encoder, Estimator, combine_rows, device_tensor,
                   float_tensor, merge_into, resolve_device)
from .diagonal_gaussian import LOG_2PI, FeatureKernel, check_reg_covar, check_vectors
from .sampler import Sampler

# Up to this dimension the encoding keeps each row's quadratic features, (D+1)(D+2)/2 floats;
# above it they are built per E-step block, so memory stays O(N·D) at some cost in speed.
STORED_FEATURES_MAX_DIM = 16


@lru_cache(maxsize=None)
def _layout(d: int, device: torch.device = CPU) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upper-triangle row/column indices, and for each of the D² cells of xxᵀ its triangle
    slot, on ``device``."""
    upper = torch.triu_indices(d, d)
    slot = torch.empty(d, d, dtype=torch.long)
    slot[upper[0], upper[1]] = torch.arange(upper.shape[1])
    slot[upper[1], upper[0]] = torch.arange(upper.shape[1])
    return upper[0].to(device), upper[1].to(device), slot.reshape(-1).to(device)


def quadratic_features(x: torch.Tensor) -> torch.Tensor:
    """Features ``[1; x; x_i·x_j for i <= j]``, one column per row of ``x`` (N, D), on its device."""
    xt = x.T
    row, col, _ = _layout(x.shape[1], x.device)
    return torch.cat([torch.ones(1, len(x), dtype=torch.float64, device=x.device), xt, xt[row] * xt[col]])


@dataclass(frozen=True)
class QuadraticEncoding:
    """Vectors ``x`` (N, D) and, for small D, their stored quadratic features (F, N): one
    product with the features gives every component's log-density, another every weighted moment."""

    x: torch.Tensor
    stored: Optional[torch.Tensor] = None

    @property
    def features(self) -> torch.Tensor:
        return self.stored if self.stored is not None else quadratic_features(self.x)

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def built_features(self) -> int:
        """Features built per block (none when stored): a block's rows are sized by them."""
        d = self.x.shape[1]
        return 0 if self.stored is not None else (d + 1) * (d + 2) // 2

    def __len__(self) -> int:
        return len(self.x)

    def rows(self, start: int, stop: int) -> "QuadraticEncoding":
        """A block of rows, its features built once here when they are not stored."""
        x = self.x[start:stop]
        return QuadraticEncoding(x, self.stored[:, start:stop] if self.stored is not None else quadratic_features(x))


class MultivariateGaussianEncoder(Encoder):
    def __init__(self, dim: Optional[int] = None):
        self.dim = dim

    def seq_encode(self, data, device=None) -> QuadraticEncoding:
        x = float_tensor(np.ascontiguousarray(check_vectors(data, self.dim, "MultivariateGaussian")))
        x = x.to(resolve_device(device))
        return QuadraticEncoding(x, quadratic_features(x) if x.shape[1] <= STORED_FEATURES_MAX_DIM else None)


class MultivariateGaussianDistribution(Distribution):
    """Mean ``mu`` (D,) and symmetric positive-definite covariance ``covar`` (D, D)."""

    def __init__(self, mu, covar):
        self.mu = np.asarray(mu, dtype=np.float64).reshape(-1)
        self.covar = np.asarray(covar, dtype=np.float64)
        d = len(self.mu)
        if self.covar.shape != (d, d):
            raise ValueError(f"covar must be ({d}, {d}) to match mu; got {self.covar.shape}")
        if not (np.all(np.isfinite(self.mu)) and np.all(np.isfinite(self.covar))):
            raise ValueError("mu and covar must be finite")
        if not np.allclose(self.covar, self.covar.T, rtol=1e-10, atol=0):
            raise ValueError("covar must be symmetric")
        try:
            chol = np.linalg.cholesky(self.covar)
        except np.linalg.LinAlgError:
            raise ValueError("covar is not positive definite; add a small multiple of the identity") from None
        # Σ⁻¹ = U Uᵀ with U = L⁻ᵀ, so the Mahalanobis term is ‖(x - μ)ᵀ U‖².
        self._prec_chol = np.linalg.inv(chol).T
        self._log_norm = -0.5 * d * LOG_2PI - np.log(np.diag(chol)).sum()

    def __repr__(self) -> str:
        return f"MultivariateGaussianDistribution(mu={self.mu.tolist()}, covar={self.covar.tolist()})"

    @staticmethod
    def stacked_kernel(dists, log_weights=None):
        """``enc -> (K, N)`` log-densities (+ ``log_weights``) as one product of the quadratic
        features with a (K, features) coefficient matrix prepared here, once per model."""
        d = len(dists[0].mu)
        row, col, _ = _layout(d)
        coefficients = []
        for m in dists:
            precision = m._prec_chol @ m._prec_chol.T
            linear = precision @ m.mu
            # -½ (x - μ)ᵀ Σ⁻¹ (x - μ): off-diagonal products appear twice in the quadratic form.
            quadratic = np.where(row == col, -0.5, -1.0) * precision[row.numpy(), col.numpy()]
            coefficients.append(np.concatenate([[m._log_norm - 0.5 * m.mu @ linear], linear, quadratic]))
        coefficients = np.stack(coefficients)
        if log_weights is not None:
            coefficients[:, 0] += log_weights
        return FeatureKernel(coefficients)

    def device_log_density(self, enc: QuadraticEncoding) -> torch.Tensor:
        return self.stacked_kernel([self])(enc)[0]

    def dist_to_encoder(self) -> Encoder:
        return MultivariateGaussianEncoder(len(self.mu))

    def estimator(self, **kwargs) -> "MultivariateGaussianEstimator":
        return MultivariateGaussianEstimator(dim=len(self.mu), **kwargs)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.multivariate_normal(self.mu, self.covar, size=n, method="cholesky")

    def sampler(self, seed=None) -> Sampler:
        return Sampler(self._draw, seed)


def _second_moments(enc: QuadraticEncoding, weights: torch.Tensor) -> torch.Tensor:
    """``(K, 1 + D + D²)`` rows ``[Σw, Σw·x, Σw·xxᵀ]`` for weights of shape (K, N)."""
    d = enc.x.shape[1]
    sums = weights @ enc.features.T
    return torch.cat([sums[:, : 1 + d], sums[:, 1 + d :][:, _layout(d, sums.device)[2]]], dim=1)


class MultivariateGaussianAccumulator(ArrayAccumulator):
    """Weighted ``[n, Σx, Σxxᵀ]``. ``covariance_key`` pools the within-component scatter
    ``Σxxᵀ - ΣxΣxᵀ/n`` across accumulators: one shared ("tied") covariance, own means."""

    def __init__(self, dim: Optional[int], keys: Optional[str], covariance_key: Optional[str] = None):
        super().__init__(0 if dim is None else 1 + dim + dim * dim, keys)
        self.dim, self.covariance_key = dim, covariance_key

    def _split(self):
        d = int(round((np.sqrt(4 * len(self.stats) - 3) - 1) / 2))
        return self.stats[0], self.stats[1 : 1 + d], self.stats[1 + d :].reshape(d, d)

    def key_merge(self, stats: dict) -> None:
        super().key_merge(stats)
        if self.covariance_key is not None and self.stats.size:
            n, s1, s2 = self._split()
            within = s2 - np.outer(s1, s1) / n if n > 0 else 0 * s2
            merge_into(stats, self.covariance_key, np.concatenate([[n], within.ravel()]))

    def key_replace(self, stats: dict) -> None:
        super().key_replace(stats)
        if self.covariance_key is not None and self.stats.size:
            pooled = stats[self.covariance_key].stats
            n, s1, s2 = self._split()
            if n > 0 and pooled[0] > 0:  # rewrite Σxxᵀ so this M-step yields the pooled covariance
                s2[:] = n * pooled[1:].reshape(s2.shape) / pooled[0] + np.outer(s1, s1) / n

    def seq_update(self, enc: QuadraticEncoding, weights, model):
        w = (torch.ones(1, len(enc), dtype=torch.float64, device=enc.device) if weights is None
             else device_tensor(weights, enc.device)[None])
        self.combine(_second_moments(enc, w)[0].cpu().numpy())

    @staticmethod
    def stacked_seq_update(accumulators, enc: QuadraticEncoding, resp: torch.Tensor) -> np.ndarray:
        """Add column k of ``resp`` as the weights of accumulator k; returns each one's weight total."""
        return combine_rows(accumulators, _second_moments(enc, resp).cpu().numpy())

    def acc_to_encoder(self) -> Encoder:
        return MultivariateGaussianEncoder(self.dim)


class MultivariateGaussianEstimator(Estimator):
    """M-step for a full-covariance Gaussian.

    ``reg_covar`` is added to the covariance's diagonal (scikit-learn's meaning; with
    ``covariance_key``, once to the pooled within-component covariance, scikit-learn's
    ``"tied"``). ``keys`` ties all statistics; ``covariance_key`` ties only the covariance.
    """

    def __init__(self, dim: Optional[int] = None, reg_covar: float = 1e-6, keys: Optional[str] = None,
                 covariance_key: Optional[str] = None):
        self.dim, self.reg_covar, self.keys, self.covariance_key = dim, check_reg_covar(reg_covar), keys, covariance_key

    def make_accumulator(self) -> MultivariateGaussianAccumulator:
        return MultivariateGaussianAccumulator(self.dim, self.keys, self.covariance_key)

    def estimate(self, nobs, value: np.ndarray) -> MultivariateGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("MultivariateGaussianEstimator saw no data and has no dim; pass dim=D")
        d = int(round((np.sqrt(4 * len(value) - 3) - 1) / 2))
        n = value[0]
        if n <= 0:
            return MultivariateGaussianDistribution(np.zeros(d), np.eye(d))
        mu = value[1 : 1 + d] / n
        covar = value[1 + d :].reshape(d, d) / n - np.outer(mu, mu)
        covar = 0.5 * (covar + covar.T)
        covar[np.diag_indices(d)] += self.reg_covar
        return MultivariateGaussianDistribution(mu, covar)

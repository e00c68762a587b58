"""Gaussian with diagonal covariance in D dimensions; statistics are the moments [1, x, x²].

Log-densities and statistics are both products with the raw moments, which lose precision
when the data sit far from the origin relative to their spread (log-densities to about 1e-8
relative at |x| / σ = 1e4): centre such data before fitting.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .base import (CPU, ArrayAccumulator, Distribution, Encoder, Estimator, check_finite, combine_rows,
                   device_tensor, float_tensor, merge_into, resolve_device)
from .sampler import Sampler

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class MomentEncoding:
    """Features ``[1; x_1..x_D; x_1²..x_D²]``, one column per observation, shape (1 + 2D, N):
    one product gives every component's log-density, another every weighted moment."""

    features: torch.Tensor

    def __len__(self) -> int:
        return self.features.shape[1]

    @property
    def device(self) -> torch.device:
        return self.features.device

    def rows(self, start: int, stop: int) -> "MomentEncoding":
        return MomentEncoding(self.features[:, start:stop])


def moment_encoding(x: np.ndarray, device: torch.device) -> MomentEncoding:
    """The features of ``x`` (N, D), built on ``device`` (only ``x`` crosses to it)."""
    xt = float_tensor(x).to(device).T
    return MomentEncoding(torch.cat([torch.ones(1, len(x), dtype=torch.float64, device=device), xt, xt * xt]))


class FeatureKernel:
    """``enc -> (K, N)`` log-densities of a family whose log-density is linear in the encoded
    features: ``coefficients`` (K, F) times ``enc.features`` (F, N). The coefficients are
    prepared once per model and copied once to each device an encoding asks for."""

    def __init__(self, coefficients: np.ndarray):
        self._on = {CPU: torch.from_numpy(coefficients)}

    def __call__(self, enc) -> torch.Tensor:
        features = enc.features
        coefficients = self._on.get(features.device)
        if coefficients is None:
            coefficients = self._on[features.device] = self._on[CPU].to(features.device)
        return coefficients @ features


def weighted_moments(enc: MomentEncoding, weights) -> np.ndarray:
    """Sums of the weights, weighted x and weighted x²: ``(1+2D,)`` for weights ``None`` or of
    shape (N,), ``(K, 1+2D)`` for weights of shape (K, N). Summed on the encoding's device;
    only the sums come back."""
    if weights is None:
        return enc.features.sum(dim=1).cpu().numpy()
    w = device_tensor(weights, enc.device)
    return (enc.features @ w if w.ndim == 1 else w @ enc.features.T).cpu().numpy()


def check_reg_covar(reg_covar) -> float:
    """``reg_covar`` as a float: finite and >= 0."""
    value = float(reg_covar)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"reg_covar must be a finite number >= 0 (scikit-learn's default is 1e-6); got {reg_covar!r}")
    return value


def check_vectors(data, dim: Optional[int], name: str) -> np.ndarray:
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
    def __init__(self, dim: Optional[int] = None):
        self.dim = dim

    def seq_encode(self, data, device=None) -> MomentEncoding:
        return moment_encoding(check_vectors(data, self.dim, "DiagonalGaussian"), resolve_device(device))


class DiagonalGaussianDistribution(Distribution):
    """Independent Gaussians per coordinate: means ``mu`` (D,), variances ``sigma2`` (D,)."""

    def __init__(self, mu, sigma2):
        self.mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
        self.sigma2 = np.atleast_1d(np.asarray(sigma2, dtype=np.float64))
        if self.mu.shape != self.sigma2.shape or self.mu.ndim != 1:
            raise ValueError(f"mu {self.mu.shape} and sigma2 {self.sigma2.shape} must both be (D,)")
        if not (np.all(np.isfinite(self.mu)) and np.all(self.sigma2 > 0) and np.all(np.isfinite(self.sigma2))):
            raise ValueError("mu must be finite and every sigma2 finite and > 0")

    def __repr__(self) -> str:
        return f"DiagonalGaussianDistribution(mu={self.mu.tolist()}, sigma2={self.sigma2.tolist()})"

    @staticmethod
    def stacked_kernel(dists, log_weights=None):
        """``enc -> (K, N)`` log-densities of ``dists`` (+ ``log_weights``) as one product of the
        moment features with coefficients prepared here, once per model:
        ``-(x - μ)²/(2σ²) = -μ²/(2σ²) + x·μ/σ² - x²/(2σ²)`` per coordinate."""
        mu = np.stack([np.atleast_1d(d.mu) for d in dists])
        sigma2 = np.stack([np.atleast_1d(d.sigma2) for d in dists])
        half_precision = 0.5 / sigma2
        const = -0.5 * (mu.shape[1] * LOG_2PI + np.log(sigma2).sum(axis=1)) - (mu * mu * half_precision).sum(axis=1)
        if log_weights is not None:
            const = const + log_weights
        coefficients = np.concatenate([const[:, None], 2.0 * mu * half_precision, -half_precision], axis=1)
        return FeatureKernel(coefficients)

    def device_log_density(self, enc: MomentEncoding) -> torch.Tensor:
        return self.stacked_kernel([self])(enc)[0]

    def dist_to_encoder(self) -> Encoder:
        return DiagonalGaussianEncoder(len(self.mu))

    def estimator(self, **kwargs) -> "DiagonalGaussianEstimator":
        return DiagonalGaussianEstimator(dim=len(self.mu), **kwargs)

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.mu + np.sqrt(self.sigma2) * rng.standard_normal((n, len(self.mu)))

    def sampler(self, seed=None) -> Sampler:
        return Sampler(self._draw, seed)


class MomentAccumulator(ArrayAccumulator):
    """Weighted ``[n, Σx, Σx²]`` for the diagonal and 1-D Gaussians.

    ``variance_key`` pools the within-component scatter ``Σx² - (Σx)²/n`` of every accumulator
    with that key, so they estimate one shared variance but keep their own means.
    """

    def __init__(self, dim: Optional[int], keys: Optional[str], encoder: Encoder,
                 variance_key: Optional[str] = None):
        super().__init__(0 if dim is None else 1 + 2 * dim, keys)
        self.encoder, self.variance_key = encoder, variance_key

    def _split(self):
        d = (len(self.stats) - 1) // 2
        return self.stats[0], self.stats[1 : 1 + d], self.stats[1 + d :]

    def key_merge(self, stats: dict) -> None:
        super().key_merge(stats)
        if self.variance_key is not None and self.stats.size:
            n, s1, s2 = self._split()
            merge_into(stats, self.variance_key, np.concatenate([[n], s2 - s1 * s1 / n if n > 0 else 0 * s2]))

    def key_replace(self, stats: dict) -> None:
        super().key_replace(stats)
        if self.variance_key is not None and self.stats.size:
            pooled = stats[self.variance_key].stats
            n, s1, s2 = self._split()
            if n > 0 and pooled[0] > 0:  # rewrite Σx² so this component's M-step yields the pooled variance
                s2[:] = n * pooled[1:] / pooled[0] + s1 * s1 / n

    def seq_update(self, enc: MomentEncoding, weights, model):
        self.combine(weighted_moments(enc, weights))

    @staticmethod
    def stacked_seq_update(accumulators, enc: MomentEncoding, resp: torch.Tensor) -> np.ndarray:
        """Add column k of ``resp`` as the weights of accumulator k; returns each one's weight total."""
        return combine_rows(accumulators, weighted_moments(enc, resp))

    def acc_to_encoder(self) -> Encoder:
        return self.encoder


def moment_estimate(nobs_value: np.ndarray, reg_covar: float):
    """Means and variances from ``[n, Σx, Σx²]``, ``reg_covar`` added to each variance (after
    rounding's negatives are cut to 0); an empty component gets N(0, 1)."""
    dim = (len(nobs_value) - 1) // 2
    n = nobs_value[0]
    if n <= 0:
        return np.zeros(dim), np.ones(dim)
    mu = nobs_value[1 : 1 + dim] / n
    sigma2 = nobs_value[1 + dim :] / n - mu * mu
    return mu, np.maximum(sigma2, 0.0) + reg_covar


class DiagonalGaussianEstimator(Estimator):
    """M-step for a diagonal Gaussian. ``reg_covar`` is added to every estimated variance
    (scikit-learn's ``reg_covar``; with ``variance_key``, to the pooled variance). ``keys`` ties
    all statistics; ``variance_key`` ties only the variances (components sharing one variance)."""

    def __init__(self, dim: Optional[int] = None, reg_covar: float = 1e-6, keys: Optional[str] = None,
                 variance_key: Optional[str] = None):
        self.dim, self.reg_covar, self.keys, self.variance_key = dim, check_reg_covar(reg_covar), keys, variance_key

    def make_accumulator(self) -> MomentAccumulator:
        return MomentAccumulator(self.dim, self.keys, DiagonalGaussianEncoder(self.dim), self.variance_key)

    def estimate(self, nobs, value: np.ndarray) -> DiagonalGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("DiagonalGaussianEstimator saw no data and has no dim; pass dim=D")
        return DiagonalGaussianDistribution(*moment_estimate(value, self.reg_covar))

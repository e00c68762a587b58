"""The 1-D Gaussian: the diagonal Gaussian's kernels with D = 1 and scalar parameters."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import Encoder, check_finite, resolve_device
from .centred_moments import CentredMoments, diagonal_estimate
from .diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEstimator
from .frame import PointEncoding, point_encoding


class GaussianEncoder(Encoder):
    def __init__(self, dtype: torch.dtype = torch.float64):
        self.dtype = dtype

    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> PointEncoding:
        x = np.asarray(data, dtype=np.float64)
        if x.ndim == 2 and x.shape[1] == 1:
            x = x[:, 0]
        if x.ndim != 1:
            raise ValueError(
                f"GaussianDistribution expects a 1-D sequence of numbers; got shape {x.shape}. "
                "For vectors use DiagonalGaussianEstimator or MultivariateGaussianEstimator"
            )
        return point_encoding(check_finite(x, "Gaussian")[:, None], resolve_device(device), dtype=self.dtype)


class GaussianDistribution(DiagonalGaussianDistribution):
    """Univariate normal with mean ``mu`` and variance ``sigma2``.

    Parameters
    ----------
    mu : float
        The mean.
    sigma2 : float
        The variance, > 0.

    Raises
    ------
    ValueError
        A mean or variance that is not finite, or a variance <= 0.

    See Also
    --------
    GaussianEstimator, DiagonalGaussianDistribution

    Examples
    --------
    >>> from mixle_nb.stats import GaussianDistribution
    >>> model = GaussianDistribution(0.0, 4.0)
    >>> round(model.log_density(0.0), 4)
    -1.6121
    >>> model.sampler(seed=0).sample(2).round(3)
    array([ 0.251, -0.264])
    """

    def __init__(self, mu: float, sigma2: float):  # scalar checks: an M-step builds K of these
        # the 1-D family keeps numbers where its parent keeps (D,) arrays (its own draw, repr, estimate)
        self.mu, self.sigma2 = float(mu), float(sigma2)  # type: ignore[assignment]
        if not (math.isfinite(self.mu) and math.isfinite(self.sigma2) and self.sigma2 > 0):
            raise ValueError(f"mu must be finite and sigma2 finite and > 0; got mu={mu!r}, sigma2={sigma2!r}")

    def __repr__(self) -> str:
        return f"GaussianDistribution(mu={self.mu!r}, sigma2={self.sigma2!r})"

    def dist_to_encoder(self) -> Encoder:
        return GaussianEncoder()

    def estimator(self, **kwargs: Any) -> GaussianEstimator:
        return GaussianEstimator(**kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.mu + math.sqrt(self.sigma2) * rng.standard_normal(n)


class GaussianEstimator(DiagonalGaussianEstimator):
    """M-step for a 1-D Gaussian.

    Parameters
    ----------
    reg_covar : float, default 1e-6
        Added to the estimated variance (scikit-learn's meaning).
    keys : str, optional
        Ties all statistics with every estimator of the same key.
    variance_key : str, optional
        Ties only the variance: components sharing one variance, each with its own mean.
    dtype : torch.dtype, numpy dtype or str, default float64
        The E-step's arithmetic: ``"float32"`` (``torch.float32``, ``np.float32``) encodes the data
        in float32 and computes the log-densities and responsibilities in float32, halving the
        encoding's memory; the sums and the objective still add up in float64 and the parameters
        stay float64 (see the numerics guide for what float32 keeps and what it gives up).

    Raises
    ------
    ValueError
        A ``reg_covar`` that is negative or not finite, or a ``dtype`` other than float32 or float64.

    See Also
    --------
    GaussianDistribution, MixtureEstimator

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, seq_encode, seq_estimate
    >>> estimator = GaussianEstimator(reg_covar=0.0)
    >>> model = seq_estimate(seq_encode(np.array([1.0, 2.0, 3.0]), estimator=estimator), estimator, None)
    >>> model.mu, round(model.sigma2, 4)
    (2.0, 0.6667)
    """

    def __init__(
        self, reg_covar: float = 1e-6, keys: str | None = None, variance_key: str | None = None, dtype: Any = None
    ):
        super().__init__(dim=1, reg_covar=reg_covar, keys=keys, variance_key=variance_key, dtype=dtype)

    def make_accumulator(self) -> CentredMoments:
        return CentredMoments(1, self.keys, GaussianEncoder(self.dtype), self.variance_key)

    def estimate(self, nobs: float | None, value: np.ndarray) -> GaussianDistribution:
        mu, sigma2 = diagonal_estimate(value, self.reg_covar)
        return GaussianDistribution(mu[0], sigma2[0])

"""Gaussian in D dimensions with one variance shared by every coordinate (covariance σ²·I).

It reads the diagonal Gaussian's encoding and statistics; only the M-step differs: the
per-coordinate variances are averaged, as scikit-learn's ``covariance_type="spherical"`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .base import Estimator
from .centred_moments import CentredMoments, check_reg_covar, diagonal_estimate, stacked_estimate
from .diagonal_gaussian import DiagonalGaussianDistribution, DiagonalGaussianEncoder
from .frame import encoding_dtype

if TYPE_CHECKING:
    from .parameters import ParameterCount


class SphericalGaussianDistribution(DiagonalGaussianDistribution):
    """A Gaussian with one variance for every coordinate.

    Parameters
    ----------
    mu : array_like
        The means, ``(D,)``.
    variance : float
        The variance of every coordinate, > 0.

    Raises
    ------
    ValueError
        A mean or variance that is not finite, or a variance <= 0.

    See Also
    --------
    SphericalGaussianEstimator, DiagonalGaussianDistribution

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import SphericalGaussianDistribution
    >>> model = SphericalGaussianDistribution([0.0, 0.0], 1.0)
    >>> bool(np.isclose(model.log_density([0.0, 0.0]), -np.log(2 * np.pi)))
    True
    """

    def __init__(self, mu: ArrayLike, variance: float):
        mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
        variance = float(variance)
        if not (math.isfinite(variance) and variance > 0):
            raise ValueError(f"variance must be finite and > 0; got {variance!r}")
        super().__init__(mu, np.full(mu.shape, variance))
        self.variance = variance

    @classmethod
    def _estimated(cls, mu: np.ndarray, variance: float, sigma2: np.ndarray) -> SphericalGaussianDistribution:  # type: ignore[override]  # its parameters are (mu, variance)
        """An M-step's estimate (finite means, variance > 0 by construction), unchecked;
        ``sigma2`` is ``variance`` in every coordinate (made for all the components at once)."""
        dist = cls.__new__(cls)
        dist.mu, dist.sigma2, dist.variance = mu, sigma2, variance
        return dist

    def __repr__(self) -> str:
        return f"SphericalGaussianDistribution(mu={self.mu.tolist()}, variance={self.variance!r})"

    def estimator(self, **kwargs: Any) -> SphericalGaussianEstimator:
        return SphericalGaussianEstimator(dim=len(self.mu), **kwargs)


class SphericalGaussianEstimator(Estimator):
    """M-step for a spherical Gaussian, as scikit-learn's ``covariance_type="spherical"``.

    The variance is the mean of the coordinates' variances plus ``reg_covar``.

    Parameters
    ----------
    dim : int, optional
        The dimension D (default: taken from the data).
    reg_covar : float, default 1e-6
        Added to the estimated variance.
    keys : str, optional
        Ties all statistics with every estimator of the same key.
    variance_key : str, optional
        Ties only the variance: components sharing one σ², each with its own mean.
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
    SphericalGaussianDistribution

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import SphericalGaussianEstimator, seq_encode, seq_estimate
    >>> x = np.array([[0.0, 1.0], [2.0, 5.0]])
    >>> estimator = SphericalGaussianEstimator(reg_covar=0.0)
    >>> model = seq_estimate(seq_encode(x, estimator=estimator), estimator, None)
    >>> model.mu.tolist(), model.variance
    ([1.0, 3.0], 2.5)
    """

    def __init__(
        self,
        dim: int | None = None,
        reg_covar: float = 1e-6,
        keys: str | None = None,
        variance_key: str | None = None,
        dtype: Any = None,
    ):
        self.dim, self.reg_covar, self.keys, self.variance_key = dim, check_reg_covar(reg_covar), keys, variance_key
        self.dtype = encoding_dtype(dtype)

    def make_accumulator(self) -> CentredMoments:
        return CentredMoments(self.dim, self.keys, DiagonalGaussianEncoder(self.dim, self.dtype), self.variance_key)

    def estimate(self, nobs: float | None, value: np.ndarray) -> SphericalGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("SphericalGaussianEstimator saw no data and has no dim; pass dim=D")
        return SphericalGaussianDistribution(*diagonal_estimate(value, self.reg_covar, spherical=True))

    @staticmethod
    def stacked_estimate(
        estimators: Sequence[SphericalGaussianEstimator], values: Sequence[np.ndarray]
    ) -> list[SphericalGaussianDistribution] | None:
        """Every component's :meth:`estimate` at once (``centred_moments.stacked_estimate``);
        ``None`` when they differ in ``reg_covar`` or one is degenerate (each then estimates alone)."""
        reg_covar = estimators[0].reg_covar
        if any(e.reg_covar != reg_covar for e in estimators):
            return None
        found = stacked_estimate(values, reg_covar, full=False, spherical=True)
        if found is None:
            return None
        mean, variance, _ = found
        sigma2 = np.repeat(variance[:, None], mean.shape[1], axis=1)
        return [SphericalGaussianDistribution._estimated(m, v, s) for m, v, s in zip(mean, variance.tolist(), sigma2)]

    def free_parameters(self, model: SphericalGaussianDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # Estimator is not generic in its model: each family counts only its own
        if count.tied("all", self.keys):
            return 0
        return len(model.mu) + (0 if count.tied("variance", self.variance_key) else 1)

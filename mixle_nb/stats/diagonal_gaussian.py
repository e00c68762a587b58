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
from .frame import DiagonalKernel, PointEncoding, encoding_dtype, point_encoding
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
    def __init__(self, dim: int | None = None, dtype: torch.dtype = torch.float64):
        self.dim, self.dtype = dim, dtype

    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> PointEncoding:
        x = check_vectors(data, self.dim, "DiagonalGaussian")
        return point_encoding(x, resolve_device(device), dtype=self.dtype)


class DiagonalGaussianDistribution(Distribution):
    """Independent Gaussians per coordinate.

    Parameters
    ----------
    mu : array_like
        The means, ``(D,)``.
    sigma2 : array_like
        The variances, ``(D,)``, each > 0.

    Raises
    ------
    ValueError
        A mean or variance that is not finite, or a variance <= 0.

    See Also
    --------
    DiagonalGaussianEstimator, SphericalGaussianDistribution, MultivariateGaussianDistribution

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import DiagonalGaussianDistribution
    >>> model = DiagonalGaussianDistribution([0.0, 1.0], [1.0, 2.0])
    >>> bool(np.isclose(model.log_density([0.0, 1.0]), -np.log(2 * np.pi) - 0.5 * np.log(2.0)))
    True
    >>> model.sampler(seed=0).sample(3).shape
    (3, 2)
    """

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
        """The batched log-density kernel of several components of this family.

        The parameters are prepared here once per model; a mixture's E-step then runs one kernel
        for all its components.

        Parameters
        ----------
        dists : sequence of DiagonalGaussianDistribution
            The components, K of them.
        log_weights : numpy.ndarray, optional
            ``(K,)`` log-weights added to each component's row (a mixture's joint).

        Returns
        -------
        DiagonalKernel
            ``enc -> (K, N)`` log-densities (``mixle_nb.stats.frame.DiagonalKernel``).
        """
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
        """A sampler drawing from this distribution.

        Parameters
        ----------
        seed : int or numpy.random.SeedSequence, optional
            The seed of its random source.

        Returns
        -------
        Sampler
            ``sample(n)`` draws ``n`` observations; ``sample()`` one.
        """
        return Sampler(self.draw, seed)


class DiagonalGaussianEstimator(Estimator):
    """M-step for a diagonal Gaussian.

    Parameters
    ----------
    dim : int, optional
        The dimension D (default: taken from the data).
    reg_covar : float, default 1e-6
        Added to every estimated variance (scikit-learn's ``reg_covar``; with ``variance_key``,
        to the pooled variance).
    keys : str, optional
        Ties all statistics with every estimator of the same key.
    variance_key : str, optional
        Ties only the variances: components sharing one variance vector, each with its own mean.
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
    DiagonalGaussianDistribution

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import DiagonalGaussianEstimator, seq_encode, seq_estimate
    >>> x = np.array([[0.0, 1.0], [2.0, 5.0]])
    >>> estimator = DiagonalGaussianEstimator(reg_covar=0.0)
    >>> model = seq_estimate(seq_encode(x, estimator=estimator), estimator, None)
    >>> model.mu.tolist(), model.sigma2.tolist()
    ([1.0, 3.0], [1.0, 4.0])
    >>> float32 = DiagonalGaussianEstimator(reg_covar=0.0, dtype="float32")  # the E-step in float32
    >>> seq_estimate(seq_encode(x, estimator=float32), float32, model).mu.tolist()
    [1.0, 3.0]
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

    def estimate(self, nobs: float | None, value: np.ndarray) -> DiagonalGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("DiagonalGaussianEstimator saw no data and has no dim; pass dim=D")
        return DiagonalGaussianDistribution._estimated(*diagonal_estimate(value, self.reg_covar))

    @staticmethod
    def stacked_estimate(
        estimators: Sequence[DiagonalGaussianEstimator], values: Sequence[np.ndarray]
    ) -> list[DiagonalGaussianDistribution] | None:
        """Every component's :meth:`estimate` at once (``centred_moments.stacked_estimate``);
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
        """How many free parameters ``model`` has as this estimator fits it.

        Also the 1-D :class:`GaussianEstimator`'s (its ``mu`` a number): D means and D variances,
        none of a tied kind counted twice.

        Parameters
        ----------
        model : DiagonalGaussianDistribution
            A fitted model of this family.
        count : ParameterCount
            The count in progress (which keys were counted already).

        Returns
        -------
        int
            ``2 D``, ``D`` when the variances are tied and counted already, 0 when ``keys`` is.
        """
        if count.tied("all", self.keys):
            return 0
        dim = len(model.mu) if hasattr(model.mu, "__len__") else 1
        return dim + (0 if count.tied("variance", self.variance_key) else dim)

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
from scipy.linalg import lapack

from . import full_covariance
from .base import Distribution, Encoder, Estimator, resolve_device
from .centred_moments import CentredMoments, check_reg_covar, full_estimate, stacked_estimate
from .diagonal_gaussian import check_vectors
from .frame import LOG_2PI, FullKernel, PointEncoding, encoding_dtype, point_encoding
from .full_covariance import BandedFullKernel
from .sampler import Sampler

if TYPE_CHECKING:
    from .parameters import ParameterCount


class MultivariateGaussianEncoder(Encoder):
    def __init__(self, dim: int | None = None, dtype: torch.dtype = torch.float64):
        self.dim, self.dtype = dim, dtype

    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> PointEncoding:
        x = check_vectors(data, self.dim, "MultivariateGaussian")
        return point_encoding(x, resolve_device(device), products=True, dtype=self.dtype)


# Cholesky factors up to this D are inverted by numpy's general inverse, all at once; above it each
# by LAPACK's triangular inverse (dtrtri), the same arithmetic for one factor and for a batch (a
# component's own M-step and the stacked one agree to the bit). Measured (one thread): one factor of
# D = 64 14 us (torch's triangular solve 25 us), 32 of D = 16 43 us (the general inverse 67 us),
# of D = 8 28 us (the general inverse 20 us).
TRIANGULAR_INVERSE_DIM = 8


def kernel_constants(chol: np.ndarray) -> tuple[np.ndarray, Any]:
    """``U = L⁻ᵀ`` (``Σ⁻¹ = U Uᵀ``, so the Mahalanobis term is ‖(x - μ)ᵀ U‖²) and the log
    normaliser (a float, or one per leading index) from Cholesky factors ``chol`` (..., D, D),
    leading axes batched."""
    d = chol.shape[-1]
    if d <= TRIANGULAR_INVERSE_DIM:
        inverse = np.linalg.inv(chol)
    else:
        inverse = np.empty_like(chol)
        for factor, into in zip(chol.reshape(-1, d, d), inverse.reshape(-1, d, d)):
            into[...], info = lapack.dtrtri(factor, lower=1)
            if info != 0:  # a Cholesky factor's diagonal is > 0: only a caller's error gets here
                raise np.linalg.LinAlgError(f"the Cholesky factor is singular (LAPACK dtrtri info={info})")
    prec_chol = np.swapaxes(inverse, -1, -2)
    return prec_chol, -0.5 * d * LOG_2PI - np.log(np.diagonal(chol, axis1=-2, axis2=-1)).sum(axis=-1)


class MultivariateGaussianDistribution(Distribution):
    """A Gaussian with a full covariance matrix.

    Parameters
    ----------
    mu : array_like
        The mean, ``(D,)``.
    covar : array_like
        The covariance, ``(D, D)``, symmetric positive definite.

    Raises
    ------
    ValueError
        A covariance that is not symmetric positive definite, or shapes that do not agree.

    See Also
    --------
    MultivariateGaussianEstimator, DiagonalGaussianDistribution

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import MultivariateGaussianDistribution
    >>> model = MultivariateGaussianDistribution([0.0, 0.0], [[1.0, 0.5], [0.5, 1.0]])
    >>> bool(np.isclose(model.log_density([0.0, 0.0]), -np.log(2 * np.pi) - 0.5 * np.log(0.75)))
    True
    """

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
        self._prec_chol, self._log_norm = kernel_constants(chol)

    @classmethod
    def _estimated(
        cls, mu: np.ndarray, covar: np.ndarray, prec_chol: np.ndarray, log_norm: float
    ) -> MultivariateGaussianDistribution:
        """An M-step's estimate: ``covar`` symmetric by construction and its kernel constants
        (:func:`kernel_constants`) from the Cholesky factor the M-step made, so no checks again."""
        dist = cls.__new__(cls)
        dist.mu, dist.covar, dist._prec_chol, dist._log_norm = mu, covar, prec_chol, log_norm
        return dist

    @property
    def precision_cholesky(self) -> np.ndarray:
        """``U = L⁻ᵀ`` (D, D), ``L`` the covariance's Cholesky factor: the precision is ``U Uᵀ``
        (scikit-learn's ``precisions_cholesky_`` of one component), kept for the log-density."""
        return self._prec_chol

    def __repr__(self) -> str:
        return f"MultivariateGaussianDistribution(mu={self.mu.tolist()}, covar={self.covar.tolist()})"

    @staticmethod
    def stacked_kernel(
        dists: Sequence[MultivariateGaussianDistribution], log_weights: np.ndarray | None = None
    ) -> FullKernel | BandedFullKernel:
        """The batched log-density kernel of several components of this family.

        Above D = 16 banded products (``mixle_nb.stats.full_covariance.BandedFullKernel``,
        which takes quadratic features made per block where those are faster), else quadratic
        features, stored or made per block (``mixle_nb.stats.frame.FullKernel``): the same
        model either way.

        Parameters
        ----------
        dists : sequence of MultivariateGaussianDistribution
            The components, K of them.
        log_weights : numpy.ndarray, optional
            ``(K,)`` log-weights added to each component's row (a mixture's joint).

        Returns
        -------
        FullKernel or BandedFullKernel
            ``enc -> (K, N)`` log-densities.
        """
        kernel = BandedFullKernel if full_covariance.applies(len(dists[0].mu)) else FullKernel
        return kernel(
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


class MultivariateGaussianEstimator(Estimator):
    """M-step for a full-covariance Gaussian.

    Parameters
    ----------
    dim : int, optional
        The dimension D (default: taken from the data).
    reg_covar : float, default 1e-6
        Added to the covariance's diagonal (scikit-learn's meaning; with ``covariance_key``,
        once to the pooled within-component covariance, scikit-learn's ``"tied"``).
    keys : str, optional
        Ties all statistics with every estimator of the same key.
    covariance_key : str, optional
        Ties only the covariance: components sharing one covariance, each with its own mean.
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
    MultivariateGaussianDistribution

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import MultivariateGaussianEstimator, seq_encode, seq_estimate
    >>> x = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 3.0]])
    >>> estimator = MultivariateGaussianEstimator(reg_covar=0.0)
    >>> model = seq_estimate(seq_encode(x, estimator=estimator), estimator, None)
    >>> model.mu.tolist()
    [1.0, 1.25]
    >>> bool(np.allclose(model.covar, np.cov(x.T, bias=True)))
    True
    """

    def __init__(
        self,
        dim: int | None = None,
        reg_covar: float = 1e-6,
        keys: str | None = None,
        covariance_key: str | None = None,
        dtype: Any = None,
    ):
        self.dim, self.reg_covar, self.keys, self.covariance_key = dim, check_reg_covar(reg_covar), keys, covariance_key
        self.dtype = encoding_dtype(dtype)

    def make_accumulator(self) -> CentredMoments:
        encoder = MultivariateGaussianEncoder(self.dim, self.dtype)
        return CentredMoments(self.dim, self.keys, encoder, self.covariance_key, full=True)

    def estimate(self, nobs: float | None, value: np.ndarray) -> MultivariateGaussianDistribution:
        if np.size(value) == 0:
            raise ValueError("MultivariateGaussianEstimator saw no data and has no dim; pass dim=D")
        mean, covar, chol = full_estimate(value, self.reg_covar)
        return MultivariateGaussianDistribution._estimated(mean, covar, *kernel_constants(chol))

    @staticmethod
    def stacked_estimate(
        estimators: Sequence[MultivariateGaussianEstimator], values: Sequence[np.ndarray]
    ) -> list[MultivariateGaussianDistribution] | None:
        """Every component's :meth:`estimate` at once (``centred_moments.stacked_estimate``);
        ``None`` when they differ in ``reg_covar`` or one is degenerate (each then estimates alone).

        Components that all share one ``covariance_key`` share one covariance: the first's,
        made, factored and inverted once, the same arrays in every component (their values are
        pooled, so the others' would equal it to rounding)."""
        first = estimators[0]
        if any(e.reg_covar != first.reg_covar for e in estimators):
            return None
        tied = first.covariance_key is not None and _one_covariance(estimators)
        found = stacked_estimate(values, first.reg_covar, full=True, tied=tied)
        if found is None:
            return None
        mean, covar, chol = found
        assert chol is not None
        if tied:
            prec_chol, log_norm = kernel_constants(chol[0])
            return [MultivariateGaussianDistribution._estimated(m, covar[0], prec_chol, log_norm) for m in mean]
        prec_chols, log_norms = kernel_constants(chol)
        return [
            MultivariateGaussianDistribution._estimated(*parts) for parts in zip(mean, covar, prec_chols, log_norms)
        ]

    def free_parameters(self, model: MultivariateGaussianDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # Estimator is not generic in its model: each family counts only its own
        if count.tied("all", self.keys):
            return 0
        dim = len(model.mu)
        return dim + (0 if count.tied("covariance", self.covariance_key) else dim * (dim + 1) // 2)


def _one_covariance(estimators: Sequence[MultivariateGaussianEstimator]) -> bool:
    """Whether every estimator ties its covariance under the first's key (and nothing else)."""
    first = estimators[0]
    return all(e.keys is None and e.covariance_key == first.covariance_key for e in estimators)

"""Poisson over non-negative integer counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import (
    ArrayAccumulator,
    Distribution,
    Encoder,
    Estimator,
    check_finite,
    device_tensor,
    float_tensor,
    resolve_device,
)
from .sampler import Sampler

if TYPE_CHECKING:
    from .parameters import ParameterCount


@dataclass(frozen=True)
class CountEncoding:
    """Counts as float64 and their ``log(x!)``, computed once per shard, on its device."""

    x: torch.Tensor
    log_factorial: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)

    @property
    def device(self) -> torch.device:
        return self.x.device

    def rows(self, start: int, stop: int) -> CountEncoding:
        return CountEncoding(self.x[start:stop], self.log_factorial[start:stop])


class PoissonEncoder(Encoder):
    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> CountEncoding:
        x = check_finite(np.asarray(data, dtype=np.float64), "Poisson")
        if x.ndim != 1:
            raise ValueError(f"Poisson expects a 1-D sequence of counts; got shape {x.shape}")
        if np.any(x < 0) or np.any(x != np.floor(x)):
            bad = int(np.flatnonzero((x < 0) | (x != np.floor(x)))[0])
            raise ValueError(f"Poisson counts must be non-negative integers; observation {bad} is {x[bad]!r}")
        counts = float_tensor(x).to(resolve_device(device))
        return CountEncoding(counts, torch.lgamma(counts + 1.0))


class PoissonDistribution(Distribution):
    """Poisson counts with rate ``lam``.

    Parameters
    ----------
    lam : float
        The rate, > 0.

    Raises
    ------
    ValueError
        A rate that is not finite or not > 0.

    See Also
    --------
    PoissonEstimator

    Examples
    --------
    >>> import math
    >>> from mixle_nb.stats import PoissonDistribution
    >>> model = PoissonDistribution(2.0)
    >>> math.isclose(model.log_density(3), 3 * math.log(2.0) - 2.0 - math.log(6))
    True
    """

    def __init__(self, lam: float):
        if not (np.isfinite(lam) and lam > 0):
            raise ValueError(f"Poisson rate lam must be finite and > 0; got {lam!r}")
        self.lam = float(lam)

    def __repr__(self) -> str:
        return f"PoissonDistribution(lam={self.lam!r})"

    def device_log_density(self, enc: CountEncoding) -> torch.Tensor:
        return enc.x * np.log(self.lam) - self.lam - enc.log_factorial

    def dist_to_encoder(self) -> Encoder:
        return PoissonEncoder()

    def estimator(self, **kwargs: Any) -> PoissonEstimator:
        return PoissonEstimator(**kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.poisson(self.lam, size=n)

    def sampler(self, seed: int | np.random.SeedSequence | None = None) -> Sampler:
        """A sampler drawing from this distribution.

        Parameters
        ----------
        seed : int or numpy.random.SeedSequence, optional
            The seed of its random source.

        Returns
        -------
        Sampler
            ``sample(n)`` draws ``n`` counts; ``sample()`` one.
        """
        return Sampler(self.draw, seed)


class PoissonAccumulator(ArrayAccumulator):
    """Weighted ``[n, Σx]``."""

    def __init__(self, keys: str | None):
        super().__init__(2, keys)

    def seq_update(
        self, enc: CountEncoding, weights: np.ndarray | torch.Tensor | None, model: PoissonDistribution | None
    ) -> None:
        if weights is None:
            self.stats += (len(enc), float(enc.x.sum()))
        else:
            w = device_tensor(weights, enc.device)
            self.stats += (float(w.sum()), float(w @ enc.x))

    def acc_to_encoder(self) -> Encoder:
        return PoissonEncoder()


class PoissonEstimator(Estimator):
    """M-step ``lam = Σx / n``, floored at ``min_lam`` so an all-zero shard stays finite.

    Parameters
    ----------
    min_lam : float, default 1e-10
        The smallest rate estimated.
    keys : str, optional
        Ties all statistics with every estimator of the same key.

    See Also
    --------
    PoissonDistribution

    Examples
    --------
    >>> from mixle_nb.stats import PoissonEstimator, seq_encode, seq_estimate
    >>> estimator = PoissonEstimator()
    >>> seq_estimate(seq_encode([1, 2, 3, 6], estimator=estimator), estimator, None)
    PoissonDistribution(lam=3.0)
    """

    def __init__(self, min_lam: float = 1e-10, keys: str | None = None):
        self.min_lam, self.keys = float(min_lam), keys

    def make_accumulator(self) -> PoissonAccumulator:
        return PoissonAccumulator(self.keys)

    def estimate(self, nobs: float | None, value: np.ndarray) -> PoissonDistribution:
        n, total = value
        return PoissonDistribution(max(total / n, self.min_lam) if n > 0 else 1.0)

    def free_parameters(self, model: Distribution, count: ParameterCount) -> int:
        return 0 if count.tied("all", self.keys) else 1

"""Categorical over arbitrary hashable, mutually comparable labels.

The labels themselves are Python objects and stay on the host; each observation's index into
them lives on the encoding's device, where log-densities are gathered and counts summed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import Accumulator, Distribution, Encoder, Estimator, device_tensor, resolve_device
from .sampler import Sampler

if TYPE_CHECKING:
    from .parameters import ParameterCount


@dataclass(frozen=True)
class LabelEncoding:
    """Distinct ``labels`` of a shard and each observation's ``index`` into them."""

    labels: np.ndarray
    index: torch.Tensor

    def __len__(self) -> int:
        return len(self.index)

    @property
    def device(self) -> torch.device:
        return self.index.device

    def rows(self, start: int, stop: int) -> LabelEncoding:
        return LabelEncoding(self.labels, self.index[start:stop])


def integer_labels(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of integers, by counting when their range is
    no wider than their number (several times faster than unique's sort)."""
    if values.size == 0 or int(values.max()) - int(values.min()) > max(values.size, 1 << 16):
        return np.unique(values, return_inverse=True)
    low = values.min()
    shifted = values - low
    present = np.flatnonzero(np.bincount(shifted))
    position = np.zeros(int(present[-1]) + 1, dtype=np.int64)
    position[present] = np.arange(len(present))
    return (present + low).astype(values.dtype), position[shifted]


class CategoricalEncoder(Encoder):
    def seq_encode(self, data: ArrayLike, device: torch.device | str | None = None) -> LabelEncoding:
        values = np.asarray(data)
        if values.ndim != 1:
            raise ValueError(f"Categorical expects a 1-D sequence of labels; got shape {values.shape}")
        if values.dtype.kind == "f" and np.any(np.isnan(values)):
            raise ValueError("Categorical labels contain NaN; drop or relabel those observations")
        try:
            labels, index = (
                integer_labels(values) if values.dtype.kind in "iu" else np.unique(values, return_inverse=True)
            )
        except TypeError:
            raise ValueError("Categorical labels must be mutually comparable (e.g. all str or all int)") from None
        return LabelEncoding(
            labels, torch.from_numpy(np.asarray(index.reshape(-1), dtype=np.int64)).to(resolve_device(device))
        )


class CategoricalDistribution(Distribution):
    """A distribution over labels: each label's probability.

    Parameters
    ----------
    pmap : dict
        Maps each label to its probability; the probabilities sum to 1.

    Raises
    ------
    ValueError
        Probabilities that are negative or do not sum to 1.

    See Also
    --------
    CategoricalEstimator

    Examples
    --------
    >>> import math
    >>> from mixle_nb.stats import CategoricalDistribution
    >>> model = CategoricalDistribution({"a": 0.25, "b": 0.75})
    >>> math.isclose(model.log_density("b"), math.log(0.75))
    True
    >>> len(model.sampler(seed=0).sample(5))
    5
    """

    def __init__(self, pmap: dict):
        if not pmap:
            raise ValueError("CategoricalDistribution needs at least one label in pmap")
        probs = np.array(list(pmap.values()), dtype=np.float64)
        if np.any(probs < 0) or not np.isclose(probs.sum(), 1.0, rtol=0, atol=1e-9):
            raise ValueError(f"pmap probabilities must be >= 0 and sum to 1; they sum to {probs.sum()!r}")
        self.pmap = dict(pmap)

    def __repr__(self) -> str:
        return f"CategoricalDistribution({self.pmap!r})"

    def device_log_density(self, enc: LabelEncoding) -> torch.Tensor:
        probs = np.array([self.pmap.get(label, 0.0) for label in enc.labels.tolist()], dtype=np.float64)
        with np.errstate(divide="ignore"):
            return torch.from_numpy(np.log(probs)).to(enc.device)[enc.index]

    def dist_to_encoder(self) -> Encoder:
        return CategoricalEncoder()

    def estimator(self, **kwargs: Any) -> CategoricalEstimator:
        return CategoricalEstimator(**kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        labels = np.array(list(self.pmap.keys()))
        return labels[rng.choice(len(labels), size=n, p=np.array(list(self.pmap.values())))]

    def sampler(self, seed: int | np.random.SeedSequence | None = None) -> Sampler:
        """A sampler drawing from this distribution.

        Parameters
        ----------
        seed : int or numpy.random.SeedSequence, optional
            The seed of its random source.

        Returns
        -------
        Sampler
            ``sample(n)`` draws ``n`` labels; ``sample()`` one.
        """
        return Sampler(self.draw, seed)


class CategoricalAccumulator(Accumulator):
    """Weighted count per label. The value is a dict, so the distributed fold gathers it."""

    def __init__(self, keys: str | None):
        self.counts: dict = {}
        self.keys = keys

    def seq_update(
        self, enc: LabelEncoding, weights: np.ndarray | torch.Tensor | None, model: CategoricalDistribution | None
    ) -> None:
        w = None if weights is None else device_tensor(weights, enc.device)
        sums = torch.bincount(enc.index, weights=w, minlength=len(enc.labels))
        self.combine(dict(zip(enc.labels.tolist(), sums.cpu().double().tolist())))

    def value(self) -> dict:
        return dict(self.counts)

    def from_value(self, value: dict) -> CategoricalAccumulator:
        self.counts = dict(value)
        return self

    def combine(self, value: dict) -> CategoricalAccumulator:
        for label, count in value.items():
            self.counts[label] = self.counts.get(label, 0.0) + count
        return self

    def acc_to_encoder(self) -> Encoder:
        return CategoricalEncoder()


class CategoricalEstimator(Estimator):
    """M-step ``p(label) ∝ count + pseudo_count``; with no weight at all, uniform over seen labels.

    Its statistics are a dict of counts, so the distributed fold gathers them.

    Parameters
    ----------
    pseudo_count : float, default 0.0
        Added to every label's count.
    keys : str, optional
        Ties all statistics with every estimator of the same key.

    See Also
    --------
    CategoricalDistribution

    Examples
    --------
    >>> from mixle_nb.stats import CategoricalEstimator, seq_encode, seq_estimate
    >>> estimator = CategoricalEstimator(pseudo_count=1.0)
    >>> seq_estimate(seq_encode(["a", "b", "b", "b"], estimator=estimator), estimator, None).pmap["b"]
    0.6666666666666666
    """

    def __init__(self, pseudo_count: float = 0.0, keys: str | None = None):
        self.pseudo_count, self.keys = float(pseudo_count), keys

    def make_accumulator(self) -> CategoricalAccumulator:
        return CategoricalAccumulator(self.keys)

    def estimate(self, nobs: float | None, value: dict) -> CategoricalDistribution:
        if not value:
            raise ValueError("CategoricalEstimator saw no labels; fit it on at least one observation")
        counts = np.array(list(value.values()), dtype=np.float64) + self.pseudo_count
        total = counts.sum()
        probs = counts / total if total > 0 else np.full(len(counts), 1.0 / len(counts))
        return CategoricalDistribution(dict(zip(value.keys(), probs.tolist())))

    def free_parameters(self, model: CategoricalDistribution, count: ParameterCount) -> int:  # type: ignore[override]  # Estimator is not generic in its model: each family counts only its own
        return 0 if count.tied("all", self.keys) else len(model.pmap) - 1

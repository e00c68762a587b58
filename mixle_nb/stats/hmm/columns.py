"""Independent columns: an observation is a row of ``C`` values, column ``j`` from its own
family (hmmlearn's multi-feature Poisson emissions: a Poisson per feature). Each column is
encoded, scored and summed by its family; the log-density is the sum over columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .. import foreign
from ..base import Accumulator, Distribution, Encoder, Estimator, resolve_device
from ..estimation import encode
from ..mixture import component_log_density
from ..sampler import Sampler


@dataclass(frozen=True, eq=False)
class ColumnsEncoding:
    """One encoding per column, of the same ``n`` rows."""

    parts: tuple
    n: int
    device: torch.device

    def __len__(self) -> int:
        return self.n


class ColumnsEncoder(Encoder):
    def __init__(self, encoders: Sequence):
        self.encoders = list(encoders)

    def seq_encode(self, data: ArrayLike, device: Any = None) -> ColumnsEncoding:
        x = np.asarray(data)
        if x.ndim != 2 or x.shape[1] != len(self.encoders):
            raise ValueError(f"expected an (N, {len(self.encoders)}) array of rows; got shape {x.shape}")
        device = resolve_device(device)
        return ColumnsEncoding(tuple(encode(e, x[:, j], device) for j, e in enumerate(self.encoders)), len(x), device)


class ColumnsDistribution(Distribution):
    """Column ``j`` of each row drawn from ``components[j]``, independently."""

    def __init__(self, components: Sequence[Any]):
        self.components: list[Any] = list(components)
        if not self.components:
            raise ValueError("ColumnsDistribution needs at least one column")

    def __repr__(self) -> str:
        return f"ColumnsDistribution({self.components!r})"

    def device_log_density(self, enc: ColumnsEncoding) -> torch.Tensor:
        total = component_log_density(self.components[0], enc.parts[0]).clone()
        for c, part in zip(self.components[1:], enc.parts[1:]):
            total.add_(component_log_density(c, part))
        return total

    def dist_to_encoder(self) -> ColumnsEncoder:
        return ColumnsEncoder([c.dist_to_encoder() for c in self.components])

    def estimator(self, **kwargs: Any) -> ColumnsEstimator:
        return ColumnsEstimator([c.estimator() for c in self.components], **kwargs)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.column_stack([foreign.draw(c, rng, n) for c in self.components])

    def sampler(self, seed: Any = None) -> Sampler:
        return Sampler(self.draw, seed)


class ColumnsAccumulator(Accumulator):
    def __init__(self, accumulators: list, keys: str | None = None):
        self.accumulators, self.keys = accumulators, keys

    def seq_update(
        self, enc: ColumnsEncoding, weights: np.ndarray | torch.Tensor | None, model: ColumnsDistribution | None
    ) -> None:
        models = model.components if model is not None else [None] * len(self.accumulators)
        for acc, part, m in zip(self.accumulators, enc.parts, models):
            acc.seq_update(part, weights, m)

    def seq_initialize(
        self, enc: ColumnsEncoding, weights: np.ndarray | torch.Tensor | None, rng: np.random.Generator
    ) -> None:
        for acc, part in zip(self.accumulators, enc.parts):
            acc.seq_initialize(part, weights, rng)

    def value(self) -> list:
        return [a.value() for a in self.accumulators]

    def from_value(self, value: Any) -> ColumnsAccumulator:
        for a, v in zip(self.accumulators, value):
            a.from_value(v)
        return self

    def combine(self, value: Any) -> ColumnsAccumulator:
        for a, v in zip(self.accumulators, value):
            a.combine(v)
        return self

    def key_merge(self, stats: dict) -> None:
        for a in self.accumulators:
            a.key_merge(stats)

    def key_replace(self, stats: dict) -> None:
        for a in self.accumulators:
            a.key_replace(stats)

    def acc_to_encoder(self) -> ColumnsEncoder:
        return ColumnsEncoder([a.acc_to_encoder() for a in self.accumulators])


class ColumnsEstimator(Estimator):
    """M-step column by column."""

    def __init__(self, estimators: Sequence[Estimator], keys: str | None = None):
        self.estimators, self.keys = list(estimators), keys

    def make_accumulator(self) -> ColumnsAccumulator:
        return ColumnsAccumulator([foreign.accumulator(e) for e in self.estimators], self.keys)

    def estimate(self, nobs: float | None, value: Any) -> ColumnsDistribution:
        return ColumnsDistribution([e.estimate(nobs, v) for e, v in zip(self.estimators, value)])

    def free_parameters(self, model: Distribution, count: Any) -> int:
        assert isinstance(model, ColumnsDistribution)
        return sum(count.of(e, c) for e, c in zip(self.estimators, model.components))

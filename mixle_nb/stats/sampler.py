"""``dist.sampler(seed).sample(n)``: one seeded random stream per sampler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class Sampler:
    """Draws from ``draw(rng, n)``; ``sample()`` with no ``n`` returns one observation."""

    def __init__(
        self, draw: Callable[[np.random.Generator, int], np.ndarray], seed: int | np.random.SeedSequence | None = None
    ):
        self._draw = draw
        self.rng = np.random.default_rng(seed)

    def sample(self, n: int | None = None) -> Any:
        if n is None:
            return self._draw(self.rng, 1)[0]
        if int(n) != n or n < 0:
            raise ValueError(f"sample size must be a non-negative integer; got {n!r}")
        return self._draw(self.rng, int(n))

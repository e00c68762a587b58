"""Another package's pysp family (mixle's) inside ours, behind one adapter.

Both speak the pysp protocol, with two differences the core must not have to know: our
accumulators take ``None`` for unit weights and responsibilities as tensors where they are,
mixle's take float64 numpy arrays; our distributions draw from a shared numpy ``Generator``
(``draw(rng, n)``), mixle's sample only through their own ``sampler(seed)``. :func:`accumulator`
and :func:`draw` are where the core meets either (and a ``ForeignAccumulator`` draws its
random start from the ``RandomState`` mixle's take); everything else (``value``, ``from_value``,
``combine``, the keys, ``estimate``) is the same protocol.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from .base import Accumulator, Distribution, Estimator, random_source


def accumulator(estimator: Estimator) -> Accumulator | ForeignAccumulator:
    """A fresh accumulator of ``estimator``, with our calling convention."""
    made = estimator.accumulator_factory().make()
    return made if isinstance(made, Accumulator) else ForeignAccumulator(made)


def mixle_class(name: str) -> type | None:
    """mixle's ``mixle.stats.<name>``, or ``None`` when mixle is not imported.

    An instance of one of mixle's classes exists only once mixle is imported, so this asks
    ``sys.modules`` and never imports mixle (an optional dependency) itself.

    Parameters
    ----------
    name : str
        A class name exported by ``mixle.stats`` (``"MixtureEstimator"``).

    Returns
    -------
    type or None
        The class, or ``None`` when ``mixle.stats`` is not imported in this process.
    """
    module = sys.modules.get("mixle.stats")
    found = getattr(module, name, None)
    return found if isinstance(found, type) else None


@runtime_checkable
class Drawing(Protocol):
    """A model that draws from a shared numpy ``Generator`` (ours)."""

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


class Sampling(Protocol):
    """A model that samples only through its own seeded sampler (mixle's)."""

    def sampler(self, seed: int) -> Any: ...


def draw(distribution: Drawing | Sampling, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` observations of ``distribution`` from ``rng``: ours draw from it; another package's
    sample from a sampler seeded from it."""
    if isinstance(distribution, Drawing):
        return distribution.draw(rng, n)
    sample = distribution.sampler(int(rng.integers(2**31 - 1))).sample(n)
    if isinstance(sample, np.ndarray):
        return sample
    out = np.empty(len(sample), dtype=object)  # one observation an entry (a tuple stays a tuple)
    for i, observation in enumerate(sample):
        out[i] = observation
    return out


def estimator(distribution: Distribution) -> Estimator:
    """The estimator of a fitted model of any pysp package: every family names its own
    (``estimator()``, which :class:`Distribution` itself does not declare)."""
    make = getattr(distribution, "estimator", None)
    if make is None:
        raise TypeError(f"{type(distribution).__name__} has no estimator(): not a pysp-family model")
    return make()


def rows(encoder: Any, enc: Any) -> int:
    """Observations in one encoding ``enc`` of ``encoder``: mixle's encoders count their own
    payloads with ``row_count`` (a hidden Markov encoding is a tuple of arrays, whose ``len``
    is no count); ours have no ``row_count`` and report ``len``."""
    counter = getattr(encoder, "row_count", None)
    return int(counter(enc)) if counter is not None else len(enc)


class ForeignAccumulator:
    """Another package's accumulator taking our weights: ``None`` (unit weights) or a tensor
    become the float64 numpy array it requires. Every other attribute is the wrapped one's
    (not an :class:`Accumulator`, whose defaults would hide them)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self._encoder = None

    def seq_update(self, enc: Any, weights: Any | None, model: Any) -> Any:
        return self.inner.seq_update(enc, self._numpy_weights(enc, weights), model)

    def seq_initialize(self, enc: Any, weights: Any | None, rng: Any) -> None:
        """mixle's initialisers draw with ``RandomState.randint``: a ``Generator`` seeds one."""
        legacy = random_source(rng, np.random.RandomState)
        self.inner.seq_initialize(enc, self._numpy_weights(enc, weights), legacy)

    def _numpy_weights(self, enc: Any, weights: Any | None) -> np.ndarray:
        if weights is None:
            return np.ones(self._rows(enc))
        if isinstance(weights, torch.Tensor):
            return weights.cpu().numpy()
        return np.asarray(weights, dtype=np.float64)

    def _rows(self, enc: Any) -> int:
        if self._encoder is None:
            self._encoder = self.inner.acc_to_encoder()
        return rows(self._encoder, enc)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

"""The pysp-style protocol shared by every family: Distribution, Estimator, Accumulator.

Values returned by ``Accumulator.value()`` are sums, so combining per-chunk or per-rank
values in any order equals one pass over all the data. Numeric values are flat float64
arrays (the distributed fold can add them as one tensor); anything else is folded by gather.

Devices: an encoding's tensors live on the device it was encoded for (``seq_encode(data,
device=)``), and every kernel that reads it runs there; what leaves the device is small (a
value's sums, a log-density total) or asked for (``seq_log_density``, which returns numpy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..validation import device as checked_device

CPU = torch.device("cpu")


RandomSource = TypeVar("RandomSource", np.random.Generator, np.random.RandomState)


@overload
def random_source(rng: Any) -> np.random.Generator: ...


@overload
def random_source(rng: Any, kind: type[RandomSource]) -> RandomSource: ...


def random_source(rng: Any, kind: type = np.random.Generator) -> Any:
    """The one normaliser of random sources: ``rng`` as a numpy ``Generator`` (ours draw from
    one) or, with ``kind=np.random.RandomState``, as the legacy ``RandomState`` mixle's
    accumulators and per-rank seeds draw from (``randint``).

    A source of the asked kind is returned as it is; one of the other kind seeds a new one
    from a single draw (so a given source always gives the same stream); a seed or ``None``
    starts a new one.

    Parameters
    ----------
    rng : None, int, numpy.random.Generator or numpy.random.RandomState
        The random source or seed.
    kind : type, default numpy.random.Generator
        ``numpy.random.Generator`` or ``numpy.random.RandomState``.

    Returns
    -------
    numpy.random.Generator or numpy.random.RandomState
        A source of ``kind``.

    Raises
    ------
    TypeError
        If ``rng`` is none of the above.
    """
    if isinstance(rng, kind):
        return rng
    if isinstance(rng, np.random.RandomState):  # a Generator asked for
        return np.random.default_rng(rng.randint(0, 2**31 - 1))
    if isinstance(rng, np.random.Generator):  # a RandomState asked for
        return np.random.RandomState(int(rng.integers(2**31 - 1)))
    if rng is None or isinstance(rng, (int, np.integer)):
        return kind(rng) if kind is np.random.RandomState else np.random.default_rng(rng)
    raise TypeError(f"rng must be a seed, numpy Generator or RandomState; got {type(rng).__name__}")


def check_finite(x: np.ndarray, what: str) -> np.ndarray:
    """Reject NaN/inf. Empty input is allowed here: a rank's shard may be empty."""
    if not np.all(np.isfinite(x)):
        bad = int(np.flatnonzero(~np.isfinite(x).reshape(len(x), -1).all(axis=1))[0])
        raise ValueError(f"{what}: observation {bad} is NaN or infinite; drop or impute it first")
    return x


def float_tensor(values: ArrayLike) -> torch.Tensor:
    """``values`` as a float64 tensor, sharing memory where torch allows: torch has no
    read-only tensors, so a read-only array is copied."""
    array = np.asarray(values, dtype=np.float64)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def device_tensor(values: ArrayLike | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Weights or data (an array or a tensor) as a float64 tensor on ``device``; no copy when
    they are there already."""
    if isinstance(values, torch.Tensor):
        return values.to(device=device, dtype=torch.float64)
    return float_tensor(values).to(device)


def encoding_device(enc: Any) -> torch.device:
    """Where an encoding's tensors live: ours say so, anything else (mixle's) is on the CPU."""
    return getattr(enc, "device", CPU)


def resolve_device(device: Any) -> torch.device:
    """An encoder's ``device=`` argument, checked; ``None`` is the CPU."""
    return checked_device("device", device) or CPU


def resident(values: torch.Tensor) -> np.ndarray | torch.Tensor:
    """Per-observation results where they live: numpy on the CPU (a view, no copy), the tensor
    itself on another device, where copying it to the host every step would cost more than
    the step; callers that need only its sum take :func:`total`."""
    return values.numpy() if values.device.type == "cpu" else values


def total(values: np.ndarray | torch.Tensor) -> float:
    """The sum of per-observation results, an array or a tensor on any device."""
    return float(values.sum()) if isinstance(values, torch.Tensor) else float(np.sum(values))


class AccumulatorFactory:
    """``estimator.accumulator_factory().make()`` builds a fresh, empty accumulator."""

    def __init__(self, make: Callable[[], Accumulator]):
        self.make = make


class Distribution:
    """A fitted model: densities, sampling, and how to encode data for it. A family implements
    ``device_log_density``; ``seq_log_density`` is its result copied to the host."""

    def device_log_density(self, enc: Any) -> torch.Tensor:
        """``(N,)`` float64 log-densities on the encoding's device."""
        raise NotImplementedError

    def seq_log_density(self, enc: Any) -> np.ndarray:
        return self.device_log_density(enc).cpu().numpy()

    def dist_to_encoder(self) -> Encoder:
        raise NotImplementedError

    def estimator(self, **kwargs: Any) -> Estimator:
        """An estimator of this family (``kwargs``: the family's options, such as ``keys``)."""
        raise NotImplementedError

    def log_density(self, x: Any) -> float:
        return float(self.seq_log_density(self.dist_to_encoder().seq_encode([x]))[0])

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` observations drawn from ``rng`` (``sampler(seed).sample(n)`` and a mixture's
        sampling call it)."""
        raise NotImplementedError


class Encoder:
    """Turns raw observations into the resident arrays the ``seq_*`` kernels read, on
    ``device`` (a ``torch.device`` or its name; ``None``: the CPU)."""

    def seq_encode(self, data: Any, device: Any = None) -> Any:
        raise NotImplementedError


class Estimator:
    """Builds accumulators and runs the M-step. ``keys`` ties statistics across estimators."""

    keys: str | None = None

    def accumulator_factory(self) -> AccumulatorFactory:
        return AccumulatorFactory(self.make_accumulator)

    def make_accumulator(self) -> Accumulator:
        raise NotImplementedError

    def estimate(self, nobs: float | None, value: Any) -> Distribution:
        raise NotImplementedError

    def free_parameters(self, model: Distribution, count: Any) -> int:
        """How many free parameters ``model`` has as this estimator fits it, each tied
        statistic counted once (``count``, a ``parameters.ParameterCount``: ``count.tied``;
        a mixture counts its components with ``count.of``)."""
        raise TypeError(
            f"no free-parameter count for {type(self).__name__}: pass n_parameters= to bic()/aic() yourself"
        )


class Accumulator:
    """Sufficient statistics. Subclasses implement the ``seq_*`` kernels and the value codec.

    ``seq_update`` may return the per-observation log-density of ``model`` when it computes it
    anyway (a mixture does, in its E-step; see :func:`resident`); otherwise it returns ``None``.
    ``weights`` may be ``None`` (every observation weighs 1), a float64 array or a tensor.
    """

    keys: str | None = None

    def seq_update(self, enc: Any, weights: np.ndarray | None, model: Any) -> Any:
        raise NotImplementedError

    def seq_initialize(self, enc: Any, weights: np.ndarray | None, rng: np.random.Generator) -> None:
        self.seq_update(enc, weights, None)

    def acc_to_encoder(self) -> Encoder:
        raise NotImplementedError

    def value(self) -> Any:
        raise NotImplementedError

    def from_value(self, value: Any) -> Accumulator:
        raise NotImplementedError

    def combine(self, value: Any) -> Accumulator:
        raise NotImplementedError

    def update(self, x: Any, weight: float, estimate: Any) -> None:
        self.seq_update(self.acc_to_encoder().seq_encode([x]), np.array([float(weight)]), estimate)

    def initialize(self, x: Any, weight: float, rng: Any) -> None:
        enc = self.acc_to_encoder().seq_encode([x])
        self.seq_initialize(enc, np.array([float(weight)]), random_source(rng))

    def key_merge(self, stats: dict) -> None:
        """Add this accumulator's statistics into ``stats[keys]`` (first one in is the sum)."""
        if self.keys is not None:
            if self.keys in stats:
                stats[self.keys].combine(self.value())
            else:
                stats[self.keys] = self

    def key_replace(self, stats: dict) -> None:
        """Overwrite this accumulator with the merged statistics of its key."""
        if self.keys is not None:
            self.from_value(stats[self.keys].value())


def merge_into(stats: dict, key: str, value: np.ndarray) -> None:
    """Add the flat array ``value`` into ``stats[key]`` (the first one in starts the sum)."""
    if key in stats:
        stats[key].combine(value)
    else:
        stats[key] = ArrayAccumulator(len(value), None).from_value(value)


class ArrayAccumulator(Accumulator):
    """An accumulator whose whole value is one flat float64 array of sums."""

    def __init__(self, size: int, keys: str | None):
        self.stats = np.zeros(size)
        self.keys = keys

    def value(self) -> np.ndarray:
        return self.stats.copy()

    def from_value(self, value: np.ndarray) -> ArrayAccumulator:
        self.stats = np.array(value, dtype=np.float64)
        return self

    def combine(self, value: np.ndarray) -> ArrayAccumulator:
        """Add ``value``; an accumulator made without a size (no ``dim``) takes value's."""
        value = np.asarray(value, dtype=np.float64)
        if self.stats.size == 0:
            self.stats = value.copy()
        else:
            self.stats += value
        return self

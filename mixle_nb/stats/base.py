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
    """The sum of per-observation results, an array or a tensor on any device, in float64 (a
    float32 E-step's results too)."""
    if isinstance(values, torch.Tensor):
        return float(values.sum(dtype=torch.float64))
    return float(np.sum(values, dtype=np.float64))


class AccumulatorFactory:
    """``estimator.accumulator_factory().make()`` builds a fresh, empty accumulator."""

    def __init__(self, make: Callable[[], Accumulator]):
        self.make = make


class Distribution:
    """A fitted model: densities, sampling, and how to encode data for it.

    The base of every family of this package (mixle's models follow the same protocol, duck
    typed). A family implements :meth:`device_log_density`; :meth:`seq_log_density` is its result
    copied to the host.

    See Also
    --------
    Estimator : Fits a distribution.
    Encoder : Encodes data for it.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import Distribution, GaussianDistribution
    >>> model = GaussianDistribution(0.0, 1.0)
    >>> isinstance(model, Distribution)
    True
    >>> enc = model.dist_to_encoder().seq_encode(np.array([0.0, 1.0]))
    >>> model.seq_log_density(enc).round(4)
    array([-0.9189, -1.4189])
    >>> round(model.log_density(0.0), 4)
    -0.9189
    """

    def device_log_density(self, enc: Any) -> torch.Tensor:
        """The log-density of each encoded observation, on the encoding's device.

        Parameters
        ----------
        enc : encoding
            Data encoded by :meth:`dist_to_encoder` (or the estimator's encoder).

        Returns
        -------
        torch.Tensor
            ``(N,)`` float64 log-densities, where the encoding lives.
        """
        raise NotImplementedError

    def seq_log_density(self, enc: Any) -> np.ndarray:
        """The log-density of each encoded observation, on the host.

        Parameters
        ----------
        enc : encoding
            Data encoded by :meth:`dist_to_encoder` (or the estimator's encoder).

        Returns
        -------
        numpy.ndarray
            ``(N,)`` float64 log-densities.
        """
        return self.device_log_density(enc).cpu().numpy()

    def dist_to_encoder(self) -> Encoder:
        """The encoder of this family's data.

        Returns
        -------
        Encoder
            What turns raw observations into the encoding the ``seq_*`` kernels read.
        """
        raise NotImplementedError

    def estimator(self, **kwargs: Any) -> Estimator:
        """An estimator of this family.

        Parameters
        ----------
        **kwargs
            The family's options, such as ``keys``.

        Returns
        -------
        Estimator
            An estimator that fits models like this one.
        """
        raise NotImplementedError

    def log_density(self, x: Any) -> float:
        """The log-density of one observation.

        Parameters
        ----------
        x : object
            One observation of this family.

        Returns
        -------
        float
            Its log-density.
        """
        return float(self.seq_log_density(self.dist_to_encoder().seq_encode([x]))[0])

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` observations from ``rng``.

        ``sampler(seed).sample(n)`` and a mixture's sampling call it.

        Parameters
        ----------
        rng : numpy.random.Generator
            The random source.
        n : int
            How many observations.

        Returns
        -------
        numpy.ndarray
            The observations, one per row.
        """
        raise NotImplementedError


class Encoder:
    """Turns raw observations into the resident arrays the ``seq_*`` kernels read.

    An encoding is opaque: a picklable bundle built once per shard, on ``device``.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import Encoder, GaussianEstimator
    >>> encoder = GaussianEstimator().accumulator_factory().make().acc_to_encoder()
    >>> isinstance(encoder, Encoder)
    True
    >>> enc = encoder.seq_encode(np.array([1.0, 2.0, 3.0]))
    """

    def seq_encode(self, data: Any, device: Any = None) -> Any:
        """Encode a sequence of observations once, for every pass that follows.

        Parameters
        ----------
        data : sequence
            The raw observations.
        device : str or torch.device, optional
            Where the encoding's tensors live (``None``: the CPU).

        Returns
        -------
        encoding
            The opaque encoded data.

        Raises
        ------
        ValueError
            Observations this family cannot encode (NaN, infinite, of the wrong dimension).
        """
        raise NotImplementedError


class Estimator:
    """Builds accumulators and runs the M-step.

    ``keys`` ties all of an estimator's statistics to those of every other estimator with the
    same key, so tied components get identical estimates.

    See Also
    --------
    Accumulator : The statistics an estimator's M-step reads.

    Examples
    --------
    The protocol by hand: accumulate weighted statistics, then estimate.

    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator
    >>> estimator = GaussianEstimator(reg_covar=0.0)
    >>> acc = estimator.accumulator_factory().make()
    >>> enc = acc.acc_to_encoder().seq_encode(np.array([1.0, 2.0, 3.0]))
    >>> acc.seq_update(enc, np.ones(3), None)
    >>> model = estimator.estimate(3.0, acc.value())
    >>> model.mu, round(model.sigma2, 4)
    (2.0, 0.6667)
    """

    keys: str | None = None

    def accumulator_factory(self) -> AccumulatorFactory:
        """The factory of this estimator's accumulators.

        Returns
        -------
        AccumulatorFactory
            ``accumulator_factory().make()`` builds a fresh, empty accumulator.
        """
        return AccumulatorFactory(self.make_accumulator)

    def make_accumulator(self) -> Accumulator:
        """A fresh, empty accumulator of this estimator's statistics.

        Returns
        -------
        Accumulator
            An accumulator holding no observation.
        """
        raise NotImplementedError

    def estimate(self, nobs: float | None, value: Any) -> Distribution:
        """The M-step: the model of the accumulated statistics.

        Parameters
        ----------
        nobs : float or None
            The (weighted) number of observations.
        value : object
            An accumulator's :meth:`~mixle_nb.stats.Accumulator.value`, combined over every shard and key-tied.

        Returns
        -------
        Distribution
            The estimated model.
        """
        raise NotImplementedError

    def free_parameters(self, model: Distribution, count: Any) -> int:
        """How many free parameters ``model`` has as this estimator fits it.

        Each tied statistic is counted once.

        Parameters
        ----------
        model : Distribution
            A fitted model of this family.
        count : ParameterCount
            The count in progress (``count.tied`` says whether a key was counted already; a mixture
            counts its components with ``count.of``).

        Returns
        -------
        int
            The number of free parameters.

        Raises
        ------
        TypeError
            The family has no count (pass ``n_parameters=`` to :func:`~mixle_nb.inference.bic`).
        """
        raise TypeError(
            f"no free-parameter count for {type(self).__name__}: pass n_parameters= to bic()/aic() yourself"
        )


class Accumulator:
    """Sufficient statistics of one estimator: the ``seq_*`` kernels and the value codec.

    Values returned by :meth:`value` are sums, so combining per-chunk or per-rank values in any
    order equals one pass over all the data. :meth:`seq_update` may return the per-observation
    log-density of ``model`` when it computes it anyway (a mixture does, in its E-step);
    otherwise it returns ``None``. ``weights`` may be ``None`` (every observation weighs 1), a
    float64 array or a tensor.

    See Also
    --------
    Estimator : Builds accumulators and estimates from their values.

    Examples
    --------
    Two shards' statistics combined equal one pass over both:

    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator
    >>> estimator = GaussianEstimator()
    >>> left, right, both = (estimator.accumulator_factory().make() for _ in range(3))
    >>> encode = left.acc_to_encoder().seq_encode
    >>> left.seq_update(encode(np.array([1.0, 2.0])), None, None)
    >>> right.seq_update(encode(np.array([3.0])), None, None)
    >>> both.seq_update(encode(np.array([1.0, 2.0, 3.0])), None, None)
    >>> bool(np.allclose(left.combine(right.value()).value(), both.value()))
    True
    """

    keys: str | None = None

    def seq_update(self, enc: Any, weights: np.ndarray | None, model: Any) -> Any:
        """Add the weighted statistics of encoded observations (the E-step's work).

        Parameters
        ----------
        enc : encoding
            The encoded observations.
        weights : numpy.ndarray or torch.Tensor or None
            One weight per observation (``None``: every observation weighs 1).
        model : Distribution or None
            The model the E-step runs under (a mixture's responsibilities come from it).

        Returns
        -------
        numpy.ndarray or torch.Tensor or None
            The per-observation log-density of ``model`` when the update computes it anyway, else
            ``None``.
        """
        raise NotImplementedError

    def seq_initialize(self, enc: Any, weights: np.ndarray | None, rng: np.random.Generator) -> None:
        """Add the statistics of a random start from encoded observations.

        Parameters
        ----------
        enc : encoding
            The encoded observations.
        weights : numpy.ndarray or None
            One weight per observation (``None``: every observation weighs 1).
        rng : numpy.random.Generator
            The random source (a mixture draws random responsibilities from it).
        """
        self.seq_update(enc, weights, None)

    def acc_to_encoder(self) -> Encoder:
        """The encoder of the data this accumulator reads.

        Returns
        -------
        Encoder
            The family's encoder.
        """
        raise NotImplementedError

    def value(self) -> Any:
        """The statistics, as sums.

        Returns
        -------
        object
            A flat float64 array for numeric families (the distributed fold adds them as one
            tensor), or another picklable value (folded by gather).
        """
        raise NotImplementedError

    def from_value(self, value: Any) -> Accumulator:
        """Replace the statistics with ``value``.

        Parameters
        ----------
        value : object
            A :meth:`value` of an accumulator of the same estimator.

        Returns
        -------
        Accumulator
            This accumulator.
        """
        raise NotImplementedError

    def combine(self, value: Any) -> Accumulator:
        """Add ``value`` to the statistics.

        Parameters
        ----------
        value : object
            A :meth:`value` of an accumulator of the same estimator.

        Returns
        -------
        Accumulator
            This accumulator.
        """
        raise NotImplementedError

    def update(self, x: Any, weight: float, estimate: Any) -> None:
        """Add the statistics of one observation.

        Parameters
        ----------
        x : object
            One observation.
        weight : float
            Its weight.
        estimate : Distribution or None
            The model the E-step runs under.
        """
        self.seq_update(self.acc_to_encoder().seq_encode([x]), np.array([float(weight)]), estimate)

    def initialize(self, x: Any, weight: float, rng: Any) -> None:
        """Add the statistics of one observation for a random start.

        Parameters
        ----------
        x : object
            One observation.
        weight : float
            Its weight.
        rng : None, int, numpy.random.Generator or numpy.random.RandomState
            The random source.
        """
        enc = self.acc_to_encoder().seq_encode([x])
        self.seq_initialize(enc, np.array([float(weight)]), random_source(rng))

    def key_merge(self, stats: dict) -> None:
        """Add this accumulator's statistics into ``stats[keys]``; the first one in is the sum.

        Nothing happens without ``keys``.

        Parameters
        ----------
        stats : dict
            Key -> the accumulator holding that key's merged statistics.
        """
        if self.keys is not None:
            if self.keys in stats:
                stats[self.keys].combine(self.value())
            else:
                stats[self.keys] = self

    def key_replace(self, stats: dict) -> None:
        """Overwrite this accumulator with the merged statistics of its key.

        Nothing happens without ``keys``.

        Parameters
        ----------
        stats : dict
            Key -> the accumulator holding that key's merged statistics (after :meth:`key_merge`).
        """
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

"""Dispatch: each function takes locally encoded data or a handle with the matching
``pysp_*`` method (recognised by the method, never by type)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard, cast

import numpy as np
import torch

from . import foreign
from .base import Accumulator, Distribution, Estimator, random_source, total
from .diagonal_step import diagonal_em_step
from .frame import PointEncoding
from .full_step import full_em_step
from .fused_step import fused_em_step
from .handle import EncodedDataHandle
from .tied_step import tied_em_step


@dataclass
class Accumulated:
    """Statistics of some data for the next model, and the log-density of the current one."""

    count: float
    accumulator: AnyAccumulator
    log_density: float  # NaN when no model was given


@dataclass
class EMStep:
    """One EM step: the one record of it end to end.

    The same record serves :func:`em_step`, :func:`~mixle_nb.inference.fit`'s history, a rank's
    step, a panel's history and checkpoints. Beyond the model, its log-density and count, the
    fields are filled by whoever knows them.

    Parameters
    ----------
    model : Distribution
        The new model.
    count : float
        The observations the step ran over.
    log_density : float
        The log-density of the data under the model the step started from (a by-product of the
        same E-step pass).
    step : int, default 0
        The step's number, 1-based, in its start or panel.
    gain : float, default nan
        The gain in log-density per observation over the previous step.
    start : int, default 0
        Which of :func:`~mixle_nb.inference.fit`'s starts it belongs to.
    rank_seconds : list of float, optional
        E-step seconds per rank (this rank's alone until the client gathers them).
    step_s : float, default nan
        This rank's whole step, in seconds.
    recovery : RecoveryEvent, optional
        The elastic recovery the step was taken again after.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, em_step, seq_encode
    >>> enc = seq_encode(np.array([1.0, 2.0, 3.0]), estimator=GaussianEstimator())
    >>> step = em_step(enc, GaussianEstimator(), GaussianDistribution(0.0, 1.0))
    >>> step.count, step.model.mu
    (3.0, 2.0)
    >>> bool(np.isclose(step.log_density, -1.5 * np.log(2 * np.pi) - 7.0))
    True
    """

    model: Distribution
    count: float
    log_density: float
    step: int = 0
    gain: float = float("nan")
    start: int = 0
    rank_seconds: list = field(default_factory=list)
    step_s: float = float("nan")
    recovery: Any = None

    # pickled as its values alone, without the field names: the ranks send every step's record
    def __getstate__(self) -> tuple:
        return tuple(getattr(self, name) for name in EM_STEP_FIELDS)

    def __setstate__(self, values: tuple) -> None:
        self.__dict__.update(zip(EM_STEP_FIELDS, values))


EM_STEP_FIELDS = tuple(f.name for f in fields(EMStep))
AnyAccumulator = Accumulator | foreign.ForeignAccumulator  # ours, or another package's wrapped


def is_handle(data: object) -> TypeGuard[EncodedDataHandle]:
    """Whether ``data`` is an encoded-data handle rather than local data or an encoding.

    The one test every driver uses: a handle is recognised by a ``pysp_*`` method of the
    :class:`~mixle_nb.parallel.EncodedDataHandle` protocol, never by its type, so mixle's
    handles and ours are both handles.

    Parameters
    ----------
    data : object
        Raw observations, a local encoding, or a handle.

    Returns
    -------
    bool
        True when ``data`` answers ``pysp_seq_log_density_sum`` (every handle does).
    """
    return hasattr(data, "pysp_seq_log_density_sum")


def seq_encode(
    data: Any, model: Distribution | None = None, estimator: Estimator | None = None, device: Any = None
) -> Any:
    """Encode ``data`` once for repeated ``seq_*`` calls.

    Parameters
    ----------
    data : sequence
        The observations.
    model, estimator : optional
        Whose encoder to use (``model``'s if given, else ``estimator``'s).
    device : str or torch.device, optional
        Where the encoding lives (``None``: the CPU).

    Returns
    -------
    object
        The encoding (opaque: count its observations with ``encoded_count``).

    Raises
    ------
    ValueError
        If neither ``model`` nor ``estimator`` is given, or ``data`` is empty.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, seq_encode, seq_log_density_sum, GaussianDistribution
    >>> enc = seq_encode(np.array([0.0, 1.0]), estimator=GaussianEstimator())
    >>> count, total = seq_log_density_sum(enc, GaussianDistribution(0.0, 1.0))
    >>> count
    2.0
    """
    if model is not None:
        encoder = model.dist_to_encoder()
    elif estimator is not None:
        encoder = estimator.accumulator_factory().make().acc_to_encoder()
    else:
        raise ValueError("seq_encode needs model= or estimator= to choose an encoder")
    if len(data) == 0:
        raise ValueError("no observations: pass at least one data point")
    return encode(encoder, data, device)


def takes_device(encoder: Any) -> bool:
    """Whether ``encoder.seq_encode`` takes ``device=`` (ours do; mixle's encode on the CPU)."""
    try:
        return "device" in inspect.signature(encoder.seq_encode).parameters
    except (TypeError, ValueError):  # a builtin or extension method without a signature
        return False


def encode(encoder: Any, data: Any, device: Any = None) -> Any:
    """``encoder.seq_encode(data)``, the encoding on ``device``. An encoder without ``device=``
    (mixle's) encodes on the CPU: ``None`` and ``"cpu"`` work with it, another device is an error."""
    if device is None:
        return encoder.seq_encode(data)
    if takes_device(encoder):
        return encoder.seq_encode(data, device=device)
    if str(device) == "cpu":
        return encoder.seq_encode(data)
    raise ValueError(
        f"{type(encoder).__module__}.{type(encoder).__name__} encodes on the CPU only (its "
        f"seq_encode takes no device=), so device={str(device)!r} cannot be honoured: pass "
        "device=None or 'cpu'"
    )


def encoded_count(enc: Any, estimator: Estimator | None = None) -> int:
    """Observations in one local encoding.

    Parameters
    ----------
    enc : object
        A local encoding.
    estimator : Estimator, optional
        Whose encoder made it (its ``row_count`` counts mixle's; see :func:`foreign.rows`);
        without it, ``len(enc)``.

    Returns
    -------
    int
        The observation count.
    """
    if estimator is None:
        return len(enc)
    return foreign.rows(estimator.accumulator_factory().make().acc_to_encoder(), enc)


def accumulate(
    chunks: Sequence[Any],
    estimator: Estimator,
    model: Distribution | None = None,
    counts: Sequence[int] | None = None,
    with_log_density: bool = True,
) -> Accumulated:
    """The E-step over encoded chunks into one accumulator, and the log-density of ``model``.

    Unit weights are ``None``, so no array of ones is built or sent to the encoding's device
    every step (another package's accumulator gets the array it requires). A chunk whose rows
    carry sample weights (``stats.frame.with_weights``) counts their sum, and its
    log-density is their weighted sum.

    Parameters
    ----------
    chunks : sequence of encoding
        Local encoded chunks.
    estimator : Estimator
        The family's estimator (ours or mixle's).
    model : Distribution, optional
        The model the E-step runs under (``None``: a plain sum of statistics).
    counts : sequence of int, optional
        The chunks' observation counts (a handle knows them from the raw data); default: each
        chunk counted with its encoder.
    with_log_density : bool, default True
        ``False`` sums the log-density only where ``seq_update`` returns it for free (a family
        whose update does not, as mixle's, would pay a second pass).

    Returns
    -------
    Accumulated
        ``count``, the ``accumulator`` (not yet key-tied) and ``log_density`` (NaN without a
        model).

    See Also
    --------
    m_step : The M-step on the result.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, accumulate, m_step, seq_encode
    >>> estimator = GaussianEstimator()
    >>> chunks = [seq_encode(np.array(part), estimator=estimator) for part in ([1.0, 2.0], [3.0])]
    >>> acc = accumulate(chunks, estimator)
    >>> acc.count, m_step(estimator, acc.count, acc.accumulator).mu
    (3.0, 2.0)
    """
    acc = foreign.accumulator(estimator)
    if counts is None:  # counted by this accumulator's encoder (encoded_count would make another)
        encoder = acc.acc_to_encoder()
        counts = [foreign.rows(encoder, enc) for enc in chunks]
    counted: list[float] = []
    summed = 0.0
    for enc, n in zip(chunks, counts):
        weights = sample_weights(enc)
        counted.append(float(n) if weights is None else total(weights))
        log_density = acc.seq_update(enc, cast(Any, weights), model)  # ours take weights on the encoding's device
        if model is not None:
            if log_density is None and with_log_density:
                summed += log_density_total(model, enc)
            elif log_density is not None and weights is not None:
                kept = weights > 0  # a row of weight 0 adds nothing, even where impossible (-inf)
                summed += total(weights[kept] * torch.as_tensor(log_density, device=weights.device)[kept])
            else:
                summed += total(log_density) if log_density is not None else float("nan")
    return Accumulated(float(sum(counted)), acc, summed if model is not None else float("nan"))


def sample_weights(enc: Any) -> torch.Tensor | None:
    """The sample weights ``enc``'s rows carry (``None``: every row weighs 1)."""
    return enc.weights if isinstance(enc, PointEncoding) else None


def log_density_total(model: Distribution, enc: Any) -> float:
    """The summed log-density of one encoding, summed where it lives (only the total leaves a device)."""
    if hasattr(model, "device_log_density"):
        return total(model.device_log_density(enc))
    return total(model.seq_log_density(enc))


def tie_keys(acc: AnyAccumulator) -> AnyAccumulator:
    """Merge then replace keyed statistics once, on fully combined statistics.

    Parameters
    ----------
    acc : Accumulator or foreign.ForeignAccumulator
        The folded accumulator (changed in place).

    Returns
    -------
    Accumulator or foreign.ForeignAccumulator
        ``acc``, its tied statistics merged.

    Examples
    --------
    Two components tied by ``keys`` get the statistics of both:

    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator, tie_keys
    >>> from mixle_nb.stats import GaussianDistribution, MixtureDistribution, accumulate, seq_encode
    >>> estimator = MixtureEstimator([GaussianEstimator(keys="shared")] * 2)
    >>> model = MixtureDistribution([GaussianDistribution(-1.0, 1.0), GaussianDistribution(1.0, 1.0)], [0.5, 0.5])
    >>> acc = accumulate([seq_encode(np.array([-1.0, 1.0]), estimator=estimator)], estimator, model).accumulator
    >>> fitted = estimator.estimate(2.0, tie_keys(acc).value())
    >>> fitted.components[0].mu == fitted.components[1].mu == 0.0
    True
    """
    stats: dict = {}
    acc.key_merge(stats)
    acc.key_replace(stats)
    return acc


def m_step(estimator: Estimator, count: float, acc: AnyAccumulator) -> Distribution:
    """Key-tie the folded statistics and estimate the new model.

    Parameters
    ----------
    estimator : Estimator
        The family's estimator.
    count : float
        The observations the statistics cover.
    acc : Accumulator or foreign.ForeignAccumulator
        The folded statistics.

    Returns
    -------
    Distribution
        The new model.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, accumulate, m_step, seq_encode
    >>> estimator = GaussianEstimator()
    >>> acc = accumulate([seq_encode(np.array([1.0, 3.0]), estimator=estimator)], estimator)
    >>> m_step(estimator, acc.count, acc.accumulator).mu
    2.0
    """
    return estimator.estimate(count, tie_keys(acc).value())


# Local Gaussian mixtures' own steps, the first that applies taken: wide diagonal ones as matrix
# products, wide full covariances of few rows component by component, small ones in one compiled
# pass, a shared full covariance whitened once.
LOCAL_STEPS = (diagonal_em_step, full_em_step, fused_em_step, tied_em_step)


def em_step(enc: Any, estimator: Estimator, model: Distribution) -> EMStep:
    """One EM iteration on local data or a handle, reporting the objective of ``model``.

    Parameters
    ----------
    enc : encoding or EncodedDataHandle
        Local encoded data or any handle (its ``pysp_em_step`` first, if it has one).
    estimator : Estimator
        The family's estimator.
    model : Distribution
        The model the step starts from.

    Returns
    -------
    EMStep
        The new model, with the log-density of the data under ``model`` and their count.

    See Also
    --------
    seq_estimate : The same step, returning only the model.
    mixle_nb.inference.fit : Steps to convergence.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, em_step, seq_encode
    >>> enc = seq_encode(np.array([1.0, 2.0, 3.0]), estimator=GaussianEstimator())
    >>> step = em_step(enc, GaussianEstimator(), GaussianDistribution(0.0, 1.0))
    >>> step.model.mu, step.count
    (2.0, 3.0)
    """
    if hasattr(enc, "pysp_em_step"):
        return enc.pysp_em_step(estimator, model)
    if is_handle(enc):  # a handle without the one-pass extension
        count, total = enc.pysp_seq_log_density_sum(model)
        return EMStep(enc.pysp_seq_estimate(estimator, model), count, total)
    for local_step in LOCAL_STEPS:
        taken = local_step(enc, estimator, model)
        if taken is not None:
            return EMStep(*taken)
    acc = accumulate([enc], estimator, model)
    return EMStep(m_step(estimator, acc.count, acc.accumulator), acc.count, acc.log_density)


def seq_estimate(enc: Any, estimator: Estimator, prev_estimate: Distribution) -> Distribution:
    """One EM step: E-step under ``prev_estimate``, then the M-step.

    Parameters
    ----------
    enc : encoding or EncodedDataHandle
        Local encoded data or any handle.
    estimator : Estimator
        The family's estimator.
    prev_estimate : Distribution
        The model the step starts from.

    Returns
    -------
    Distribution
        The new model.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, seq_encode, seq_estimate
    >>> enc = seq_encode(np.array([1.0, 2.0, 3.0]), estimator=GaussianEstimator())
    >>> seq_estimate(enc, GaussianEstimator(), GaussianDistribution(0.0, 1.0)).mu
    2.0
    """
    if is_handle(enc):
        return enc.pysp_seq_estimate(estimator, prev_estimate)
    return em_step(enc, estimator, prev_estimate).model


def initial_weights(n: int, rng: np.random.Generator, p: float) -> np.ndarray:
    """Each observation takes part with probability ``p`` (weight 1, else 0)."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"initialisation fraction p must be in (0, 1]; got {p!r}")
    return (rng.random(n) < p).astype(np.float64)


def seq_initialize(enc: Any, estimator: Estimator, rng: Any, p: float) -> Distribution:
    """Random initial model: a random subset of the data with random mixture responsibilities.

    Parameters
    ----------
    enc : encoding or EncodedDataHandle
        Local encoded data or any handle.
    estimator : Estimator
        The family's estimator (ours or mixle's).
    rng : None, int, numpy.random.Generator or numpy.random.RandomState
        The random source; mixle's accumulators get a ``RandomState`` (one passes through
        unchanged, a ``Generator`` seeds one).
    p : float
        The probability that an observation takes part, in (0, 1].

    Returns
    -------
    Distribution
        The initial model.

    Raises
    ------
    ValueError
        If ``p`` is outside (0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator, seq_encode, seq_initialize
    >>> estimator = MixtureEstimator([GaussianEstimator()] * 2)
    >>> enc = seq_encode(np.random.default_rng(0).normal(size=200), estimator=estimator)
    >>> len(seq_initialize(enc, estimator, rng=0, p=0.5).components)
    2
    """
    if is_handle(enc):
        return enc.pysp_seq_initialize(estimator, rng, p)
    if not isinstance(rng, np.random.RandomState):  # ours take either; a RandomState passes
        rng = random_source(rng)  # through unchanged to mixle's (foreign.ForeignAccumulator)
    weights = initial_weights(encoded_count(enc, estimator), rng, p)
    rows_weights = sample_weights(enc)
    if rows_weights is not None:
        weights = weights * rows_weights.cpu().numpy()
    acc = foreign.accumulator(estimator)
    if isinstance(enc, PointEncoding) and len(enc) and hasattr(acc, "set_reference"):
        acc.set_reference(
            enc.rows(0, 1).points[:, 0].cpu().numpy()
        )  # one process: centre on the data (see centred_moments)
    acc.seq_initialize(enc, weights, rng)
    return m_step(estimator, float(weights.sum()), acc)


def seq_log_density_sum(enc: Any, model: Distribution) -> tuple[float, float]:
    """``(count, total log-density)`` of the data under ``model``.

    Parameters
    ----------
    enc : encoding or EncodedDataHandle
        Local encoded data or any handle (whose count and total are global).
    model : Distribution
        The model.

    Returns
    -------
    tuple of float
        The observation count and the summed log-density.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.stats import GaussianDistribution, GaussianEstimator, seq_encode, seq_log_density_sum
    >>> enc = seq_encode(np.array([0.0, 0.0]), estimator=GaussianEstimator())
    >>> count, total = seq_log_density_sum(enc, GaussianDistribution(0.0, 1.0))
    >>> count, bool(np.isclose(total, -np.log(2 * np.pi)))
    (2.0, True)
    """
    if is_handle(enc):
        return enc.pysp_seq_log_density_sum(model)
    summed = log_density_total(model, enc)
    return float(encoded_count(enc, model.estimator() if hasattr(model, "estimator") else None)), summed

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
from .frame import PointEncoding
from .handle import EncodedDataHandle


@dataclass
class Accumulated:
    """Statistics of some data for the next model, and the log-density of the current one."""

    count: float
    accumulator: AnyAccumulator
    log_density: float  # NaN when no model was given


@dataclass
class EMStep:
    """One EM step, the one record of it end to end (``em_step``, ``fit``'s history, a rank's
    step, a panel's history, checkpoints): the new ``model``, and ``log_density`` of the data
    under the model the step started from (a by-product of the same E-step pass), over
    ``count`` observations. The rest is filled by whoever knows it: ``step`` (1-based, in its
    start or panel), ``gain`` per observation over the previous step and ``start`` (which of
    ``fit``'s starts); on the ranks ``rank_seconds`` (E-step seconds per rank: this rank's
    alone until the client gathers them) and ``step_s`` (this rank's whole step); and the
    elastic ``recovery`` the step was taken again after."""

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
        Where the encoding lives (``None``: the CPU; see :func:`encode`).

    Returns
    -------
    object
        The encoding (opaque: count its observations with :func:`encoded_count`).

    Raises
    ------
    ValueError
        If neither ``model`` nor ``estimator`` is given, or ``data`` is empty.
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
    """E-step over encoded ``chunks`` into one accumulator; also sums the log-density of ``model``
    (``with_log_density=False``: only where ``seq_update`` returns it for free; a family whose
    update does not, as mixle's, would pay a second pass).

    ``counts`` are the chunks' observation counts (a handle knows them from the raw data);
    without them each chunk is counted with :func:`encoded_count`. Unit weights are ``None``,
    so no array of ones is built or sent to the encoding's device every step (another
    package's accumulator gets the array it requires: ``foreign.py``). A chunk whose rows
    carry sample weights (:func:`~mixle_nb.stats.frame.with_weights`) counts their sum, and
    its log-density is their weighted sum."""
    acc = foreign.accumulator(estimator)
    if counts is None:
        counts = [encoded_count(enc, estimator) for enc in chunks]
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
    """
    return estimator.estimate(count, tie_keys(acc).value())


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
    """
    if hasattr(enc, "pysp_em_step"):
        return enc.pysp_em_step(estimator, model)
    if is_handle(enc):  # a handle without the one-pass extension
        count, total = enc.pysp_seq_log_density_sum(model)
        return EMStep(enc.pysp_seq_estimate(estimator, model), count, total)
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
        unchanged, a ``Generator`` seeds one: :func:`~mixle_nb.stats.base.random_source`).
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
        acc.set_reference(enc.points[:, 0].cpu().numpy())  # one process: centre on the data (see centred_moments)
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
    """
    if is_handle(enc):
        return enc.pysp_seq_log_density_sum(model)
    summed = log_density_total(model, enc)
    return float(encoded_count(enc, model.estimator() if hasattr(model, "estimator") else None)), summed

"""Per-observation answers under a fitted model: labels (:func:`predict`), responsibilities
(:func:`predict_proba`) and log-densities (:func:`score_samples`), on local data or where a
handle's shards live."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..stats.base import Distribution
from ..stats.estimation import is_handle


def _per_observation(data_or_handle: Any, model: Distribution, function: Callable, gather: bool) -> np.ndarray:
    if is_handle(data_or_handle):
        if not hasattr(data_or_handle, "pysp_shard_map"):
            raise TypeError(
                f"{type(data_or_handle).__name__} has no pysp_shard_map: it cannot score "
                "observations where they live; score the raw data instead"
            )
        explain = getattr(data_or_handle, "explain_failure", None)  # names a model of another dimension

        def scored(enc: Any) -> np.ndarray:
            try:
                return function(enc)
            except Exception as exc:
                explained = exc if explain is None else explain(exc, model)
                if explained is exc:
                    raise
                raise explained from exc

        return data_or_handle.pysp_shard_map(scored, gather=gather)
    return function(model.dist_to_encoder().seq_encode(data_or_handle))


def _posterior_of(model: Distribution) -> Callable:
    if not hasattr(model, "seq_posterior"):
        raise TypeError(
            f"predict and predict_proba need a mixture (a model with seq_posterior); got {type(model).__name__}"
        )
    return model.seq_posterior


def predict_proba(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """``(N, K)`` component responsibilities under a mixture ``model``.

    Parameters
    ----------
    data_or_handle : array_like or EncodedDataHandle
        Raw observations or any handle with ``pysp_shard_map``.
    model : MixtureDistribution
        A mixture (a model with ``seq_posterior``).
    gather : bool, default False
        On a handle, return every observation's rows, in the original order, on every rank
        (default: each rank its own shard's).

    Returns
    -------
    numpy.ndarray
        One row per observation, one column per component, each row summing to 1.

    Raises
    ------
    TypeError
        ``model`` is not a mixture, or the handle cannot score observations where they live.

    See Also
    --------
    predict, score_samples

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import predict_proba
    >>> from mixle_nb.stats import GaussianDistribution, MixtureDistribution
    >>> model = MixtureDistribution([GaussianDistribution(-3.0, 1.0), GaussianDistribution(3.0, 1.0)], [0.5, 0.5])
    >>> predict_proba(np.array([-3.0, 0.0]), model).round(3)
    array([[1. , 0. ],
           [0.5, 0.5]])
    """
    return _per_observation(data_or_handle, model, _posterior_of(model), gather)


def predict(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """Each observation's most responsible component.

    Parameters
    ----------
    data_or_handle : array_like or EncodedDataHandle
        Raw observations or any handle with ``pysp_shard_map``.
    model : MixtureDistribution
        A mixture (a model with ``seq_posterior``).
    gather : bool, default False
        On a handle, return every observation's label, in the original order, on every rank
        (default: each rank its own shard's).

    Returns
    -------
    numpy.ndarray
        One component index per observation.

    Raises
    ------
    TypeError
        ``model`` is not a mixture, or the handle cannot score observations where they live.

    See Also
    --------
    predict_proba, score_samples

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import predict
    >>> from mixle_nb.stats import GaussianDistribution, MixtureDistribution
    >>> model = MixtureDistribution([GaussianDistribution(-3.0, 1.0), GaussianDistribution(3.0, 1.0)], [0.5, 0.5])
    >>> predict(np.array([-3.0, 0.1, 3.0]), model)
    array([0, 1, 1])
    """
    posterior = _posterior_of(model)
    return _per_observation(data_or_handle, model, lambda enc: np.argmax(posterior(enc), axis=1), gather)


def score_samples(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """Each observation's log-density under ``model``.

    Parameters
    ----------
    data_or_handle : array_like or EncodedDataHandle
        Raw observations or any handle with ``pysp_shard_map``.
    model : Distribution
        Any model.
    gather : bool, default False
        On a handle, return every observation's log-density, in the original order, on every
        rank (default: each rank its own shard's).

    Returns
    -------
    numpy.ndarray
        One log-density per observation.

    Raises
    ------
    TypeError
        The handle cannot score observations where they live.

    See Also
    --------
    predict_proba, mixle_nb.stats.seq_log_density_sum

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.inference import score_samples
    >>> from mixle_nb.stats import GaussianDistribution
    >>> score_samples(np.array([0.0]), GaussianDistribution(0.0, 1.0)).round(4)
    array([-0.9189])
    """
    return _per_observation(data_or_handle, model, model.seq_log_density, gather)

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

    On a handle each rank computes its own shard's rows and keeps them; ``gather=True``
    returns every observation's, in the original order, on every rank."""
    return _per_observation(data_or_handle, model, _posterior_of(model), gather)


def predict(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """Each observation's most responsible component (see :func:`predict_proba`)."""
    posterior = _posterior_of(model)
    return _per_observation(data_or_handle, model, lambda enc: np.argmax(posterior(enc), axis=1), gather)


def score_samples(data_or_handle: Any, model: Distribution, *, gather: bool = False) -> np.ndarray:
    """Each observation's log-density under ``model`` (see :func:`predict_proba`)."""
    return _per_observation(data_or_handle, model, model.seq_log_density, gather)

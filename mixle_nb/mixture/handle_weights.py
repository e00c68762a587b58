"""Sums over the sample weights that rows on ranks carry (``weighted_rows_encoder``), taken with
a handle's log-density sum (one pass over the rank's rows, one exchange of two numbers): the
ranks' total weight, checked before a fit starts, and a model's weighted log-density."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..stats.estimation import sample_weights

ALL_ZERO = "Sample weights must contain at least one non-zero number"


class _RowWeights:
    """A stand-in model whose per-row "log-density" is the row's sample weight (1 where the rows
    carry none), so that a handle's log-density sum is its total weight."""

    def device_log_density(self, enc: Any) -> torch.Tensor:
        weights = sample_weights(enc)
        return torch.ones(len(enc), dtype=torch.float64) if weights is None else weights

    def __repr__(self) -> str:
        return "RowWeights()"


class _WeightedByRows:
    """``model`` whose per-row log-density is multiplied by the row's sample weight (a row of
    weight 0 adds 0, even where ``model`` gives it no density)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def device_log_density(self, enc: Any) -> torch.Tensor:
        if hasattr(self.model, "device_log_density"):
            values = self.model.device_log_density(enc)
        else:
            values = torch.as_tensor(np.asarray(self.model.seq_log_density(enc), dtype=np.float64))
        weights = sample_weights(enc)
        if weights is None:
            return values
        return torch.where(weights > 0, values * weights.to(values.device), torch.zeros_like(values))

    def __repr__(self) -> str:
        return f"WeightedByRows({self.model!r})"


def total_weight(handle: Any) -> float:
    """The total sample weight of ``handle``'s rows on every rank (its row count where the rows
    carry no weights); called on every rank."""
    return float(handle.pysp_seq_log_density_sum(_RowWeights())[1])


def checked_total_weight(handle: Any) -> float:
    """:func:`total_weight`, refused with scikit-learn's message when every row weighs 0.

    Raises
    ------
    ValueError
        If the rows' weights are all zero, on every rank (before any work).
    """
    weight = total_weight(handle)
    if not weight > 0:
        raise ValueError(
            f"{ALL_ZERO}: every one of the handle's {len(handle)} rows weighs 0, on every rank; "
            "give some rows a positive weight (the last column of the weighted rows)"
        )
    return weight


def weighted_log_density_sum(handle: Any, model: Any) -> float:
    """The log-density of ``handle``'s rows under ``model``, each row's weighted by its sample
    weight, summed over every rank; called on every rank."""
    return float(handle.pysp_seq_log_density_sum(_WeightedByRows(model))[1])

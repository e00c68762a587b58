"""Each state's emission family, through the mixtures' own kernels and accumulators.

The states' emissions are the components of a mixture with no weights: one batched kernel
gives every state's log-density of a batch's observations (and what it computed on the way,
the Gaussians' centred differences or shared-frame features, which their M-step sums reuse),
and the state posteriors are handed to the states' accumulators as a mixture hands its
responsibilities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..base import Distribution
from ..mixture import _stacked_kernel, component_log_density


class EmissionKernel:
    """``enc -> ((K, N) log p_k(x), terms)`` for states emitting from ``emissions``."""

    def __init__(self, emissions: Sequence[Distribution]) -> None:
        self.emissions = list(emissions)
        stacked = _stacked_kernel(self.emissions, "stacked_kernel")
        self._kernel = stacked(self.emissions) if stacked is not None else None

    def __call__(self, enc: Any) -> tuple[torch.Tensor, Any]:
        if self._kernel is None:
            return torch.stack([component_log_density(e, enc) for e in self.emissions]), None
        joint = getattr(self._kernel, "joint", None)
        return joint(enc) if joint is not None else (self._kernel(enc), None)


def add_emission_statistics(accumulators: list, enc: Any, resp: torch.Tensor, emissions: Sequence, terms: Any) -> None:
    """Add the posteriors ``resp`` (K, N) of ``enc``'s observations as state k's weights."""
    gather = _stacked_kernel(accumulators, "stacked_block_sums")
    if gather is not None and terms is not None:
        sums = gather(accumulators)
        if sums is not None:
            sums.add(terms, resp)
            sums.hand_over()
            return
    stacked = _stacked_kernel(accumulators, "stacked_seq_update")
    if stacked is not None:
        references = None
        if all(hasattr(e, "mu") for e in emissions):
            references = np.stack([np.atleast_1d(np.asarray(e.mu, dtype=np.float64)) for e in emissions])
        stacked(accumulators, enc, resp, block=terms, references=references)
        return
    for acc, weights, emission in zip(accumulators, resp, emissions):
        acc.seq_update(enc, weights, emission)

"""Each state's emission family, through the mixtures' own kernels and accumulators.

The states' emissions are the components of a mixture with no weights: one batched kernel
gives every state's log-density of a batch's observations (and what it computed on the way,
the Gaussians' centred differences or shared-frame features, which their M-step sums reuse),
and the state posteriors are handed to the states' accumulators as a mixture hands its
responsibilities. On the CPU two families take faster routes of their own (compiled, into
reused buffers: a batch is a million rows): categorical states one gather from a (K, labels)
table of log-probabilities and one scatter of the posteriors into (K, labels) counts;
axis-aligned Gaussian states (:mod:`.diagonal_states`) their log-densities and M-step sums
centred on each state's mean."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from ..base import Distribution
from ..categorical import CategoricalAccumulator, CategoricalDistribution, LabelEncoding
from ..diagonal_gaussian import DiagonalGaussianDistribution
from ..mixture import _stacked_kernel, component_log_density
from . import diagonal_states
from .forward_backward import workspace


class EmissionKernel:
    """``enc -> ((K, N) log p_k(x), terms)`` for states emitting from ``emissions``."""

    def __init__(self, emissions: Sequence[Distribution]) -> None:
        self.emissions = list(emissions)
        stacked = _stacked_kernel(self.emissions, "stacked_kernel")
        self._kernel = stacked(self.emissions) if stacked is not None else None
        self._categorical = all(isinstance(e, CategoricalDistribution) for e in self.emissions)
        self._diagonal = all(isinstance(e, DiagonalGaussianDistribution) for e in self.emissions)

    def __call__(self, enc: Any) -> tuple[torch.Tensor, Any]:
        if self._categorical and isinstance(enc, LabelEncoding):
            return categorical_log_b(cast(list[CategoricalDistribution], self.emissions), enc), None
        if self._diagonal and diagonal_states.applies(self.emissions, enc):
            return diagonal_states.diagonal_log_b(cast(list[DiagonalGaussianDistribution], self.emissions), enc)
        if self._kernel is None:
            return torch.stack([component_log_density(e, enc) for e in self.emissions]), None
        joint = getattr(self._kernel, "joint", None)
        return joint(enc) if joint is not None else (self._kernel(enc), None)


def categorical_log_b(emissions: Sequence[CategoricalDistribution], enc: LabelEncoding) -> torch.Tensor:
    """``(K, N)`` log-probabilities of ``enc``'s labels under each state's categorical; on the
    CPU in a reused buffer (:func:`.forward_backward.workspace`: a fresh array this large costs
    its page faults, as much as the gather), valid until this thread's next call."""
    labels = enc.labels.tolist()
    with np.errstate(divide="ignore"):
        table = np.log(np.array([[e.pmap.get(label, 0.0) for label in labels] for e in emissions], dtype=np.float64))
    if enc.device.type != "cpu":
        return torch.from_numpy(table).to(enc.device).index_select(1, enc.index)
    from . import compiled  # numba's import when first needed

    out = workspace("categorical log_b", (len(emissions), len(enc)), enc.device)
    compiled.gather_columns(table, enc.index.numpy(), out.numpy())
    return out


def add_categorical_counts(
    accumulators: Sequence[CategoricalAccumulator], enc: LabelEncoding, resp: torch.Tensor
) -> None:
    """Add each state's posterior-weighted label counts (``resp`` (K, N)) to its accumulator."""
    if enc.device.type == "cpu":
        from . import compiled

        counts = np.empty((len(accumulators), len(enc.labels)))
        compiled.scatter_columns(resp.detach().contiguous().numpy(), enc.index.numpy(), counts)
    else:
        on_device = torch.zeros(len(accumulators), len(enc.labels), dtype=torch.float64, device=enc.device)
        counts = on_device.index_add_(1, enc.index, resp).cpu().numpy()
    labels = enc.labels.tolist()
    for acc, row in zip(accumulators, counts.tolist()):
        acc.combine(dict(zip(labels, row)))


def add_emission_statistics(accumulators: list, enc: Any, resp: torch.Tensor, emissions: Sequence, terms: Any) -> None:
    """Add the posteriors ``resp`` (K, N) of ``enc``'s observations as state k's weights."""
    if isinstance(enc, LabelEncoding) and all(type(a) is CategoricalAccumulator for a in accumulators):
        add_categorical_counts(accumulators, enc, resp)
        return
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

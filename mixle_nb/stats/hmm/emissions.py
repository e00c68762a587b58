"""Each state's emission family, through the mixtures' own kernels and accumulators.

The states' emissions are the components of a mixture with no weights: one batched kernel
gives every state's log-density of a batch's observations (and what it computed on the way,
the Gaussians' centred differences or shared-frame features, which their M-step sums reuse),
and the state posteriors are handed to the states' accumulators as a mixture hands its
responsibilities. On the CPU two families take faster routes of their own (compiled, into
reused buffers: a batch is a million rows): categorical states one gather from a (K, labels)
table of log-probabilities and one scatter of the posteriors into (K, labels) counts;
axis-aligned Gaussian states (:mod:`.diagonal_states`) their log-densities and M-step sums
centred on each state's mean. For the compiled scaled pass, which makes these two families'
emission terms and statistics inside the pass (:mod:`.scaled_kernel`), :func:`compiled_source`
and :func:`compiled_statistics` say what it reads and where it adds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch

from ..base import Distribution
from ..categorical import CategoricalAccumulator, CategoricalDistribution, LabelEncoding
from ..centred_moments import CentredMoments
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


def log_probability_table(emissions: Sequence[CategoricalDistribution], enc: LabelEncoding) -> np.ndarray:
    """``(K, labels)``: each state's log-probability of each of ``enc``'s labels."""
    labels = enc.labels.tolist()
    with np.errstate(divide="ignore"):
        return np.log(np.array([[e.pmap.get(label, 0.0) for label in labels] for e in emissions], dtype=np.float64))


def categorical_log_b(emissions: Sequence[CategoricalDistribution], enc: LabelEncoding) -> torch.Tensor:
    """``(K, N)`` log-probabilities of ``enc``'s labels under each state's categorical; on the
    CPU in a reused buffer (:func:`.forward_backward.workspace`: a fresh array this large costs
    its page faults, as much as the gather), valid until this thread's next call."""
    table = log_probability_table(emissions, enc)
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
    hand_counts(accumulators, enc, counts)


def hand_counts(accumulators: Sequence[CategoricalAccumulator], enc: LabelEncoding, counts: np.ndarray) -> None:
    """Add row k of ``counts`` (K, labels), the weights of each of ``enc``'s labels, to state k."""
    labels = enc.labels.tolist()
    for acc, row in zip(accumulators, counts.tolist()):
        acc.combine(dict(zip(labels, row)))


def compiled_source(emissions: Sequence[Distribution], enc: Any) -> tuple[int, tuple] | None:
    """What the compiled scaled pass reads to make the emission terms of ``enc`` itself
    (:mod:`.scaled_kernel`'s source and emission tuple): axis-aligned Gaussian states on
    unweighted CPU points, or categorical states on CPU labels; ``None`` for any other."""
    from . import scaled_kernel

    if diagonal_states.applies(emissions, enc):
        mu, factor, const = diagonal_states.state_parameters(cast(list[DiagonalGaussianDistribution], emissions))
        points = np.ascontiguousarray(enc.points.numpy())
        return scaled_kernel.DIAGONAL, scaled_kernel.diagonal_emission(points, mu, factor, const)
    categorical = all(isinstance(e, CategoricalDistribution) for e in emissions)
    if categorical and isinstance(enc, LabelEncoding) and enc.device.type == "cpu":
        table = log_probability_table(cast(list[CategoricalDistribution], emissions), enc)
        return scaled_kernel.CATEGORICAL, scaled_kernel.categorical_emission(enc.index.numpy(), table)
    return None


def compiled_statistics(
    accumulators: Sequence[Any], source: int, emission: tuple, enc: Any
) -> tuple[int, np.ndarray, Callable[[], None]] | None:
    """Where the compiled scaled pass adds the posteriors of ``enc``'s observations, for states
    whose emission terms it makes from ``source``: the target, its array, and what hands the
    array to ``accumulators`` afterwards; ``None`` where the accumulators take the posteriors
    in their own way (full-covariance sums, mixed kinds)."""
    from . import scaled_kernel

    k = len(accumulators)
    if source == scaled_kernel.DIAGONAL and all(type(a) is CentredMoments and not a.full for a in accumulators):
        mu = emission[2]
        sums = np.empty((k, 1 + 2 * mu.shape[1]))

        def hand_sums() -> None:
            for acc, reference, row in zip(accumulators, mu, sums):
                acc.add_sums(reference, row)

        return scaled_kernel.DIAGONAL, sums, hand_sums
    if source == scaled_kernel.CATEGORICAL and all(type(a) is CategoricalAccumulator for a in accumulators):
        counts = np.empty((len(enc.labels), k))
        return scaled_kernel.CATEGORICAL, counts, lambda: hand_counts(accumulators, enc, counts.T)
    return None


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

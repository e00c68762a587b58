"""States emitting from axis-aligned Gaussians, on the CPU: compiled emission terms and sums.

The mixtures' kernel for these families makes a fresh ``(K, N)`` product and ``(1 + 2D, N)``
features per block; an HMM's batch is a million rows, where the fresh memory's page faults cost
as much as the arithmetic. Here the log-densities go into a reused buffer in one compiled pass,
centred on each state's mean (as the mixtures' ``CentredBlock``), and the M-step sums
``[Σw, Σw d, Σw d²]`` about the same means come from one more pass over the posteriors: the
accumulators receive them through the block protocol of :class:`~mixle_nb.stats.centred_moments.BlockSums`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..diagonal_gaussian import DiagonalGaussianDistribution
from ..frame import LOG_2PI, PointEncoding, centred
from .forward_backward import workspace


def applies(emissions: Sequence[object], enc: object) -> bool:
    """Whether every state is an axis-aligned Gaussian and ``enc`` unweighted points on the CPU."""
    return (
        isinstance(enc, PointEncoding)
        and enc.weights is None
        and enc.points.device.type == "cpu"
        and all(isinstance(e, DiagonalGaussianDistribution) and not getattr(e, "full", False) for e in emissions)
    )


class CentredPoints:
    """An E-step block of points with the states' means as references (the ``device_sums`` /
    ``rows`` protocol of the mixtures' blocks)."""

    def __init__(self, enc: PointEncoding, references: np.ndarray):
        self.enc, self.references = enc, references

    def device_sums(self, weights: torch.Tensor, full: bool) -> torch.Tensor:
        """``(K, 1 + 2D)`` rows ``[Σw, Σw d, Σw d²]``; a full estimator's through ``CentredBlock``."""
        if full:
            return centred(self.enc, self.references).device_sums(weights, full)
        from . import compiled

        out = np.empty((len(self.references), 1 + 2 * self.references.shape[1]))
        compiled.centred_sums(self.enc.points.numpy(), self.references, weights.detach().contiguous().numpy(), out)
        return torch.from_numpy(out)

    def rows(self, total: torch.Tensor, full: bool) -> np.ndarray:
        """The summed rows as the accumulators take them (already about ``references``)."""
        return total.cpu().numpy()

    def sums(self, weights: torch.Tensor, full: bool) -> np.ndarray:
        """:meth:`device_sums` as the accumulators take them."""
        return self.rows(self.device_sums(weights, full), full)


def state_parameters(emissions: Sequence[DiagonalGaussianDistribution]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The states' means (K, D), ``-1 / (2 sigma²)`` (K, D) and log-normalising constants (K,)."""
    mu = np.ascontiguousarray(np.stack([np.atleast_1d(np.asarray(e.mu, dtype=np.float64)) for e in emissions]))
    sigma2 = np.stack([np.atleast_1d(np.asarray(e.sigma2, dtype=np.float64)) for e in emissions])
    const = -0.5 * (mu.shape[1] * LOG_2PI + np.log(sigma2).sum(axis=1))
    return mu, np.ascontiguousarray(-0.5 / sigma2), const


def diagonal_log_b(
    emissions: Sequence[DiagonalGaussianDistribution], enc: PointEncoding
) -> tuple[torch.Tensor, CentredPoints]:
    """``(K, N)`` log-densities (in a reused buffer, valid until this thread's next call) and
    the block of points centred on the states' means."""
    from . import compiled

    mu, factor, const = state_parameters(emissions)
    out = workspace("diagonal log_b", (len(emissions), len(enc)), enc.points.device)
    compiled.diagonal_log_b(enc.points.numpy(), mu, factor, const, out.numpy())
    return out, CentredPoints(enc, mu)

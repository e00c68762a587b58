"""The full-covariance E-step above the stored-feature dimension, as a few matrix products a block.

Above ``STORED_FEATURES_MAX_DIM`` an encoding keeps no features (1 + D + D(D+1)/2 floats a point
would not fit in memory), and making them per block streams a block of 2,145 rows a point (D =
64) through memory twice. Here a block reads only its differences ``y = x - c`` to the model's
shared point ``c`` (:mod:`.frame`'s shared frame), ``D`` floats a point:

- **E-step**: ``z_k = Uₖᵀ y - Uₖᵀ(μ_k - c)`` for every component at once, one product of the
  stacked factors (K·D, D) with ``y`` (D, rows), and ``log p = c_k - ½‖z_k‖²``. Rounding is
  relative to ``‖z‖`` and the mean's whitened distance ``T`` from ``c`` (within the shared
  frame's reach), not to where the data sit.
- **M-step**: ``[Σw, Σw·y, Σw·yyᵀ]`` about ``c``, the scatter as one product of the
  responsibility-scaled copies ``w_k ∘ y`` (K·D, rows) with ``yᵀ``; the sums are float64
  whatever the E-step's dtype (:func:`.frame.float64_products`).
- **Bands**: ``Uₖᵀ`` is lower triangular and ``Σw·yyᵀ`` symmetric, so both products are cut into
  bands of ``BAND_WIDTH`` coordinates: band b of the whitened differences reads only the first
  bands of ``y``, and band b of the scatter's columns only the rows above it, skipping the zero
  half of the factor and the mirrored half of the sums (5/8 of the arithmetic at D = 64).

Components farther apart than the shared frame's reach take the differences to each one's own
mean (K, D, rows), the same bands as one batched product each. Within the reach, K >= D/2
components take :class:`.frame.FullKernel`'s quadratic features made per block instead
(:func:`shared_bands`), as does an encoding that stores its features (D <= 16).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from .frame import (
    STORED_FEATURES_MAX_DIM,
    ComponentFrames,
    ComponentParameters,
    FullKernel,
    PointEncoding,
    float64_products,
    matmul,
    shared_point,
)

# Coordinates a band: a step at D = 64, N = 5e4, K = 8 on one thread (CPU time) took 109 ms in
# bands of 16, 129 ms in bands of 8 and 138 ms in bands of 32 (one run, interleaved).
BAND_WIDTH = 16


def applies(dim: int) -> bool:
    """Whether a ``dim``-dimensional model takes :class:`BandedFullKernel`: above the stored
    features' dimension, where an encoding keeps only its points."""
    return dim > STORED_FEATURES_MAX_DIM


def shared_bands(dim: int, k: int) -> bool:
    """Whether K components in ``dim`` dimensions within the shared frame's reach take the banded
    products (``dim > 2K``) rather than :class:`.frame.FullKernel`'s quadratic features made per
    block. Where K >= D/2 those features are at most ~4 MB (the blocks shrink as K grows), cost
    fewer floats a point to make (D(D+1)/2) than the scaled copies (K·D) and less arithmetic;
    measured (a step's CPU time, one thread) the features took 0.9x the banded time at D = 32,
    K = 16, 1.0x at D = 64, K = 32, and 3x at D = 32, K = 8. Components beyond the reach take
    the bands whatever K: each component's own differences make no shared features."""
    return dim > 2 * k


def band_edges(dim: int) -> tuple[tuple[int, int], ...]:
    """The ``(start, stop)`` coordinates of each band of a ``dim``-dimensional model: bands of
    about ``BAND_WIDTH``, one at least."""
    count = max(1, round(dim / BAND_WIDTH))
    edges = np.linspace(0, dim, count + 1).round().astype(int).tolist()
    return tuple(zip(edges[:-1], edges[1:]))


@dataclass
class ScatterBlock:
    """One block's differences to its references (K, D): ``y`` (D, rows) to one shared point
    ``c`` (every row of ``references``), or ``y`` (K, D, rows) to each component's own mean."""

    references: np.ndarray
    y: torch.Tensor
    bands: tuple[tuple[int, int], ...]

    def device_sums(self, weights: torch.Tensor, full: bool) -> torch.Tensor:
        """The sums for weights (K, rows), float64, flat on the block's device: ``Σw`` (K),
        ``Σw·y`` (K·D), then ``Σw·y²`` (K·D) or (``full``) each band's scatter columns over the
        rows of the bands up to it (:meth:`rows` unpacks them)."""
        if self.y.ndim == 3:
            return self._own_sums(weights.to(torch.float64), full)
        y = self.y
        k, dim = len(self.references), y.shape[0]
        parts = [weights.sum(dim=1, dtype=torch.float64), float64_products(weights, y).reshape(-1)]
        if not full:
            parts.append(float64_products(weights, y * y).reshape(-1))
            return torch.cat(parts)
        # w_k ∘ y band-major: band h's rows K·start .. K·stop, component-major within it
        scaled = torch.empty(k * dim, y.shape[1], dtype=weights.dtype, device=y.device)
        for start, stop in self.bands:
            torch.mul(
                y[None, start:stop], weights[:, None, :], out=scaled[k * start : k * stop].view(k, stop - start, -1)
            )
        parts.extend(float64_products(scaled[: k * stop], y[start:stop]).reshape(-1) for start, stop in self.bands)
        return torch.cat(parts)

    def _own_sums(self, weights: torch.Tensor, full: bool) -> torch.Tensor:
        """:meth:`device_sums` of differences to each component's own mean, one batched product a
        band; a float32 block's widened to float64 first (components this far apart are rare)."""
        y = self.y.to(torch.float64)
        scaled = y * weights[:, None, :]
        parts = [weights.sum(dim=1), scaled.sum(dim=2).reshape(-1)]
        if not full:
            parts.append(torch.linalg.vecdot(scaled, y, dim=2).reshape(-1))
            return torch.cat(parts)
        parts.extend(
            matmul(scaled[:, :stop], y[:, start:stop].transpose(1, 2)).reshape(-1) for start, stop in self.bands
        )
        return torch.cat(parts)

    def _band_columns(self, flat: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Band ``start:stop``'s scatter columns over the rows above its end, (K, stop, width)."""
        k, width = len(self.references), stop - start
        if self.y.ndim == 3:
            return flat.reshape(k, stop, width)
        band_major = flat.reshape(k * stop, width)
        return np.concatenate(
            [
                band_major[k * first : k * last].reshape(k, last - first, width)
                for first, last in self.bands
                if first < stop
            ],
            axis=1,
        )

    def rows(self, total: torch.Tensor, full: bool) -> np.ndarray:
        """The accumulators' rows ``[Σw, Σw·y, Σw·y∘y or Σw·yyᵀ]`` (about the references) from
        the total of :meth:`device_sums`, the scatter's lower bands mirrored from the upper."""
        flat = total.cpu().numpy()
        k, dim = self.references.shape
        count, first = flat[:k], flat[k : k + k * dim].reshape(k, dim)
        if not full:
            return np.concatenate([count[:, None], first, flat[k + k * dim :].reshape(k, dim)], axis=1)
        second = np.empty((k, dim, dim))
        at = k + k * dim
        for start, stop in self.bands:
            size = k * stop * (stop - start)
            columns = self._band_columns(flat[at : at + size], start, stop)
            at += size
            second[:, :stop, start:stop] = columns
            second[:, start:stop, :start] = columns[:, :start].transpose(0, 2, 1)
        return np.concatenate([count[:, None], first, second.reshape(k, -1)], axis=1)

    def sums(self, weights: torch.Tensor, full: bool) -> np.ndarray:
        """:meth:`rows` of this block's own :meth:`device_sums`."""
        return self.rows(self.device_sums(weights, full), full)


class BandedFullKernel:
    """``enc -> (K, N)`` log w_k + log p_k(x) of full-covariance Gaussians, the same model as
    :class:`.frame.FullKernel` (which it falls back to), by banded products on encodings without
    stored features (see the module docstring).

    Parameters
    ----------
    mu : numpy.ndarray
        The means (K, D).
    prec_chol : numpy.ndarray
        ``U_k`` (K, D, D), upper triangular, ``Σ_k⁻¹ = U_k U_kᵀ``.
    log_norm : numpy.ndarray
        Each component's log normaliser (K,).
    log_weights : numpy.ndarray, optional
        ``(K,)`` log-weights added to each row (a mixture's joint).
    """

    def __init__(
        self, mu: np.ndarray, prec_chol: np.ndarray, log_norm: np.ndarray, log_weights: np.ndarray | None = None
    ):
        self._parts = (mu, prec_chol, log_norm, log_weights)
        self.references = mu
        self._const = log_norm if log_weights is None else log_norm + log_weights
        self._whiten = np.transpose(prec_chol, (0, 2, 1))
        self._bands = band_edges(mu.shape[1])
        self._c = shared_point(mu, self._whitened_offsets, torch.float64)
        self._shared_bands = shared_bands(mu.shape[1], len(mu))
        self._frames = ComponentFrames(self._frame)

    def _whitened_offsets(self, point: np.ndarray) -> np.ndarray:
        return np.einsum("kij,kj->ki", self._whiten, self.references - point)

    @functools.cached_property
    def _features_kernel(self) -> FullKernel:
        """The same model for encodings that store their features, made on first use."""
        return FullKernel(*self._parts)

    def _frame(self, enc: PointEncoding) -> tuple[np.ndarray | None, np.ndarray, ComponentParameters]:
        """``(c, references, parameters)`` in ``enc``'s frame: the shared point ``c`` (exact
        there) and, per band, the stacked factor rows (K·width, 1 + stop) that take ``[1; y]`` to
        ``z``, the offsets ``-Uₖᵀ(μ_k - c)`` first (none where the shared frame takes
        :class:`.frame.FullKernel`'s features, which decides ``c`` alike); or (``c`` ``None``:
        the means beyond the dtype's reach of one point) each component's mean and factor rows
        (K, width, stop)."""
        c = self._c if enc.dtype == torch.float64 else shared_point(self.references, self._whitened_offsets, enc.dtype)
        if c is None:
            references, shifted = enc.relative(self.references)
            own = {
                f"whiten{band}": self._whiten[:, start:stop, :stop] for band, (start, stop) in enumerate(self._bands)
            }
            return None, references, ComponentParameters(mu=shifted, const=self._const, **own)
        c, shifted = enc.relative(c)
        if not self._shared_bands:
            return c, self.references, ComponentParameters()
        offsets = self._whitened_offsets(c)
        k = len(self.references)
        arrays = {"c": shifted, "const": self._const}
        for band, (start, stop) in enumerate(self._bands):  # [-Uₖᵀ(μ_k - c), Uₖᵀ] rows start..stop
            rows = np.concatenate([-offsets[:, start:stop, None], self._whiten[:, start:stop, :stop]], axis=2)
            arrays[f"whiten{band}"] = rows.reshape(k * (stop - start), 1 + stop)
        return c, np.broadcast_to(c, self.references.shape), ComponentParameters(**arrays)

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, object]:
        """The log-joint (K, rows) and what the M-step sums next: a :class:`ScatterBlock`, or
        (an encoding with stored features, or K >= D/2 components within the shared frame's
        reach) :class:`.frame.FullKernel`'s block."""
        if enc.features is not None:
            return self._features_kernel.joint(enc)
        c, references, parameters = self._frames.of(enc)
        if c is not None and not self._shared_bands:
            return self._features_kernel.joint(enc)
        p = parameters.on(enc.device, enc.dtype)
        k, (dim, n) = len(self.references), enc.values.shape
        if c is None:
            return self._own_joint(enc, references, p)
        ones_y = torch.empty(1 + dim, n, dtype=enc.dtype, device=enc.device)  # [1; y]: the offsets join the products
        ones_y[0] = 1.0
        torch.sub(enc.values, p["c"][:, None], out=ones_y[1:])
        lp = p["const"][:, None].repeat(1, n)
        for band, (start, stop) in enumerate(self._bands):
            z = matmul(p[f"whiten{band}"], ones_y[: 1 + stop])
            lp.add_(z.square_().view(k, stop - start, n).sum(dim=1), alpha=-0.5)
        return lp, ScatterBlock(references, ones_y[1:], self._bands)

    def _own_joint(self, enc: PointEncoding, references: np.ndarray, p: dict) -> tuple[torch.Tensor, ScatterBlock]:
        """:meth:`joint` from each component's own differences ``x - μ_k`` (K, D, rows), one
        batched product a band."""
        d = torch.sub(enc.values[None], p["mu"][:, :, None])
        lp = p["const"][:, None].repeat(1, len(enc))
        for band, (_, stop) in enumerate(self._bands):
            lp.add_(matmul(p[f"whiten{band}"], d[:, :stop]).square_().sum(dim=1), alpha=-0.5)
        return lp, ScatterBlock(references, d, self._bands)

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]

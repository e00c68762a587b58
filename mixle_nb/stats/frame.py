"""The well-conditioned frame of the Gaussian families (1-D, spherical, diagonal, full).

Why: a raw-moment encoding (``[1, x, x²]``, ``Σx²/n - (Σx/n)²``, ``c0 + c1·x + c2·x²``) loses
about ``2·log10(|x| / σ)`` of float64's 16 digits to cancellation, so data far from the
origin relative to their spread (timestamps, projected coordinates) get wrong variances and an
EM that can go downhill. Nothing here works with raw moments:

- **E-step**: each component's log-density is taken from the differences ``d = x - μ_k`` to
  its own mean, whitened (``z = d / σ`` per coordinate, or ``z = Uᵀ d`` with ``Σ⁻¹ = U Uᵀ``
  for a full covariance, one batched product per block of rows): ``log p = c_k - ½‖z‖²``.
  Rounding is then relative to ``‖z‖``, whatever the offset and the units.
- **M-step**: each component's statistics are sums about a reference point every rank
  already agrees on, the model's component mean (the same ``d`` the E-step made), see
  :mod:`.centred_moments`. They are plain sums, so blocks, chunks and ranks still combine
  in any order, and the fold needs no extra exchange.

The encoding is just the points, ``(D, N)`` on their device; the E-step keeps one pass over
them, block by block: the differences ``d`` (K, D, rows) are made once per block and read by
both steps (the log-density, then the weighted sums ``Σw``, ``Σw·d`` and ``Σw·d·d`` from one
``w·d``), with temporaries sized to stay in cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .base import CPU, device_tensor, float_tensor

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class PointEncoding:
    """Observations as the columns of ``points`` (D, N), contiguous on their device."""

    points: torch.Tensor

    def __len__(self) -> int:
        return self.points.shape[1]

    @property
    def device(self) -> torch.device:
        return self.points.device

    @property
    def dim(self) -> int:
        return self.points.shape[0]

    @property
    def row_width(self) -> int:
        """Floats per row and component of an E-step block's temporaries (sizes device blocks)."""
        return 2 * self.points.shape[0] + 1

    def rows(self, start: int, stop: int) -> "PointEncoding":
        return PointEncoding(self.points[:, start:stop])


def point_encoding(x: np.ndarray, device: torch.device) -> PointEncoding:
    """``x`` (N, D) as a :class:`PointEncoding` on ``device`` (only ``x`` crosses to it)."""
    return PointEncoding(float_tensor(x).to(device).T.contiguous())


@dataclass
class CentredBlock:
    """One block's differences ``d`` (K, D, n) to reference points ``references`` (K, D)."""

    references: np.ndarray
    d: torch.Tensor


class _Parameters:
    """Named float64 arrays, copied once to each device that asks for them."""

    def __init__(self, **arrays: np.ndarray):
        self._on = {CPU: {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)) for k, v in arrays.items()}}

    def on(self, device: torch.device) -> dict:
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = {k: v.to(device) for k, v in self._on[CPU].items()}
        return found


def centred(enc: PointEncoding, references: np.ndarray, mu: Optional[torch.Tensor] = None) -> CentredBlock:
    """The differences of ``enc``'s points to each of ``references`` (K, D)."""
    if mu is None:
        mu = torch.from_numpy(np.ascontiguousarray(references, dtype=np.float64)).to(enc.device)
    return CentredBlock(references, torch.sub(enc.points[None], mu[:, :, None]))


class DiagonalKernel:
    """``enc -> (K, N)`` log w_k + log p_k(x) of axis-aligned Gaussians (means ``mu`` (K, D),
    variances ``sigma2`` (K, D)): ``c_k - Σ_j (x_j - μ_kj)² / (2σ²_kj)``."""

    def __init__(self, mu: np.ndarray, sigma2: np.ndarray, log_weights: Optional[np.ndarray] = None):
        const = -0.5 * (mu.shape[1] * LOG_2PI + np.log(sigma2).sum(axis=1))
        if log_weights is not None:
            const = const + log_weights
        self.references = mu
        self._params = _Parameters(mu=mu, const=const, neg_half_precision=-0.5 / sigma2)

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, CentredBlock]:
        """The log-joint and the block's differences, which the M-step sums next."""
        p = self._params.on(enc.device)
        block = centred(enc, self.references, p["mu"])
        d = block.d
        if d.shape[1] == 1:  # 1-D: c + (-1/(2σ²))·d·d, one fused pass after the scaling
            lp = torch.addcmul(p["const"][:, None], d[:, 0], d[:, 0] * p["neg_half_precision"])
        else:
            lp = torch.bmm(p["neg_half_precision"][:, None, :], d * d)[:, 0].add_(p["const"][:, None])
        return lp, block

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]


class FullKernel:
    """``enc -> (K, N)`` log w_k + log p_k(x) of full-covariance Gaussians: ``c_k - ½‖Uₖᵀ(x -
    μ_k)‖²`` with ``Σ_k⁻¹ = U_k U_kᵀ`` (``prec_chol`` (K, D, D)); one batched product per block."""

    def __init__(self, mu: np.ndarray, prec_chol: np.ndarray, log_norm: np.ndarray,
                 log_weights: Optional[np.ndarray] = None):
        const = log_norm if log_weights is None else log_norm + log_weights
        self.references = mu
        self._params = _Parameters(mu=mu, whiten=np.transpose(prec_chol, (0, 2, 1)), const=const)

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, CentredBlock]:
        p = self._params.on(enc.device)
        block = centred(enc, self.references, p["mu"])
        z = torch.bmm(p["whiten"], block.d)
        lp = z.square_().sum(dim=1).mul_(-0.5).add_(p["const"][:, None])
        return lp, block

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]


def block_sums(block: CentredBlock, weights: torch.Tensor, full: bool) -> np.ndarray:
    """``(K, 1 + D + S)`` rows ``[Σw, Σw·d, Σw·d²]`` (diagonal, S = D) or ``[Σw, Σw·d,
    Σw·ddᵀ]`` (full, S = D²) for weights (K, n), on the block's device: the weighted
    differences ``w·d`` once, then one sum and one product per component (no row of ones, no
    weighted squares kept); only the sums come back."""
    d = block.d
    k, dim = d.shape[0], d.shape[1]
    wd = d * weights[:, None, :]
    sums = torch.empty(k, 1 + dim + (dim * dim if full else dim), dtype=torch.float64, device=d.device)
    torch.sum(weights, dim=1, out=sums[:, 0])
    torch.sum(wd, dim=2, out=sums[:, 1 : 1 + dim])
    if full:
        sums[:, 1 + dim :] = torch.bmm(wd, d.transpose(1, 2)).reshape(k, dim * dim)
    else:
        sums[:, 1 + dim :] = torch.linalg.vecdot(wd, d, dim=2)
    return sums.cpu().numpy()


def weighted_sums(enc: PointEncoding, weights, references: np.ndarray, full: bool) -> np.ndarray:
    """:func:`block_sums` of all of ``enc`` about ``references`` (K, D) for weights ``None``
    (every observation weighs 1), (N,) (each reference alike) or (K, N)."""
    if weights is None:
        w = torch.ones(len(references), len(enc), dtype=torch.float64, device=enc.device)
    else:
        w = device_tensor(weights, enc.device)
        w = w.expand(len(references), -1) if w.ndim == 1 else w
    return block_sums(centred(enc, references), w, full)

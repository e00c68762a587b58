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
them, block by block, with ``(K, 2D+1, rows)`` temporaries sized to stay in cache.
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
    def row_width(self) -> int:
        """Floats per row and component that an E-step block keeps (sizes the blocks)."""
        return 2 * self.points.shape[0] + 1

    def rows(self, start: int, stop: int) -> "PointEncoding":
        return PointEncoding(self.points[:, start:stop])


def point_encoding(x: np.ndarray, device: torch.device) -> PointEncoding:
    """``x`` (N, D) as a :class:`PointEncoding` on ``device`` (only ``x`` crosses to it)."""
    return PointEncoding(float_tensor(x).to(device).T.contiguous())


@dataclass
class CentredBlock:
    """One block's differences to reference points, with a row of ones in front so that one
    weighted sum per component gives the weight too: ``rows`` (K, 1 + D, n) is ``[1; x -
    references[k]]``, and for the diagonal families (K, 1 + 2D, n) ``[1; d; d²]``."""

    references: np.ndarray
    rows: torch.Tensor

    @property
    def d(self) -> torch.Tensor:
        return self.rows[:, 1 : 1 + len(self.references[0])]

    @property
    def squares(self) -> torch.Tensor:
        return self.rows[:, 1 + len(self.references[0]) :]


class _Parameters:
    """Named float64 arrays, copied once to each device that asks for them."""

    def __init__(self, **arrays: np.ndarray):
        self._on = {CPU: {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)) for k, v in arrays.items()}}

    def on(self, device: torch.device) -> dict:
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = {k: v.to(device) for k, v in self._on[CPU].items()}
        return found


def centred(enc: PointEncoding, references: np.ndarray, squares: bool,
            mu: Optional[torch.Tensor] = None) -> CentredBlock:
    """The differences of ``enc``'s points to each of ``references`` (K, D) (and their squares)."""
    if mu is None:
        mu = torch.from_numpy(np.ascontiguousarray(references, dtype=np.float64)).to(enc.device)
    k, d = mu.shape
    rows = torch.empty(k, 1 + (2 * d if squares else d), enc.points.shape[1], dtype=torch.float64, device=enc.device)
    rows[:, 0] = 1.0
    torch.sub(enc.points[None], mu[:, :, None], out=rows[:, 1 : 1 + d])
    if squares:
        torch.mul(rows[:, 1 : 1 + d], rows[:, 1 : 1 + d], out=rows[:, 1 + d :])
    return CentredBlock(references, rows)


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
        block = centred(enc, self.references, True, p["mu"])
        if block.squares.shape[1] == 1:  # 1-D: one fused pass
            lp = torch.addcmul(p["const"][:, None], block.squares[:, 0], p["neg_half_precision"])
        else:
            lp = torch.bmm(p["neg_half_precision"][:, None, :], block.squares)[:, 0].add_(p["const"][:, None])
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
        block = centred(enc, self.references, False, p["mu"])
        z = torch.bmm(p["whiten"], block.d)
        lp = z.square_().sum(dim=1).mul_(-0.5).add_(p["const"][:, None])
        return lp, block

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]


def block_sums(block: CentredBlock, weights: torch.Tensor, full: bool) -> np.ndarray:
    """``(K, 1 + D + S)`` rows ``[Σw, Σw·d, Σw·d²]`` (diagonal, S = D) or ``[Σw, Σw·d,
    Σw·ddᵀ]`` (full, S = D²) for weights (K, n): one weighted sum or product per component,
    on the block's device; only the sums come back."""
    k, d = block.rows.shape[0], len(block.references[0])
    if not full:
        rows = block.rows if block.rows.shape[1] == 1 + 2 * d else centred_squares(block)
        return torch.linalg.vecdot(rows, weights[:, None, :], dim=2).cpu().numpy()
    rows = block.rows[:, : 1 + d]
    moments = torch.bmm(rows * weights[:, None, :], rows.transpose(1, 2))  # (K, 1+D, 1+D)
    return torch.cat([moments[:, 0], moments[:, 1:, 1:].reshape(k, d * d)], dim=1).cpu().numpy()


def centred_squares(block: CentredBlock) -> torch.Tensor:
    """``[1; d; d²]`` of a block that kept only ``[1; d]`` (a full kernel's, read by a diagonal family)."""
    return torch.cat([block.rows, block.d * block.d], dim=1)


def weighted_sums(enc: PointEncoding, weights, references: np.ndarray, full: bool) -> np.ndarray:
    """:func:`block_sums` of all of ``enc`` about ``references`` (K, D) for weights ``None``
    (every observation weighs 1), (N,) (each reference alike) or (K, N)."""
    if weights is None:
        w = torch.ones(len(references), len(enc), dtype=torch.float64, device=enc.device)
    else:
        w = device_tensor(weights, enc.device)
        w = w.expand(len(references), -1) if w.ndim == 1 else w
    return block_sums(centred(enc, references, not full), w, full)

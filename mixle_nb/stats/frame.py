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
- **One shared frame, when the components allow it** (the fast path): when every component
  mean lies within ``SHARED_FRAME_REACH`` of its own whitened units from the mean of the
  means ``c``, the differences ``y = x - c`` are made once per block (not once per
  component) with their squares or pairwise products, ``F = [y, y∘y]`` (D + D or
  D + D(D+1)/2 rows), and both steps are one matrix product each: ``log p = b + Bᵀ F`` with
  each component's quadratic form expanded about ``c`` in ``b, B``, and the sums ``F·wᵀ``
  about ``c``. Expanding a quadratic costs ``eps·T²`` of its digits, ``T`` a mean's whitened
  distance from ``c``: at most ~2e-11 here (absolute in log p, relative in a covariance).
  Components farther apart than that (1e4 spreads, say) take the per-component path.

The encoding is just the points, ``(D, N)`` on their device; the E-step keeps one pass over
them, block by block: the block's differences are made once and read by both steps (the
log-density, then the weighted sums ``Σw``, ``Σw·d`` and ``Σw·d·d``), with temporaries sized
to stay in cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .base import CPU, device_tensor, float_tensor

LOG_2PI = math.log(2.0 * math.pi)
# Largest whitened distance T of a component mean from the mean of the means for which the
# quadratic forms are expanded about that one point (eps·T² ≈ 2e-11 of their digits lost).
SHARED_FRAME_REACH = 300.0


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

    def sums(self, weights: torch.Tensor, full: bool) -> np.ndarray:
        """``(K, 1 + D + S)`` rows ``[Σw, Σw·d, Σw·d²]`` (diagonal, S = D) or ``[Σw, Σw·d,
        Σw·ddᵀ]`` (full, S = D²) for weights (K, n), on the block's device: the weighted
        differences ``w·d`` once, then one sum and one product per component; only the sums
        come back."""
        d = self.d
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


@dataclass
class SharedFrameBlock:
    """One block's features ``F = [y, y∘y]`` (D + S, n) of ``y = x - c`` about one point ``c``
    (every row of ``references``): ``S = D`` squares, or (``full``) the D(D+1)/2 products
    ``y_i·y_j``, i <= j."""

    references: np.ndarray
    features: torch.Tensor
    full: bool

    @property
    def y(self) -> torch.Tensor:
        return self.features[: self.references.shape[1]]

    def sums(self, weights: torch.Tensor, full: bool) -> np.ndarray:
        """:meth:`CentredBlock.sums` about ``c``, from one product ``w Fᵀ``."""
        dim = self.y.shape[0]
        if full and not self.full and dim > 1:  # no cross products here: a full estimator on a diagonal model
            return CentredBlock(self.references, self.y.expand(len(weights), -1, -1)).sums(weights, full)
        sums = torch.cat([weights.sum(dim=1, keepdim=True), torch.mm(weights, self.features.T)], dim=1).cpu().numpy()
        if dim == 1 or not (full or self.full):
            return sums
        upper = np.triu_indices(dim)
        if not full:  # a diagonal estimator on a full model: the squares among the products
            return np.concatenate([sums[:, : 1 + dim], sums[:, 1 + dim :][:, upper[0] == upper[1]]], axis=1)
        square = np.empty((len(sums), dim, dim))
        square[:, upper[0], upper[1]] = sums[:, 1 + dim :]
        square[:, upper[1], upper[0]] = sums[:, 1 + dim :]
        return np.concatenate([sums[:, : 1 + dim], square.reshape(len(sums), -1)], axis=1)


class _Parameters:
    """Named float64 arrays, copied once to each device that asks for them."""

    def __init__(self, **arrays: np.ndarray):
        self._on = {CPU: {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)) for k, v in arrays.items()}}

    def on(self, device: torch.device) -> dict:
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = {k: v.to(device) for k, v in self._on[CPU].items()}
        return found


def _shared_point(mu: np.ndarray, whitened_offsets) -> Optional[np.ndarray]:
    """The mean of the means ``c``, when ``whitened_offsets(c)`` ((K, D): each ``μ_k - c`` in
    its component's whitened units) stays within ``SHARED_FRAME_REACH``; else ``None``."""
    c = mu.mean(axis=0)
    reach = np.sqrt(np.max(np.sum(whitened_offsets(c) ** 2, axis=1)))
    return c if reach <= SHARED_FRAME_REACH else None


def shared_frame(enc: PointEncoding, c: np.ndarray, k: int, full: bool, c_on_device: torch.Tensor) -> SharedFrameBlock:
    """The block's :class:`SharedFrameBlock` about ``c``."""
    dim, n = enc.points.shape
    quadratic = dim * (dim + 1) // 2 if full else dim
    features = torch.empty(dim + quadratic, n, dtype=torch.float64, device=enc.device)
    y = torch.sub(enc.points, c_on_device[:, None], out=features[:dim])
    if full:
        row = dim
        for i in range(dim):
            torch.mul(y[i : i + 1], y[i:], out=features[row : row + dim - i])
            row += dim - i
    else:
        torch.mul(y, y, out=features[dim:])
    return SharedFrameBlock(np.broadcast_to(c, (k, dim)), features, full)


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
        self._c = _shared_point(mu, lambda c: (mu - c) / np.sqrt(sigma2))
        if self._c is None:
            self._params = _Parameters(mu=mu, const=const, neg_half_precision=-0.5 / sigma2)
        else:  # c_k - ½Σ p(y - m)² = (c_k - ½Σ p m²) + Σ (p m) y - ½Σ p y²
            m, precision = mu - self._c, 1.0 / sigma2
            self._params = _Parameters(c=self._c, const=const - 0.5 * np.sum(precision * m * m, axis=1),
                                       coefficients=np.concatenate([precision * m, -0.5 * precision], axis=1))

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, CentredBlock | SharedFrameBlock]:
        """The log-joint and the block's differences or features, which the M-step sums next."""
        p = self._params.on(enc.device)
        if self._c is not None:
            block = shared_frame(enc, self._c, len(self.references), False, p["c"])
            return torch.addmm(p["const"][:, None], p["coefficients"], block.features), block
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
        whiten = np.transpose(prec_chol, (0, 2, 1))
        self._c = _shared_point(mu, lambda c: np.einsum("kij,kj->ki", whiten, mu - c))
        if self._c is None:
            self._params = _Parameters(mu=mu, whiten=whiten, const=const)
        else:  # c_k - ½(y - m)ᵀP(y - m) = (c_k - ½mᵀPm) + (Pm)ᵀy - ½yᵀPy, P = UUᵀ
            m, precision = mu - self._c, prec_chol @ whiten
            pm = np.einsum("kij,kj->ki", precision, m)
            upper = np.triu_indices(mu.shape[1])
            quadratic = -precision[:, upper[0], upper[1]] * np.where(upper[0] == upper[1], 0.5, 1.0)
            self._params = _Parameters(c=self._c, const=const - 0.5 * np.sum(pm * m, axis=1),
                                       coefficients=np.concatenate([pm, quadratic], axis=1))

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, CentredBlock | SharedFrameBlock]:
        p = self._params.on(enc.device)
        if self._c is not None:
            block = shared_frame(enc, self._c, len(self.references), True, p["c"])
            return torch.addmm(p["const"][:, None], p["coefficients"], block.features), block
        block = centred(enc, self.references, p["mu"])
        z = torch.bmm(p["whiten"], block.d)
        lp = z.square_().sum(dim=1).mul_(-0.5).add_(p["const"][:, None])
        return lp, block

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]


def weighted_sums(enc: PointEncoding, weights, references: np.ndarray, full: bool) -> np.ndarray:
    """:meth:`CentredBlock.sums` of all of ``enc`` about ``references`` (K, D) for weights ``None``
    (every observation weighs 1), (N,) (each reference alike) or (K, N)."""
    if weights is None:
        w = torch.ones(len(references), len(enc), dtype=torch.float64, device=enc.device)
    else:
        w = device_tensor(weights, enc.device)
        w = w.expand(len(references), -1) if w.ndim == 1 else w
    return centred(enc, references).sums(w, full)

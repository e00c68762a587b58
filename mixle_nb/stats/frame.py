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
  means ``c``, the features ``F = [1, y, y∘y]`` of ``y = x - c`` (1 + D + D or 1 + D +
  D(D+1)/2 rows: the squares, or the pairwise products) are made once per block, not once per
  component, and both steps are one matrix product each: ``log p = Bᵀ F`` with each
  component's quadratic form expanded about ``c`` in ``B``, and the sums ``w Fᵀ`` about ``c``.
  Expanding a quadratic costs ``eps·T²`` of its digits, ``T`` a mean's whitened distance from
  ``c``: at most ~2e-11 here (absolute in log p, relative in a covariance). Components farther
  apart than that (1e4 spreads, say) take the per-component path.
- **Features made once** (full covariance, D <= ``STORED_FEATURES_MAX_DIM``): the encoding
  keeps ``F`` of ``y = x - o`` about its own ``origin`` ``o`` (the mean of its points, rounded
  to a power of two within their spread, so that ``y`` is exact), and a step only reads them,
  as the raw-moment encoding read its ``[1, x, xxᵀ]``. A model whose means all lie within
  ``SHARED_FRAME_REACH`` of ``o`` expands about ``o`` (the same ``eps·T²`` bound), and the
  sums about ``o`` move once an E-step to the model's ``c``, the point every rank shares (each
  shard has its own ``o``), at the same cost in digits; otherwise ``F`` is made per block about ``c``.

The encoding is the points, ``(D, N)`` on their device (and the full family's features); the
E-step keeps one pass over them, block by block: what a block's log-density read (its
differences or features) the M-step's weighted sums ``Σw``, ``Σw·d``, ``Σw·d·d`` read next,
and the sums stay on the device until the E-step's last block.

- **A float32 E-step** (an estimator's ``dtype="float32"``): the encoding holds ``x - o`` in
  float32 (``o`` its float64 origin, subtracted before the rounding, so offsets cost nothing),
  the kernels take their parameters in that frame (every point they subtract is exact there:
  :meth:`PointEncoding.relative`) and compute log-densities and responsibilities in float32,
  and the sums are float64 (:func:`float64_products`); the shared frame's reach is
  ``FLOAT32_SHARED_FRAME_REACH``. See the numerics guide for its tolerances.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .base import CPU, device_tensor, float_tensor

LOG_2PI = math.log(2.0 * math.pi)
# Largest whitened distance T of a component mean from the mean of the means for which the
# quadratic forms are expanded about that one point (eps·T² ≈ 2e-11 of their digits lost).
SHARED_FRAME_REACH = 300.0
# The same in a float32 E-step: eps·T² ≈ 1.1e-4 (eps = 1.2e-7), absolute in log p.
FLOAT32_SHARED_FRAME_REACH = 30.0
# A float64 E-step's terms exp(log p - peak) below exp(-700) = 9.9e-305 are taken as 0: the CPU
# makes exp below -708 (subnormal or underflowing results) 20-40x slower than elsewhere, and
# subnormal responsibilities make every product they join as slow; separated components put
# most terms there. A term of at most 9.9e-305 of its observation's largest changes no sum.
FLOAT64_EXP_FLOOR = -700.0
# Rows a float32 E-step's products sum over in float32 before the partial sums add up in float64.
SUM_RUN = 256
# Up to this dimension a full-covariance encoding keeps its features, 1 + D + D(D+1)/2 floats
# a point (45 at D = 8); above it they are made per block, so memory stays O(N·D).
STORED_FEATURES_MAX_DIM = 16


@dataclass(frozen=True, eq=False)
class PointEncoding:
    """Observations as the columns of ``values`` (D, N), contiguous on their device, in the
    encoding's dtype: the points themselves (float64, ``offset`` ``None``) or, in float32, their
    differences ``x - offset`` to a float64 ``offset`` (:func:`point_encoding`). A full family's
    (``framed``) has an :attr:`origin` and :attr:`features` (1 + D + D(D+1)/2, N) of
    ``y = x - origin`` (:func:`frame_features`), each made on first use and kept (in
    ``stored_origin``, ``stored_features``); ``weights`` (N,), where given, are the rows'
    float64 sample weights (:func:`with_weights`)."""

    values: torch.Tensor
    stored_origin: np.ndarray | None = None
    stored_features: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    offset: np.ndarray | None = None
    framed: bool = False

    @property
    def origin(self) -> np.ndarray | None:
        """The point a framed encoding's features are about (:func:`_origin` of its points; a
        float32 one's ``offset``), else ``None``: made at the first call and kept (encoding 100
        points at D = 8 took 122 us when it was made at once, 32 us now)."""
        if self.stored_origin is None and self.framed:
            object.__setattr__(self, "stored_origin", _origin(self.values).cpu().numpy())
        return self.stored_origin

    @property
    def features(self) -> torch.Tensor | None:
        """The features about ``origin`` where the encoding has one, else ``None``: made at the
        first call and kept. The local steps never read them (or the origin), so a fit of a few
        hundred points does not make them (at N = 100, D = 8 they were 50 of a fit's 1,100 us)."""
        origin = self.origin
        if self.stored_features is None and origin is not None:
            # float32 values are already x - offset (= origin); float64 ones the points themselves
            point = None if self.offset is not None else torch.from_numpy(origin).to(self.device)
            object.__setattr__(self, "stored_features", frame_features(self.values, point, True))
        return self.stored_features

    def __len__(self) -> int:
        return self.values.shape[1]

    @property
    def points(self) -> torch.Tensor:
        """The observations (D, N) in float64: ``values`` themselves, or (float32) a float64
        copy of ``values + offset`` made on each call (the k-means starts read it once)."""
        if self.offset is None:
            return self.values
        offset = torch.from_numpy(self.offset).to(self.values.device)
        return self.values.to(torch.float64).add_(offset[:, None])

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the E-step's arithmetic on this encoding (float64 or float32)."""
        return self.values.dtype

    @property
    def dim(self) -> int:
        return self.values.shape[0]

    @property
    def row_width(self) -> int:
        """Floats per row and component of an E-step block's temporaries (sizes device blocks)."""
        return 2 * self.values.shape[0] + 1

    def rows(self, start: int, stop: int) -> PointEncoding:
        features = None if self.features is None else self.features[:, start:stop]  # made once, not per block
        weights = None if self.weights is None else self.weights[start:stop]
        return PointEncoding(self.values[:, start:stop], self.origin, features, weights, self.offset, self.framed)

    def relative(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Points (..., D) in this encoding's frame: ``(exact, shifted)``, where ``shifted`` is
        ``points - offset`` rounded to the encoding's dtype (what its kernels subtract) and
        ``exact = offset + shifted`` in float64, the point those differences are really to."""
        points = np.asarray(points, dtype=np.float64)
        if self.offset is None:
            return points, points
        shifted = (points - self.offset).astype(np.float32).astype(np.float64)
        return self.offset + shifted, shifted


def with_weights(enc: PointEncoding, weights: np.ndarray) -> PointEncoding:
    """``enc`` whose rows carry the sample ``weights`` (N,), placed on its device: every E-step,
    count and k-means start then weighs each row by its weight."""
    return replace(enc, weights=float_tensor(weights).to(enc.device))


def point_encoding(
    x: np.ndarray, device: torch.device, products: bool = False, dtype: torch.dtype = torch.float64
) -> PointEncoding:
    """``x`` (N, D) as a :class:`PointEncoding` on ``device`` (only ``x`` crosses to it); with
    ``products`` (a full family's), up to ``STORED_FEATURES_MAX_DIM``, framed: its
    :func:`_origin`, and its features about it, are made when first asked. In float32 the
    values are ``x - o`` about that origin ``o``, made now (``x - o`` exact in float64, then
    rounded once), so the data's offset costs no digits: only their extent in units of their
    spread does."""
    points = float_tensor(x).to(device).T.contiguous()
    dim, n = points.shape
    stored = products and n and dim <= STORED_FEATURES_MAX_DIM
    if dtype == torch.float64:
        return PointEncoding(points, framed=bool(stored))  # the origin made when first asked
    origin = _origin(points) if n else torch.zeros(dim, dtype=torch.float64, device=device)
    offset = origin.cpu().numpy()
    values = torch.sub(points, origin[:, None]).to(dtype)
    if not stored:
        return PointEncoding(values, offset=offset)
    return PointEncoding(values, offset, offset=offset, framed=True)


def encoding_dtype(dtype: Any) -> torch.dtype:
    """An estimator's ``dtype=`` as a torch dtype: float64 (``None``, the default) or float32,
    given as a torch dtype, a numpy dtype or type, or its name."""
    if dtype is None:
        return torch.float64
    if isinstance(dtype, torch.dtype):
        name: str | None = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in ("float32", "float64"):
        raise ValueError(
            f"dtype must be float64 (the default) or float32 (torch.float32, np.float32 or 'float32'); got {dtype!r}"
        )
    return torch.float32 if name == "float32" else torch.float64


def in_dtype(encoder: Any, dtype: torch.dtype) -> Any:
    """A copy of one of our Gaussian encoders that encodes in ``dtype`` (a mixture's ``dtype=``)."""
    if not hasattr(encoder, "dtype"):
        raise ValueError(
            f"dtype= takes components of our Gaussian families; {type(encoder).__name__} encodes in its own "
            "dtype: leave the mixture's dtype unset"
        )
    copied = copy.copy(encoder)
    copied.dtype = dtype
    return copied


def _origin(points: torch.Tensor) -> torch.Tensor:
    """The points' mean, each coordinate rounded to a multiple of a power of two within its
    spread: ``x - origin`` is then exact for data far from 0 compared with their spread (and
    round numbers stay round, as a collapsed component's)."""
    mean, spread = points.mean(dim=1), points.std(dim=1, correction=0)
    step = torch.ldexp(torch.ones_like(spread), torch.frexp(spread).exponent - 1)
    return torch.where(spread > 0, torch.round(mean / step) * step, mean)


def frame_features(points: torch.Tensor, point: torch.Tensor | None, full: bool) -> torch.Tensor:
    """``F = [1, y, y∘y]`` (1 + D + S, n) of ``y = points - point`` (``points`` themselves when
    ``point`` is ``None``): S = D squares or (``full``) the D(D+1)/2 products ``y_i·y_j``, i <= j.
    The row of ones makes the log-density's constant and the sum of the weights part of the
    products."""
    dim, n = points.shape
    quadratic = dim * (dim + 1) // 2 if full else dim
    features = torch.empty(1 + dim + quadratic, n, dtype=points.dtype, device=points.device)
    features[0] = 1.0
    y = features[1 : 1 + dim]
    if point is None:
        y.copy_(points)
    else:
        torch.sub(points, point[:, None], out=y)
    if full:
        row = 1 + dim
        for i in range(dim):
            torch.mul(y[i : i + 1], y[i:], out=features[row : row + dim - i])
            row += dim - i
    else:
        torch.mul(y, y, out=features[1 + dim :])
    return features


@functools.lru_cache(maxsize=64)
def upper_indices(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(dim)``, made once per dimension (an M-step and a kernel ask every step)."""
    rows, cols = np.triu_indices(dim)
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


def moved(n: ArrayLike, s1: np.ndarray, s2: np.ndarray, delta: np.ndarray, full: bool) -> tuple[np.ndarray, np.ndarray]:
    """``S1, S2`` about ``c - delta`` from those about ``c``: ``x - (c - δ) = (x - c) + δ``;
    leading axes (components) broadcast, S2 (..., D, D) when ``full``."""
    n = np.asarray(n)[..., None]
    if full:
        cross = s1[..., :, None] * delta[..., None, :]
        square = delta[..., :, None] * delta[..., None, :]
        return s1 + n * delta, s2 + cross + np.swapaxes(cross, -1, -2) + n[..., None] * square
    return s1 + n * delta, s2 + 2.0 * delta * s1 + n * delta * delta


# The sums of few weight rows over many points are the one shape where torch's float64 product
# was the faster (one thread, 8,192 points, the CPU of :func:`matmul`): 8 x 545 sums 3.4 against
# 4.5 ms, 32 x 65 1.0 against 1.1, 64 x 64 1.7 against 1.8; from 128 rows (the banded scatter's
# scaled copies, K·stop of them) numpy's: 128 x 16 1.1 against 1.3 ms, 512 x 16 5.6 against 6.4.
NUMPY_SUMS_MIN_ROWS = 128


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``, of matrices or batches of them: float64 operands on the CPU, with torch on one
    thread, by numpy's BLAS (OpenBLAS); all others by torch's.

    Why: on the AMD EPYC CPU this was measured on, torch's float64 products (Intel's MKL) took
    1.3-1.7x numpy's at the E- and M-step's shapes (one thread: a 1,000 x 64 block times a
    64 x 64 factor 238 against 180 us, 8,000 rows 2.1 against 1.4 ms), but for the sums of few
    weight rows over many points (:func:`float64_products` keeps torch's there); float32 ones
    were within 8% either way, so they stay torch's. With more threads the two libraries' thread
    pools, each waiting busily for its next task, took the cores from each other (a full step at
    N = 1e5, D = 32, K = 2 took 6x its one-thread time at two). The result shares numpy's memory,
    no copy; as with torch's, infinities and NaN pass through without a warning.
    """
    cpu_float64 = a.dtype == b.dtype == torch.float64 and a.device.type == b.device.type == "cpu"
    if cpu_float64 and torch.get_num_threads() == 1:
        with np.errstate(all="ignore"):
            return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return torch.matmul(a, b)


def float64_products(weights: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``weights @ features.T`` ((K, n) by (S, n): the sums ``Σ w·F``) accumulated in float64.

    float64 operands: one product, numpy's (:func:`matmul`) from ``NUMPY_SUMS_MIN_ROWS`` weight
    rows on, else torch's. float32 ones (a float32 E-step's responsibilities and features):
    each run of ``SUM_RUN`` rows is summed in float32 by one batched product, and the runs'
    partial sums are added in float64 (the rows past the last whole run widened first): measured
    9e-9 relative against exact sums of the same float32 numbers, where one float32 product over
    a 65,536-row block is off by 7e-7, and at float32's speed (float64 operands would take a
    conversion pass and a product at half the rate).
    """
    if weights.dtype == features.dtype == torch.float32:
        runs = weights.shape[1] // SUM_RUN
        whole = runs * SUM_RUN
        rest = torch.mm(weights[:, whole:].to(torch.float64), features[:, whole:].to(torch.float64).T)
        if not runs:
            return rest
        w = weights[:, :whole].unflatten(1, (runs, SUM_RUN)).permute(1, 0, 2)
        f = features[:, :whole].unflatten(1, (runs, SUM_RUN)).permute(1, 2, 0)
        return torch.bmm(w, f).sum(dim=0, dtype=torch.float64).add_(rest)
    weights, features = weights.to(torch.float64), features.to(torch.float64)
    if len(weights) >= NUMPY_SUMS_MIN_ROWS:
        return matmul(weights, features.T)
    return torch.mm(weights, features.T)


class _Block:
    """An E-step block's M-step sums: :meth:`device_sums` add up over blocks on the device,
    :meth:`rows` turns their total into the accumulators' ``[Σw, S1, S2]`` about ``references``.
    The sums are float64 whatever the E-step's dtype (a float32 block's: see :func:`float64_products`
    and :meth:`CentredBlock.device_sums`)."""

    def device_sums(self, weights: torch.Tensor, full: bool) -> torch.Tensor:
        raise NotImplementedError

    def rows(self, total: torch.Tensor, full: bool) -> np.ndarray:
        raise NotImplementedError

    def sums(self, weights: torch.Tensor, full: bool) -> np.ndarray:
        return self.rows(self.device_sums(weights, full), full)


@dataclass
class CentredBlock(_Block):
    """One block's differences ``d`` (K, D, n) to reference points ``references`` (K, D)."""

    references: np.ndarray
    d: torch.Tensor

    def device_sums(self, weights: torch.Tensor, full: bool) -> torch.Tensor:
        """``(K, 1 + D + S)`` rows ``[Σw, Σw·d, Σw·d²]`` (diagonal, S = D) or ``[Σw, Σw·d,
        Σw·ddᵀ]`` (full, S = D²) for weights (K, n), on the block's device: the weighted
        differences ``w·d`` once, then one sum and one product per component; a float32 block's
        differences and weights widened to float64 first (components this far apart are rare)."""
        d, weights = self.d.to(torch.float64), weights.to(torch.float64)
        k, dim = d.shape[0], d.shape[1]
        wd = d * weights[:, None, :]
        sums = torch.empty(k, 1 + dim + (dim * dim if full else dim), dtype=torch.float64, device=d.device)
        torch.sum(weights, dim=1, out=sums[:, 0])
        torch.sum(wd, dim=2, out=sums[:, 1 : 1 + dim])
        if full:
            sums[:, 1 + dim :] = matmul(wd, d.transpose(1, 2)).reshape(k, dim * dim)
        else:
            sums[:, 1 + dim :] = torch.linalg.vecdot(wd, d, dim=2)
        return sums

    def rows(self, total: torch.Tensor, full: bool) -> np.ndarray:
        return total.cpu().numpy()


@dataclass
class SharedFrameBlock(_Block):
    """One block's features ``F = [1, y, y∘y]`` (1 + D + S, n) of ``y = x - origin``
    (:func:`frame_features`; ``full``: with the cross products); its sums go to the
    accumulators about the model's ``c``, every row of ``references``."""

    references: np.ndarray
    features: torch.Tensor
    full: bool
    origin: np.ndarray

    def device_sums(self, weights: torch.Tensor, full: bool) -> torch.Tensor:
        """``[Σw, Σw·y, Σw·y∘y] = w Fᵀ`` (K, 1 + D + S) about ``origin``, one product; a full
        estimator on a diagonal model's block makes the cross products first."""
        dim = len(self.origin)
        features = self.features
        if full and not self.full and dim > 1:
            features = frame_features(features[1 : 1 + dim], None, True)
        return float64_products(weights, features)

    def rows(self, total: torch.Tensor, full: bool) -> np.ndarray:
        """:meth:`CentredBlock.sums`'s rows about ``c`` from the total of :meth:`device_sums`."""
        sums = total.cpu().numpy()
        dim = len(self.origin)
        n, s1, s2 = sums[:, 0], sums[:, 1 : 1 + dim], sums[:, 1 + dim :]
        if dim > 1 and (full or self.full):
            upper = upper_indices(dim)
            if full:
                square = np.empty((len(sums), dim, dim))
                square[:, upper[0], upper[1]] = s2
                square[:, upper[1], upper[0]] = s2
                s2 = square
            else:  # a diagonal estimator on a full model: the squares among the products
                s2 = s2[:, upper[0] == upper[1]]
        c = self.references[0]
        if not np.array_equal(self.origin, c):  # the encoding's own origin: to the model's point
            s1, s2 = moved(n, s1, s2, self.origin - c, full and dim > 1)
        return np.concatenate([n[:, None], s1, s2.reshape(len(sums), -1)], axis=1)


class ComponentParameters:
    """Named float64 arrays, copied once to each device and dtype that asks for them."""

    def __init__(self, **arrays: np.ndarray):
        host = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)) for k, v in arrays.items()}
        self._on = {(CPU, torch.float64): host}

    def on(self, device: torch.device, dtype: torch.dtype = torch.float64) -> dict:
        found = self._on.get((device, dtype))
        if found is None:
            host = self._on[(CPU, torch.float64)]
            found = self._on[(device, dtype)] = {k: v.to(device=device, dtype=dtype) for k, v in host.items()}
        return found


def shared_point(
    mu: np.ndarray, whitened_offsets: Callable[[np.ndarray], np.ndarray], dtype: torch.dtype
) -> np.ndarray | None:
    """The mean of the means ``c``, when ``whitened_offsets(c)`` ((K, D): each ``μ_k - c`` in
    its component's whitened units) stays within the dtype's reach (:func:`_reach`); else ``None``."""
    c = mu.mean(axis=0)
    reach = np.sqrt(np.max(np.sum(whitened_offsets(c) ** 2, axis=1)))
    return c if reach <= _reach(dtype) else None


def _reach(dtype: torch.dtype) -> float:
    """The shared frame's reach for an E-step in ``dtype``."""
    return SHARED_FRAME_REACH if dtype == torch.float64 else FLOAT32_SHARED_FRAME_REACH


class ComponentFrames:
    """A kernel's parameters for each frame an encoding asks for (its dtype and offset), made once."""

    def __init__(self, make: Callable[[PointEncoding], tuple]):
        self._make = make
        self._made: dict = {}

    def of(self, enc: PointEncoding) -> tuple:
        key = (enc.dtype, None if enc.offset is None else enc.offset.tobytes())
        found = self._made.get(key)
        if found is None:
            found = self._made[key] = self._make(enc)
        return found


def shared_frame(enc: PointEncoding, c: np.ndarray, k: int, full: bool, c_on_device: torch.Tensor) -> SharedFrameBlock:
    """The block's :class:`SharedFrameBlock` about ``c`` (exact in ``enc``'s frame, ``c_on_device``
    its shifted value there), its features made here."""
    return SharedFrameBlock(np.broadcast_to(c, (k, len(c))), frame_features(enc.values, c_on_device, full), full, c)


def centred(enc: PointEncoding, references: np.ndarray, mu: torch.Tensor | None = None) -> CentredBlock:
    """The differences of ``enc``'s points to each of ``references`` (K, D); without ``mu`` (their
    shifted values on the device) the references are first made exact in ``enc``'s frame
    (:meth:`PointEncoding.relative`), so the block's sums are about the points they name."""
    if mu is None:
        references, shifted = enc.relative(references)
        mu = torch.from_numpy(np.ascontiguousarray(shifted)).to(device=enc.device, dtype=enc.dtype)
    return CentredBlock(references, torch.sub(enc.values[None], mu[:, :, None]))


class DiagonalKernel:
    """``enc -> (K, N)`` log w_k + log p_k(x) of axis-aligned Gaussians (means ``mu`` (K, D),
    variances ``sigma2`` (K, D)): ``c_k - Σ_j (x_j - μ_kj)² / (2σ²_kj)``, in the encoding's dtype."""

    def __init__(self, mu: np.ndarray, sigma2: np.ndarray, log_weights: np.ndarray | None = None):
        const = -0.5 * (mu.shape[1] * LOG_2PI + np.log(sigma2).sum(axis=1))
        if log_weights is not None:
            const = const + log_weights
        self.references, self._sigma2, self._const = mu, sigma2, const
        self._c = self._shared_point(torch.float64)  # float64's, decided once
        self._frames = ComponentFrames(self._frame)

    def _shared_point(self, dtype: torch.dtype) -> np.ndarray | None:
        mu, sigma2 = self.references, self._sigma2
        return shared_point(mu, lambda c: (mu - c) / np.sqrt(sigma2), dtype)

    def _frame(self, enc: PointEncoding) -> tuple[np.ndarray | None, np.ndarray, ComponentParameters]:
        """``(c, references, parameters)`` in ``enc``'s frame: the shared point ``c`` and the
        expanded coefficients, or (``c`` ``None``) each component's mean and constants."""
        mu, sigma2 = self.references, self._sigma2
        c = self._c if enc.dtype == torch.float64 else self._shared_point(enc.dtype)
        if c is None:
            references, shifted = enc.relative(mu)
            return (
                None,
                references,
                ComponentParameters(mu=shifted, const=self._const, neg_half_precision=-0.5 / sigma2),
            )
        c, shifted = enc.relative(c)
        # c_k - ½Σ p(y - m)² = (c_k - ½Σ p m²) + Σ (p m) y - ½Σ p y²
        m, precision = mu - c, 1.0 / sigma2
        coefficients = np.concatenate(
            [(self._const - 0.5 * np.sum(precision * m * m, axis=1))[:, None], precision * m, -0.5 * precision], axis=1
        )
        return c, mu, ComponentParameters(c=shifted, coefficients=coefficients)

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, CentredBlock | SharedFrameBlock]:
        """The log-joint and the block's differences or features, which the M-step sums next."""
        c, references, parameters = self._frames.of(enc)
        p = parameters.on(enc.device, enc.dtype)
        if c is not None:
            block = shared_frame(enc, c, len(self.references), False, p["c"])
            return torch.mm(p["coefficients"], block.features), block
        differences = centred(enc, references, p["mu"])
        d = differences.d
        if d.shape[1] == 1:  # 1-D: c + (-1/(2σ²))·d·d, one fused pass after the scaling
            lp = torch.addcmul(p["const"][:, None], d[:, 0], d[:, 0] * p["neg_half_precision"])
        else:
            lp = torch.bmm(p["neg_half_precision"][:, None, :], d * d)[:, 0].add_(p["const"][:, None])
        return lp, differences

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]


class FullKernel:
    """``enc -> (K, N)`` log w_k + log p_k(x) of full-covariance Gaussians: ``c_k - ½‖Uₖᵀ(x -
    μ_k)‖²`` with ``Σ_k⁻¹ = U_k U_kᵀ`` (``prec_chol`` (K, D, D)); one batched product per block,
    or one product with the features, stored (about the encoding's origin) or made per block;
    in the encoding's dtype."""

    def __init__(
        self, mu: np.ndarray, prec_chol: np.ndarray, log_norm: np.ndarray, log_weights: np.ndarray | None = None
    ):
        self._const = log_norm if log_weights is None else log_norm + log_weights
        self.references = mu
        self._whiten = np.transpose(prec_chol, (0, 2, 1))
        self._precision = prec_chol @ self._whiten
        self._c = shared_point(mu, self._whitened_offsets, torch.float64)  # float64's, decided once
        self._frames = ComponentFrames(self._frame)
        self._about_origin: dict = {}  # an encoding's origin and dtype -> its expansion there, or None (out of reach)

    def _whitened_offsets(self, point: np.ndarray) -> np.ndarray:
        return np.einsum("kij,kj->ki", self._whiten, self.references - point)

    def _frame(self, enc: PointEncoding) -> tuple[np.ndarray | None, np.ndarray, ComponentParameters]:
        """``(c, references, parameters)`` in ``enc``'s frame (see :meth:`DiagonalKernel._frame`)."""
        c = self._c if enc.dtype == torch.float64 else shared_point(self.references, self._whitened_offsets, enc.dtype)
        if c is None:
            references, shifted = enc.relative(self.references)
            return None, references, ComponentParameters(mu=shifted, whiten=self._whiten, const=self._const)
        c, shifted = enc.relative(c)
        return c, self.references, ComponentParameters(c=shifted, **self._expanded(c))

    def _expanded(self, point: np.ndarray) -> dict:
        """c_k - ½(y - m)ᵀP(y - m) = (c_k - ½mᵀPm) + (Pm)ᵀy - ½yᵀPy about ``point``, P = UUᵀ."""
        m = self.references - point
        pm = np.einsum("kij,kj->ki", self._precision, m)
        upper = upper_indices(m.shape[1])
        quadratic = -self._precision[:, upper[0], upper[1]] * np.where(upper[0] == upper[1], 0.5, 1.0)
        const = self._const - 0.5 * np.sum(pm * m, axis=1)
        return dict(coefficients=np.concatenate([const[:, None], pm, quadratic], axis=1))

    def _stored_frame(self, origin: np.ndarray, device: torch.device, dtype: torch.dtype) -> dict | None:
        """The expansion about an encoding's ``origin`` (one that stores its features), on its
        ``device`` in its ``dtype``, when every mean is within the dtype's reach of that origin."""
        key = (origin.tobytes(), dtype)
        if key not in self._about_origin:
            reach = np.sqrt(np.max(np.sum(self._whitened_offsets(origin) ** 2, axis=1)))
            within = reach <= _reach(dtype)
            self._about_origin[key] = ComponentParameters(**self._expanded(origin)) if within else None
        found = self._about_origin[key]
        return None if found is None else found.on(device, dtype)

    def joint(self, enc: PointEncoding) -> tuple[torch.Tensor, CentredBlock | SharedFrameBlock]:
        c, references, parameters = self._frames.of(enc)
        p = parameters.on(enc.device, enc.dtype)
        if c is not None:
            features, origin = enc.features, enc.origin
            stored = None if features is None or origin is None else self._stored_frame(origin, enc.device, enc.dtype)
            if stored is not None and features is not None and origin is not None:
                block = SharedFrameBlock(np.broadcast_to(c, self.references.shape), features, True, origin)
                return matmul(stored["coefficients"], features), block
            block = shared_frame(enc, c, len(self.references), True, p["c"])
            return matmul(p["coefficients"], block.features), block
        differences = centred(enc, references, p["mu"])
        z = matmul(p["whiten"], differences.d)
        lp = z.square_().sum(dim=1).mul_(-0.5).add_(p["const"][:, None])
        return lp, differences

    def __call__(self, enc: PointEncoding) -> torch.Tensor:
        return self.joint(enc)[0]


def weighted_sums(
    enc: PointEncoding, weights: np.ndarray | torch.Tensor | None, references: np.ndarray, full: bool
) -> np.ndarray:
    """:meth:`CentredBlock.sums` of all of ``enc`` about ``references`` (K, D) for weights ``None``
    (every observation weighs 1), (N,) (each reference alike) or (K, N)."""
    if weights is None:
        w = torch.ones(len(references), len(enc), dtype=torch.float64, device=enc.device)
    else:
        w = device_tensor(weights, enc.device)
        w = w.expand(len(references), -1) if w.ndim == 1 else w
    return centred(enc, references).sums(w, full)

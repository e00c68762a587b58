"""Data-driven starts for Gaussian-family mixtures: k-means‖ (Bahmani et al., 2012) and
random data points, on local data or on shards spread over ranks.

Every function takes the rank's encoded ``chunks`` and an :class:`Exchange` (sums across
ranks and the statistics fold; :class:`SingleProcess` for local data), so this module knows
nothing of torch.distributed. The start ends with one hard-assignment M-step: each observation belongs
wholly to its nearest centre, and the mixture's own estimator turns those labels into a model,
so tying (``keys``, ``variance_key``, ``covariance_key``) and floors apply as in EM.

Collectives are few and small, all sums (cheaper than object gathers): the shared seed,
shard sizes and first-centre proposals, one per round for the candidates, the candidates'
weights, the root's reduction to K centres, one per Lloyd iteration, and the final
statistics fold. The model is identical on every rank, and depends only on the seed and the
world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from .base import CPU, Distribution, Estimator, random_source
from .estimation import m_step, sample_weights
from .frame import PointEncoding
from .fused_step import fused_labelled_estimate
from .mixture import MixtureAccumulator, block_rows, blocks

INITS = ("kmeans++", "random_from_data")
DISTANCE_BLOCK_ELEMENTS = 1 << 16  # centres × rows of one distance block (stays in cache)
# Data of at most this many rows on all ranks together start from k-means++ over every point and
# Lloyd iterations to convergence (scikit-learn's KMeans start) on the root, not from k-means‖:
# sampling candidates in rounds costs more than it saves there, and a converged start saves EM
# iterations. The points are gathered in rank order, so a rank holding none changes nothing.
SMALL_START_ROWS = 2048


class Exchange(Protocol):
    """What the start needs from the ranks; ``rank`` 0 is the root."""

    rank: int
    world: int

    def sum(self, numbers: Any) -> np.ndarray:
        """Element-wise sum of a float64 vector over the ranks, identical on every rank."""

    def fold(self, estimator: Estimator, count: float, acc: Any) -> float:
        """Combine every rank's statistics into ``acc``; returns the global count."""


class SingleProcess:
    """The :class:`Exchange` of one process holding all the data."""

    rank, world = 0, 1

    def sum(self, numbers: Any) -> np.ndarray:
        return np.array(numbers, dtype=np.float64)

    def fold(self, estimator: Estimator, count: float, acc: Any) -> float:
        return count


def encoded_points(enc: Any) -> torch.Tensor:
    """The observations of a Gaussian-family encoding as a (D, N) float64 view, on its device."""
    if isinstance(enc, PointEncoding):
        return enc.points
    raise ValueError(
        f"k-means starts need Gaussian-family data (vectors or numbers); got a "
        f"{type(enc).__name__} encoding. Use init='random'"
    )


def check_kmeans_estimator(estimator: Estimator, chunks: Sequence[Any]) -> int:
    """K of a mixture estimator whose components read the chunks' Gaussian encodings."""
    acc = estimator.accumulator_factory().make()
    if not isinstance(acc, MixtureAccumulator):
        raise ValueError(f"k-means starts are for mixtures; got {type(estimator).__name__}. Use init='random'")
    for enc in chunks:
        encoded_points(enc)
    return len(acc.accumulators)


class _Shard:
    """A rank's points, (D, N) per chunk. Distances are taken relative to an ``origin`` shared
    by every rank (the first centre), so data far from zero keep their precision: squared
    norms ``|x - origin|²`` are computed once, when the origin is set. Distances are taken on
    the encodings' device; centres, candidates and per-centre sums are small host arrays.
    ``weights``: each chunk's sample weights (``None``: every row weighs 1)."""

    def __init__(self, chunks: Sequence[Any]):
        self.points = [encoded_points(enc) for enc in chunks]
        self.weights = [sample_weights(enc) for enc in chunks]
        self.sizes = [x.shape[1] for x in self.points]
        self.dim = self.points[0].shape[0] if self.points else 0
        self.device = self.points[0].device if self.points else CPU
        self.origin: np.ndarray | None = None
        self.norms: list[torch.Tensor] | None = None

    def set_origin(self, origin: np.ndarray) -> None:
        self.origin = np.asarray(origin, dtype=np.float64)
        self.norms = [squared_norms(x, self.origin) for x in self.points]

    def frame(self) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The shared origin and each chunk's squared norms about it (set by :meth:`set_origin`)."""
        if self.origin is None or self.norms is None:
            raise RuntimeError("_Shard.set_origin() first: distances are taken about the shared origin")
        return self.origin, self.norms

    def nearest(self, centres: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per chunk, each point's squared distance to its nearest centre and that centre's index."""
        origin, norms = self.frame()
        return [_nearest(x, norm, centres, origin) for x, norm in zip(self.points, norms)]


def _host(weights: torch.Tensor | None) -> np.ndarray | None:
    """Sample weights as a host array (``None`` stays ``None``)."""
    return None if weights is None else weights.cpu().numpy()


def squared_norms(x: torch.Tensor, origin: np.ndarray) -> torch.Tensor:
    """``|x - origin|²`` of each column of ``x`` (D, N), by blocks whose temporaries stay in cache."""
    step = _distance_rows(x.device, len(origin))
    if x.device.type == "cpu":  # NumPy on the same memory: cheaper calls on small blocks
        points, host = x.numpy(), np.empty(x.shape[1])
        for start in range(0, x.shape[1], step):
            np.square(points[:, start : start + step] - origin[:, None]).sum(axis=0, out=host[start : start + step])
        return torch.from_numpy(host)
    shift = torch.from_numpy(origin).to(x.device)[:, None]
    out = torch.empty(x.shape[1], dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[1], step):
        torch.sum((x[:, start : start + step] - shift).square_(), dim=0, out=out[start : start + step])
    return out


def _distance_rows(device: torch.device, width: int) -> int:
    """Rows per distance block with ``width`` temporaries per row (in cache on the CPU)."""
    if device.type != "cpu":
        return block_rows(device, width)
    return max(256, DISTANCE_BLOCK_ELEMENTS // max(width, 1))


def _nearest(
    x: torch.Tensor, norms: torch.Tensor, centres: np.ndarray, origin: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centre by ``|x-o|² - 2 x·(c-o) + (2 o·(c-o) + |c-o|²)``: one product and one
    row-wise minimum per block of rows, ``|x-o|²`` (the same for every centre) added after
    the minimum. The product's rounding is relative to ``|o|·|c-o|``, not ``|x|²``. On the
    CPU the arithmetic runs in NumPy on views of the same memory (a tiny product costs a
    fraction of torch's call there); elsewhere in torch on the device."""
    shifted = np.ascontiguousarray(centres, dtype=np.float64) - origin
    const = 2.0 * shifted @ origin + (shifted * shifted).sum(axis=1)
    if x.device.type == "cpu":
        lowest, where = _nearest_on_host(x.numpy(), shifted, const)
        return torch.from_numpy(np.maximum(lowest + norms.numpy(), 0.0)), torch.from_numpy(where)
    c = torch.from_numpy(shifted).to(x.device)
    offset = torch.from_numpy(const).to(x.device)[None, :]
    rows = x.T  # (N, D)
    n = rows.shape[0]
    best = torch.empty(n, dtype=torch.float64, device=x.device)
    index = torch.empty(n, dtype=torch.long, device=x.device)
    step = _distance_rows(x.device, len(c))
    for start in range(0, n, step):
        stop = min(start + step, n)
        d2 = torch.addmm(offset, rows[start:stop], c.T, alpha=-2.0)
        torch.min(d2, dim=1, out=(best[start:stop], index[start:stop]))
    return best.add_(norms).clamp_(min=0.0), index


def _nearest_on_host(x: np.ndarray, shifted: np.ndarray, const: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_nearest`'s minimum of ``-2 x·(c-o) + const`` over the centres, and where, for
    the (D, N) host array ``x``, by blocks of columns: centre-major (K, block) distances, so
    the minimum runs along contiguous rows (a few centres' rows cost a fraction of per-row
    minima over N short rows)."""
    scaled, offset = -2.0 * shifted, const[:, None]  # scaling by -2 is exact
    n = x.shape[1]
    best = np.empty(n)
    index = np.empty(n, dtype=np.int64)
    step = _distance_rows(CPU, len(shifted))
    for start in range(0, n, step):
        stop = min(start + step, n)
        d2 = scaled @ x[:, start:stop]
        d2 += offset
        d2.argmin(axis=0, out=index[start:stop])
        d2.min(axis=0, out=best[start:stop])
    return best, index


def _slots(exchange: Exchange, local: np.ndarray) -> np.ndarray:
    """Every rank's equally long ``local`` vector, as rows in rank order, from one sum (each
    rank fills its own row and leaves zeros elsewhere: adding zeros is exact)."""
    rows = np.zeros((exchange.world, len(local)))
    rows[exchange.rank] = local
    return exchange.sum(rows.ravel()).reshape(exchange.world, len(local))


def _open(shard: _Shard, rng: np.random.Generator, exchange: Exchange) -> tuple[int, np.ndarray, np.ndarray]:
    """One sum: the root's seed (every later shared choice draws from it), every rank's shard
    size, and one observation each rank proposes for the first centre."""
    draw = int(rng.integers(0, 2**52))  # exact in float64
    size = sum(shard.sizes)
    proposal = np.zeros(shard.dim)
    if size:
        pick = int(np.random.default_rng([draw, 5, exchange.rank]).integers(0, size))
        proposal = _points_at(shard, np.array([size]), np.array([pick]), 0)[0]
    opened = _slots(exchange, np.concatenate([[draw, size], proposal]))
    return int(opened[0, 0]), opened[:, 1].astype(np.int64), opened[:, 2:]


def _points_at(shard: _Shard, sizes: np.ndarray, global_index: np.ndarray, rank: int) -> np.ndarray:
    """Rows of the global index (ranks' shards in rank order) as a (len, D) array holding this
    rank's points and zeros elsewhere; summing it over ranks gives the chosen points."""
    out = np.zeros((len(global_index), shard.dim))
    local = global_index - int(sizes[:rank].sum())
    rows = np.flatnonzero((local >= 0) & (local < sizes[rank]))
    if len(shard.points) == 1:
        out[rows] = _columns(shard.points[0], local[rows])
        return out
    starts = np.cumsum([0] + shard.sizes)
    chunk_of = np.searchsorted(starts, local[rows], side="right") - 1
    for chunk in np.unique(chunk_of):  # one copy from the device per chunk
        picked = rows[chunk_of == chunk]
        out[picked] = _columns(shard.points[chunk], local[picked] - starts[chunk])
    return out


def _columns(points: torch.Tensor, index: np.ndarray) -> np.ndarray:
    """Columns ``index`` of the (D, N) ``points`` as (len, D) host rows."""
    if points.device.type == "cpu":
        return points.numpy()[:, index].T
    return points[:, torch.from_numpy(index).to(points.device)].T.cpu().numpy()


def random_centres(shard: _Shard, k: int, seed: int, sizes: np.ndarray, exchange: Exchange) -> np.ndarray:
    """``k`` distinct observations drawn uniformly from all ranks' data (with repeats only if
    there are fewer than ``k``)."""
    total = int(sizes.sum())
    chosen = np.random.default_rng([seed, 1]).choice(total, size=k, replace=total < k)
    return exchange.sum(_points_at(shard, sizes, chosen, exchange.rank).ravel()).reshape(k, -1)


def kmeans_parallel_centres(
    shard: _Shard,
    k: int,
    seed: int,
    sizes: np.ndarray,
    proposals: np.ndarray,
    exchange: Exchange,
    *,
    rounds: int = 3,
    oversampling: float = 2.0,
) -> np.ndarray:
    """k-means‖ seeding: candidates sampled where the data live, reduced to ``k`` on the root.

    The first candidate is one rank's proposal, that rank chosen in proportion to its size.
    Each round every point joins with probability ``min(1, ℓ·d²/φ)``, ``ℓ = oversampling·k``,
    d² its squared distance to the candidates so far and φ their sum over all data, i.e. when
    ``u / d² < ℓ / φ`` for its uniform draw ``u``. A rank cannot know φ before the round's one
    exchange, so it sends its φ share and the points with the smallest ``u / d²`` that pass
    its own, looser ``ℓ / φ_rank``; every rank then keeps those under ``ℓ / φ``: exactly the
    sample above, unless more than ``4ℓ`` of one rank's points pass (then its ``4ℓ`` likeliest).
    Candidates are weighted by the points nearest them (one sum) and the root reduces them to
    ``k`` centres (greedy k-means++, weighted Lloyd) and sends them out (one sum).

    Rounds of ``ℓ = 2k``: Bahmani et al. used five, Spark MLlib defaults to two; on four
    Gaussians 6σ apart two rounds left a cluster without a candidate in 2 of 300 seeds, three
    in none, and five cost a third more time than three."""
    first = int(np.random.default_rng([seed, 3]).choice(len(sizes), p=sizes / sizes.sum())) if len(sizes) > 1 else 0
    candidates = proposals[[first]]
    shard.set_origin(candidates[0])
    nearest = shard.nearest(candidates)
    local_rng = np.random.default_rng([seed, 2, exchange.rank])
    ell = oversampling * k
    cap = int(math.ceil(4 * ell))
    for _ in range(rounds):
        # a row's cost is w·d², its sample weight times its squared distance
        costs = [d2 if w is None else d2 * w for (d2, _), w in zip(nearest, shard.weights)]
        local_cost = sum(float(c.sum()) for c in costs)
        # u / cost (inf at 0); u drawn on the host, so a seed gives the same start on any device
        ratio = [torch.from_numpy(local_rng.random(len(c))).to(c.device).div_(c) for c in costs]
        ratio_all = ratio[0] if len(ratio) == 1 else torch.cat(ratio) if ratio else torch.zeros(0, dtype=torch.float64)
        order = torch.nonzero(ratio_all * local_cost < ell).flatten()
        if len(order) > cap:
            order = order[torch.argsort(ratio_all[order])[:cap]]
        picked = _points_at(shard, sizes[exchange.rank : exchange.rank + 1], order.cpu().numpy(), 0)
        if exchange.world == 1:  # φ is this rank's: its passing points are the sample, no exchange
            cost, new = local_cost, picked
        else:
            sent = np.full((cap, 1 + shard.dim), np.inf)
            sent[: len(order), 0] = ratio_all[order].cpu().numpy()
            sent[: len(order), 1:] = picked
            received = _slots(exchange, np.concatenate([[local_cost], sent.ravel()]))
            cost = float(received[:, 0].sum())
            offers = received[:, 1:].reshape(-1, 1 + shard.dim)
            new = offers[offers[:, 0] * cost < ell, 1:]
        if cost <= 0.0:  # every point is a candidate already
            break
        if len(new) == 0:
            continue
        origin, norms = shard.frame()
        for i, (x, norm) in enumerate(zip(shard.points, norms)):
            d2_new, index_new = _nearest(x, norm, new, origin)
            d2, index = nearest[i]
            closer = d2_new < d2
            nearest[i] = (torch.where(closer, d2_new, d2), torch.where(closer, index_new + len(candidates), index))
        candidates = np.concatenate([candidates, new])
    counts = np.zeros(len(candidates))
    for (_, index), w in zip(nearest, shard.weights):
        counts += np.bincount(index.cpu().numpy(), weights=_host(w), minlength=len(candidates))
    weights = exchange.sum(counts)
    reduced = np.zeros((k, candidates.shape[1]))
    if exchange.rank == 0:
        reduced = reduce_candidates(candidates, weights, k, np.random.default_rng([seed, 4]))
    return exchange.sum(reduced.ravel()).reshape(k, -1)  # the root's centres, on every rank


def reduce_candidates(
    points: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator, lloyd_iterations: int = 20
) -> np.ndarray:
    """``k`` centres of weighted points: greedy k-means++ (the best of ``2 + log k`` draws per
    centre, as scikit-learn does), then weighted Lloyd iterations."""
    m = len(points)
    if m <= k:  # too few distinct candidates: repeat some
        return points[np.arange(k) % m].copy()
    trials = 2 + int(math.log(k))
    # squared distances as ‖a‖² + ‖b‖² - 2a·b about the candidates' mean: one product a centre
    origin = points.mean(axis=0)
    moved_points = points - origin
    norms = np.einsum("md,md->m", moved_points, moved_points)

    def distances(rows: np.ndarray) -> np.ndarray:  # (len(rows), m)
        return np.maximum(norms[rows, None] + norms[None, :] - 2.0 * (moved_points[rows] @ moved_points.T), 0.0)

    first = int(_draw(rng, weights, 1)[0])
    chosen = [first]
    d2 = distances(np.array([first]))[0]
    for _ in range(1, k):
        mass = weights * d2
        if mass.sum() <= 0:
            break
        tried = _draw(rng, mass, trials)
        options = np.minimum(d2[None, :], distances(tried))
        best = int(np.argmin(options @ weights))
        chosen.append(int(tried[best]))
        d2 = options[best]
    centres = points[chosen]
    if len(centres) < k:
        centres = centres[np.arange(k) % len(centres)]
    d = points.shape[1]
    weighted = (weights[:, None] * points).ravel()
    # the labels from ‖c‖² - 2 p·c about the candidates' mean (‖p‖² is the same for every centre):
    # one product instead of an (m, k, D) array of differences a pass
    previous = None
    for _ in range(lloyd_iterations):
        shifted = centres - origin
        label = np.argmin(np.einsum("kd,kd->k", shifted, shifted) - 2.0 * (moved_points @ shifted.T), axis=1)
        if previous is not None and np.array_equal(label, previous):
            break  # the same labels give the same means: the centres already are those
        mass = np.bincount(label, weights=weights, minlength=k)
        # every (centre, feature) sum in one bincount, each bin's terms in row order as one per feature would
        sums = np.bincount((label[:, None] * d + np.arange(d)).ravel(), weights=weighted, minlength=k * d)
        moved = np.where(mass[:, None] > 0, sums.reshape(k, d) / np.maximum(mass, 1e-300)[:, None], centres)
        if np.array_equal(moved, centres):
            break
        centres, previous = moved, label
    return centres


def _draw(rng: np.random.Generator, mass: np.ndarray, size: int) -> np.ndarray:
    """``size`` indices drawn in proportion to ``mass``: the draws ``rng.choice(len(mass), size,
    p=mass / mass.sum())`` makes, without its checks of ``p``."""
    cdf = np.cumsum(mass / mass.sum())
    cdf /= cdf[-1]
    return cdf.searchsorted(rng.random(size), side="right")


def lloyd(shard: _Shard, centres: np.ndarray, exchange: Exchange, iterations: int, tol: float = 1e-8) -> np.ndarray:
    """Lloyd iterations over every rank's data, one sum each; a centre that loses all its
    points stays where it was. Stops early once the centres move by at most ``tol`` relative
    to their spread."""
    k, d = centres.shape
    for _ in range(iterations):
        stats = np.zeros((k, d + 1))
        for x, w, (_, index) in zip(shard.points, shard.weights, shard.nearest(centres)):
            stats[:, 0] += np.bincount(index.cpu().numpy(), weights=_host(w), minlength=k)
            rows = x.T if w is None else x.T * w[:, None]
            sums = torch.zeros(k, d, dtype=torch.float64, device=x.device).index_add_(0, index, rows)
            stats[:, 1:] += sums.cpu().numpy()
        stats = exchange.sum(stats.ravel()).reshape(k, d + 1)
        mass = stats[:, :1]
        moved = np.where(mass > 0, stats[:, 1:] / np.where(mass > 0, mass, 1.0), centres)
        shift = float(((moved - centres) ** 2).sum())
        centres = moved
        if shift <= tol * tol * float(((centres - centres.mean(axis=0)) ** 2).sum()):
            break
    return centres


def model_from_centres(
    chunks: Sequence[Any], shard: _Shard, estimator: Estimator, centres: np.ndarray, exchange: Exchange
) -> Distribution:
    """The mixture estimated from hard labels: each observation wholly in its nearest centre's
    component, shared equally among centres that coincide (fewer distinct points than
    components), so that none is left empty. One pass and one fold; the same model on every rank."""
    acc = estimator.accumulator_factory().make()
    k = len(centres)
    count = 0.0
    if not isinstance(acc, MixtureAccumulator):
        raise TypeError(f"a k-means start needs our mixture estimator; got {type(estimator).__name__}")
    origin, chunk_norms = shard.frame()
    shares = _shares(centres)
    if exchange.world == 1 and len(chunks) == 1 and shares is None and shard.device.type == "cpu":  # one compiled pass
        labels = _nearest(encoded_points(chunks[0]), chunk_norms[0], centres, origin)[1].numpy()
        model = fused_labelled_estimate(chunks[0], estimator, centres, labels)
        if model is not None:
            return model
    for enc, norms in zip(chunks, chunk_norms):
        for start, stop, block in blocks(enc, k):
            _, index = _nearest(encoded_points(block), norms[start:stop], centres, origin)
            weights = sample_weights(block)
            if shares is None:
                resp = torch.zeros(k, stop - start, dtype=torch.float64, device=index.device)
                resp[index, torch.arange(stop - start, device=index.device)] = 1.0 if weights is None else weights
            else:
                resp = shares.to(index.device)[:, index]
                if weights is not None:
                    resp *= weights
            acc.seq_update_responsibilities(block, resp, references=centres)  # the same on every rank
            count += stop - start if weights is None else float(weights.sum())
    return m_step(estimator, exchange.fold(estimator, count, acc), acc)


def _shares(centres: np.ndarray) -> torch.Tensor | None:
    """``(K, K)``: column ``j`` spreads a point nearest centre ``j`` evenly over the centres
    equal to it; ``None`` when the centres are distinct (each point wholly its nearest's)."""
    same = (centres[:, None, :] == centres[None, :, :]).all(axis=2)
    count = same.sum(axis=0)
    if np.all(count == 1):
        return None
    return torch.from_numpy(same / count[None, :])


def kmeans_init(
    chunks: Sequence[Any],
    estimator: Estimator,
    rng: Any,
    exchange: Exchange,
    init: str = "kmeans++",
    *,
    lloyd_iterations: int = 1,
) -> Distribution:
    """A mixture start from centres: ``"kmeans++"`` (k-means‖ then ``lloyd_iterations`` Lloyd
    iterations over all the data; with at most ``SMALL_START_ROWS`` rows on all ranks together,
    weighted k-means++ over every point and Lloyd iterations to convergence) or
    ``"random_from_data"`` (``K`` observations drawn uniformly); then the hard-assignment
    M-step, whose means are one more Lloyd iteration's centres. Every rank passes its own chunks."""
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(map(repr, INITS))}; got {init!r}")
    from .hmm.model import HiddenMarkovEstimator  # here: the HMM family builds on this module

    if isinstance(estimator, HiddenMarkovEstimator):  # k-means over the states' observations
        from .hmm.starts import kmeans_states

        return kmeans_states(list(chunks), estimator, rng, exchange, init, lloyd_iterations=lloyd_iterations)
    k = check_kmeans_estimator(estimator, chunks)
    if not chunks:  # even an empty shard has an (empty) chunk, which tells D
        raise ValueError(f"rank {exchange.rank} holds no encoded chunk; give every rank at least one")
    shard = _Shard(chunks)
    seed, sizes, proposals = _open(shard, random_source(rng), exchange)
    if sizes.sum() == 0:
        raise ValueError("no observations to start from")
    if any(w is not None for w in shard.weights):  # rows that carry sample weights (on every rank alike)
        local = sum(float(w.sum()) for w in shard.weights if w is not None)
        if exchange.sum(np.array([local]))[0] <= 0:
            raise ValueError(
                f"Sample weights must contain at least one non-zero number: every row's weight is 0 "
                f"(on all {exchange.world} rank(s))"
            )
    if init == "random_from_data":
        centres = random_centres(shard, k, seed, sizes, exchange)
        shard.set_origin(centres[0])
    elif (small := _all_points_when_few(shard, sizes, exchange)) is not None:
        centres = np.zeros((k, shard.dim))
        if exchange.rank == 0:
            centres = reduce_candidates(*small, k, np.random.default_rng([seed, 4]))
        centres = exchange.sum(centres.ravel()).reshape(k, -1)  # the root's centres, on every rank
        shard.set_origin(centres[0])
    else:
        centres = kmeans_parallel_centres(shard, k, seed, sizes, proposals, exchange)
        centres = lloyd(shard, centres, exchange, lloyd_iterations)
    return model_from_centres(chunks, shard, estimator, centres, exchange)


def _all_points_when_few(shard: _Shard, sizes: np.ndarray, exchange: Exchange) -> tuple[np.ndarray, np.ndarray] | None:
    """Every rank's points (N, D), in rank order, and their row weights, on every rank, when all
    ranks together hold at most ``SMALL_START_ROWS`` rows (two sums); else ``None``."""
    total = int(sizes.sum())
    if total > SMALL_START_ROWS:
        return None
    points = exchange.sum(_points_at(shard, sizes, np.arange(total), exchange.rank).ravel()).reshape(total, shard.dim)
    weights = np.zeros(total)
    first = int(sizes[: exchange.rank].sum())
    own = [np.ones(n) if w is None else w.cpu().numpy() for n, w in zip(shard.sizes, shard.weights)]
    if own:
        weights[first : first + int(sizes[exchange.rank])] = np.concatenate(own)
    return points, exchange.sum(weights)

"""torchrun SPMD backend for distributed estimation.

Each rank encodes its shard once and keeps it resident; every EM step accumulates sufficient
statistics locally, folds them across ranks, key-ties them and runs the M-step, so every rank
ends with the identical model. Runs under ``torchrun``, any launcher that sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, or inside a group created beforehand
(as ``MixleCluster`` does on ipyparallel engines).
"""
from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..stats.base import Distribution, Estimator, as_generator
from ..stats.estimation import EMStep, accumulate, initial_weights, m_step
from ..stats.kmeans import kmeans_init
from ..stats.values import flatten_value, unflatten_value, value_layout
from ..validation import choice, fraction, positive_int
from .group import join_group
from .handle import HandleLifetime
from .rank_exchange import HandleExchange, map_shard

FOLDS = ("auto", "gather", "allreduce")
EXCHANGE_MAX_FLOATS = 1 << 18  # world × vector length; above it the fold uses all_reduce
POLL_S = 0.005  # how long a small fold polls before it blocks


@dataclass
class StepTimings:
    """What one rank spent on the last step."""

    shard: int
    e_step_s: float
    fold_s: float
    m_step_s: float


def _finish(work) -> None:
    """Wait for an async collective: poll for up to ``POLL_S``, yielding the core, then block.
    Waking a thread blocked in gloo costs about a millisecond on a busy machine, more than a
    small fold itself; the poll is bounded so a long wait for a slower rank burns no CPU."""
    deadline = time.perf_counter() + POLL_S
    while not work.is_completed() and time.perf_counter() < deadline:
        os.sched_yield()
    work.wait()


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def torchrun_out(root: int = 0):
    """``sys.stdout`` on the root rank, a discarded buffer elsewhere."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    return sys.stdout if rank == root else _Discard()


def _choose_encoder(estimator, model, encoder):
    if encoder is not None:
        return encoder
    if model is not None:
        return model.dist_to_encoder()
    if estimator is not None:
        return estimator.accumulator_factory().make().acc_to_encoder()
    raise ValueError("TorchRunEncodedData needs encoder=, model= or estimator= to encode the data")


def _split(shard: Any, parts: int) -> list:
    bounds = np.linspace(0, len(shard), parts + 1).astype(int)
    return [shard[a:b] for a, b in zip(bounds, bounds[1:])]


class TorchRunEncodedData(HandleLifetime):
    """Encoded-data handle sharded across torch.distributed ranks.

    ``data``: with ``root_only=False`` every rank passes the same full dataset and keeps
    ``data[rank::world]``; with ``root_only=True`` only the root needs real data and scatters
    the shards. ``sub_chunks`` encoded sub-chunks are kept per rank. ``root`` is the group rank
    that folds statistics on the gather path.

    Extensions: ``fold`` picks how statistics cross ranks. ``"allreduce"`` flattens every
    numeric statistic, the count and the log-density into one float64 tensor, sums it across
    ranks in one collective, and lets every rank run the deterministic M-step (no broadcast).
    ``"gather"`` is the reference path: pickle statistics to the root, fold there, broadcast
    the folded statistics (two object collectives, like the reference's gather + model
    broadcast). ``"auto"``
    takes the all-reduce whenever the statistics flatten identically on every rank (checked
    once per estimator). ``last_timings`` holds this rank's :class:`StepTimings`.
    """

    def __init__(
        self,
        data: Optional[Sequence],
        estimator: Optional[Estimator] = None,
        model: Optional[Distribution] = None,
        encoder: Any = None,
        sub_chunks: int = 1,
        group: Any = None,
        root: int = 0,
        root_only: bool = False,
        init_process_group: bool = True,
        backend: Optional[str] = None,
        *,
        fold: str = "auto",
    ):
        self.fold = choice("fold", fold, FOLDS)
        sub_chunks = positive_int("sub_chunks", sub_chunks)
        encoder = _choose_encoder(estimator, model, encoder)
        self._membership = join_group(group, init_process_group=init_process_group, backend=backend)
        self.group, self.rank, self.world = group, self._membership.rank, self._membership.world
        self.device = self._membership.device
        if not 0 <= root < self.world:
            raise ValueError(f"root must be a rank in [0, {self.world}); got {root}")
        self.root = root
        self._global_root = self._membership.global_rank(root)

        shard = self._scatter(data) if root_only else self._own_slice(data)
        self.chunks = [encoder.seq_encode(part) for part in _split(shard, sub_chunks)]
        self.local_count = sum(len(c) for c in self.chunks)
        self._count = int(self._sum_across_ranks([float(self.local_count)])[0])
        if self._count == 0:
            self.close()
            raise ValueError("TorchRunEncodedData got no observations on any rank")
        self._fold_choice: dict[int, tuple[Estimator, str, Any]] = {}
        self.last_timings: Optional[StepTimings] = None

    # -- set-up ------------------------------------------------------------------------------

    @staticmethod
    def _as_sliceable(data):
        if data is None:
            raise ValueError("data is None on a rank that needs it: pass the full data on every "
                             "rank, or use root_only=True and pass it on the root")
        return data if isinstance(data, np.ndarray) else np.asarray(data)

    def _own_slice(self, data):
        return self._as_sliceable(data)[self.rank :: self.world]

    def _scatter(self, data):
        if self.world == 1:
            return self._own_slice(data)
        shards = None
        if self.rank == self.root:
            full = self._as_sliceable(data)
            shards = [full[r :: self.world] for r in range(self.world)]
        received = [None]
        dist.scatter_object_list(received, shards, src=self._global_root, group=self.group)
        return received[0]

    # -- collectives -------------------------------------------------------------------------

    def _sum_across_ranks(self, numbers) -> np.ndarray:
        """Element-wise sum of a float64 vector over the ranks, bit-identical on every rank.

        Small vectors take one ``all_to_all`` exchange, after which each rank adds the
        world's vectors in rank order: one round of messages against the ring all-reduce's
        2·(world - 1), which is what a per-step fold of a few statistics waits on. Vectors
        whose exchange would move over ``EXCHANGE_MAX_FLOATS`` take ``all_reduce``."""
        if self.world == 1:
            return np.array(numbers, dtype=np.float64)
        local = torch.as_tensor(np.asarray(numbers, dtype=np.float64), device=self.device)
        if local.numel() * self.world > EXCHANGE_MAX_FLOATS:
            dist.all_reduce(local, group=self.group)
            return local.cpu().numpy()
        received = torch.empty(self.world, local.numel(), dtype=local.dtype, device=self.device)
        _finish(dist.all_to_all_single(received, local.repeat(self.world), group=self.group, async_op=True))
        total = received[0].clone()
        for row in received[1:]:
            total += row
        return total.cpu().numpy()

    def _fold_path(self, estimator: Estimator, value: Any) -> tuple[str, Any]:
        """Per estimator, once: all-reduce when every rank's statistics share one flat layout."""
        if self.fold == "gather":
            return "gather", None
        cached = self._fold_choice.get(id(estimator))
        if cached is not None and cached[0] is estimator:
            return cached[1], cached[2]
        layout = value_layout(value)
        layouts = [layout] * self.world
        if self.world > 1:
            dist.all_gather_object(layouts, layout, group=self.group)
        agreed = layout is not None and all(other == layout for other in layouts)
        if self.fold == "allreduce" and not agreed:
            raise ValueError("fold='allreduce' needs numeric statistics with the same layout on every "
                             f"rank; got {sorted(set(map(str, layouts)))}. Use fold='gather' or 'auto'")
        path = "allreduce" if agreed else "gather"
        self._fold_choice[id(estimator)] = (estimator, path, layout)
        return path, layout

    def _fold(self, estimator: Estimator, count: float, acc, log_density: float):
        """Combine every rank's statistics into ``acc`` on every rank; returns the global
        ``(count, log_density)``. Either path leaves bit-identical statistics on all ranks, so
        the M-step that follows is deterministic and needs no broadcast of the model."""
        value = acc.value()
        path, layout = self._fold_path(estimator, value)
        if path == "allreduce":
            flat = self._sum_across_ranks(np.concatenate([[count, log_density], flatten_value(value)]))
            acc.from_value(unflatten_value(flat[2:], layout))
            return float(flat[0]), float(flat[1])
        if self.world == 1:
            return count, log_density
        parts = [None] * self.world if self.rank == self.root else None
        dist.gather_object((count, log_density, value), parts, dst=self._global_root, group=self.group)
        message = [None]
        if self.rank == self.root:
            total = estimator.accumulator_factory().make()
            for _, _, value in parts:
                total.combine(value)
            message = [(sum(p[0] for p in parts), sum(p[1] for p in parts), total.value())]
        dist.broadcast_object_list(message, src=self._global_root, group=self.group)
        count, log_density, value = message[0]
        acc.from_value(value)
        return float(count), float(log_density)

    # -- the handle protocol -----------------------------------------------------------------

    def pysp_em_step(self, estimator: Estimator, prev_estimate: Distribution) -> EMStep:
        """One distributed EM step and the all-reduced log-density of ``prev_estimate``:
        one pass over the shard, one collective."""
        t0 = time.perf_counter()
        local = accumulate(self.chunks, estimator, prev_estimate)
        t1 = time.perf_counter()
        count, log_density = self._fold(estimator, local.count, local.accumulator, local.log_density)
        t2 = time.perf_counter()
        model = m_step(estimator, count, local.accumulator)
        self.last_timings = StepTimings(self.local_count, t1 - t0, t2 - t1, time.perf_counter() - t2)
        return EMStep(model, count, log_density)

    def pysp_seq_estimate(self, estimator: Estimator, prev_estimate: Distribution) -> Distribution:
        """One distributed EM step; every rank returns the identical model."""
        return self.pysp_em_step(estimator, prev_estimate).model

    def pysp_seq_initialize(self, estimator: Estimator, rng: Any, p: float) -> Distribution:
        """Distributed randomized initialization; identical model on all ranks.

        The root draws one seed per rank from ``rng`` and scatters them, so the result is
        reproducible for a given seed and world size, but differs from a one-process
        ``seq_initialize`` with the same seed (each rank draws its own subset).
        """
        p = fraction("initialisation fraction p", p)
        seeds = None
        if self.rank == self.root:
            seeds = [[int(s)] for s in as_generator(rng).integers(0, 2**63 - 1, size=self.world)]
        received = seeds[:1] if self.world == 1 else [None]
        if self.world > 1:
            dist.scatter_object_list(received, seeds, src=self._global_root, group=self.group)
        local_rng = np.random.default_rng(received[0][0])
        acc, included = estimator.accumulator_factory().make(), 0.0
        for enc in self.chunks:
            weights = initial_weights(len(enc), local_rng, p)
            acc.seq_initialize(enc, weights, local_rng)
            included += float(weights.sum())
        count, _ = self._fold(estimator, included, acc, float("nan"))
        return m_step(estimator, count, acc)

    def pysp_seq_log_density_sum(self, estimate: Distribution) -> tuple[float, float]:
        """Allreduced count and summed log density."""
        total = sum(float(np.sum(estimate.seq_log_density(c))) for c in self.chunks)
        count, total = self._sum_across_ranks([float(self.local_count), total])
        return float(count), float(total)

    def pysp_stream_accumulate(self, estimator: Estimator, model: Distribution) -> tuple[float, Any]:
        """Globally folded batch sufficient statistics for streaming EM (not yet key-tied)."""
        local = accumulate(self.chunks, estimator, model)
        count, _ = self._fold(estimator, local.count, local.accumulator, local.log_density)
        return count, local.accumulator

    def pysp_kmeans_init(self, estimator: Estimator, rng: Any, init: str = "kmeans++") -> Distribution:
        """A mixture start from k-means‖ (``"kmeans++"``) or random observations
        (``"random_from_data"``) run on the shards where they live; identical on every rank
        and reproducible for a seed and world size (mixle_nb/stats/kmeans.py)."""
        return kmeans_init(self.chunks, estimator, rng, HandleExchange(self), init)

    def pysp_shard_map(self, function, gather: bool = False) -> np.ndarray:
        """``function(enc)`` over this rank's shard; ``gather=True``: every observation's, in
        the original order, on every rank (mixle_nb/parallel/rank_exchange.py)."""
        return map_shard(self, function, gather)

    def close(self) -> None:
        """Release the resident shard; destroy the process group only if this handle made it."""
        self.chunks = []
        self._membership.release()

    def __len__(self) -> int:
        return self._count


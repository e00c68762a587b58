"""torchrun SPMD backend for distributed estimation.

Each rank encodes its shard once and keeps it resident; every EM step accumulates sufficient
statistics locally, folds them across ranks, key-ties them and runs the M-step, so every rank
ends with the identical model. Runs under ``torchrun``, any launcher that sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, or inside a group created beforehand
(as ``MixleCluster`` does on ipyparallel engines).

Any family that speaks the protocol works, ours or the real mixle package's: encodings are
opaque (counts come from the raw shard), every update gets a float64 weight array, and
statistic values may be any nesting of tuples, lists, dicts, arrays and numbers.

Fail together: every operation (construction, EM step, initialisation, log-density sum, stream
accumulate) carries a status word in the exchange it already makes, so a rank that raises makes
every rank raise at once — the failed rank its own error, the others
:class:`~mixle_nb.parallel.fail_together.PeerRankError` naming it — instead of leaving peers
waiting in a collective until the group timeout. The same exchange checks that every rank
holds the same data description, estimator and model.
"""
from __future__ import annotations

import io
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..stats.base import Distribution, Estimator
from ..stats.estimation import EMStep, accumulate, encode, log_density_total, m_step, takes_device, tie_keys
from ..stats.kmeans import kmeans_init
from ..stats.values import FoldPlan, flatten_value, fold_plan, value_layout
from ..validation import choice, device as checked_device, fraction, positive_int
from .fail_together import (agreed, agreement_slots, failure_message, fingerprint, odd_ones_out,
                            raise_failures)
from .group import join_group, require_every_rank
from .handle import HandleLifetime
from .rank_exchange import HandleExchange, map_shard
from .shards import (NpyRows, dealt_files, describe, describe_rows, empty_like_rows, file_parts, load_npy,
                     rank_slice, release_freed_memory, split_parts)

FOLDS = ("auto", "gather", "allreduce")
EXCHANGE_MAX_FLOATS = 1 << 18  # world × vector length; above it the fold uses all_reduce
POLL_S = 0.005  # how long a small fold polls before it blocks
SAME_DATA = ("pass the same full data on every rank (each keeps "
             "data[rank::world] of it), or root_only=True with the data on the root. Did you %mixle_scatter "
             "it? For data already split across ranks use TorchRunEncodedData.from_shards(shard, estimator=...)")
SAME_ROWS = "every rank's observations must have the same shape and dtype"
SAME_FILES = "every rank must pass the same path (or list of paths); each rank reads its own part of it"
SAME_MODEL = "every rank must pass the same model and estimator to the step"


@dataclass
class StepTimings:
    """What one rank spent on the last step."""

    shard: int
    e_step_s: float
    fold_s: float
    m_step_s: float


@dataclass(frozen=True)
class _AgreedFold:
    """How statistics of one estimator cross ranks, as all ranks agreed: ``plan`` is the
    all-reduce's :class:`FoldPlan`, ``None`` for the gather path."""

    estimator: str  # the estimator's fingerprint
    plan: Optional[FoldPlan]


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
    return estimator.accumulator_factory().make().acc_to_encoder()


class TorchRunEncodedData(HandleLifetime):
    """Encoded-data handle sharded across torch.distributed ranks.

    ``data``: any sequence of observations. With ``root_only=False`` every rank passes the same
    full dataset and keeps ``data[rank::world]`` (a numpy array stays an array; anything else —
    ragged sequences, tuples, strings, dicts — becomes a list of the observations as they are);
    with ``root_only=True`` only the root needs real data and scatters the shards.
    ``sub_chunks`` encoded sub-chunks are kept per rank. ``root`` is the group rank that folds
    statistics on the gather path. To let each rank read its own part from disk, see
    :meth:`from_npy` and :meth:`from_files`.

    Extensions: ``fold`` picks how statistics cross ranks. ``"allreduce"`` flattens every
    number of the statistics, the count and the log-density into one float64 tensor, sums it
    across ranks in one collective, and lets every rank run the deterministic M-step (no
    broadcast); numbers that ``combine`` keeps rather than adds (a hidden Markov model's state
    count) are put back. ``"gather"`` is the reference path: pickle statistics to the root,
    combine there, broadcast the folded statistics. ``"auto"`` takes the all-reduce whenever the
    statistics flatten to the same layout on every rank (agreed once per estimator; dict
    statistics, whose keys differ by rank, are gathered). ``last_timings`` holds this rank's
    :class:`StepTimings`.

    ``device``: where the encodings live and every E-step kernel runs (``"cpu"``, ``"cuda"``,
    ``"cuda:1"``, a ``torch.device``); ``None`` is the group's device: the rank's CUDA device
    under nccl, else the CPU. An encoder without ``device=`` (mixle's) encodes on the CPU. A
    device this rank cannot use fails on every rank together, before any data are read.

    Running EM on it (every rank runs the same call, e.g. in a ``%%mixle`` cell)::

        from mixle_nb.inference import fit, predict
        result = fit(h, est, init="kmeans++")        # or em_step(h, est, model) one step at a time
        labels = predict(h, result.model, gather=True)

    or step it from the notebook with ``EMPanel(handle="h", estimator="est", init="kmeans++")``.
    Data each rank already holds its own part of (after ``%mixle_scatter``): :meth:`from_shards`.
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
        device: Any = None,
    ):
        sub_chunks = self._join(estimator, model, encoder, sub_chunks, group, root, init_process_group,
                                backend, fold)
        error, shards, shard, signature = None, None, None, None
        try:  # whatever fails here is carried to the peers in the count exchange
            encoder = self._place(_choose_encoder(estimator, model, encoder), device)
            if root_only and self.rank == self.root:
                if data is None:
                    raise ValueError(f"root_only=True needs the data on the root (rank {self.root}), "
                                     "which got None: pass it there (other ranks may pass None)")
                shards = [rank_slice(data, r, self.world) for r in range(self.world)]
            elif not root_only:
                if data is None:
                    raise ValueError(f"data is None on rank {self.rank}: {SAME_DATA}")
                shard, signature = rank_slice(data, self.rank, self.world), describe(data)
        except Exception as exc:
            error = exc
        if root_only:
            shard = self._scatter(shards)
            signature = None if shard is None else describe_rows(shard)
        parts = () if shard is None else split_parts(shard, sub_chunks)
        self._encode(encoder, parts, None, signature, error, "the data", None if shard is None else shard[:0],
                     locate=lambda part, row, _: f"row {self.rank + self.world * row} of the data",
                     fix=SAME_ROWS if root_only else "rank {rank} holds other data: " + SAME_DATA)

    @classmethod
    def from_shards(cls, shard: Sequence, estimator: Optional[Estimator] = None,
                    model: Optional[Distribution] = None, encoder: Any = None, sub_chunks: int = 1,
                    group: Any = None, root: int = 0, init_process_group: bool = True,
                    backend: Optional[str] = None, *, interleaved: bool = True, fold: str = "auto",
                    device: Any = None) -> "TorchRunEncodedData":
        """A handle on data already split across ranks: each rank passes its own observations
        ``shard`` and keeps all of them (sizes may differ). This is the constructor for a
        sequence ``%mixle_scatter`` (or ``cluster.scatter``) dealt out, where rank ``r`` holds
        ``data[r::world]``; the constructor proper would keep ``shard[rank::world]`` of it.

        ``interleaved=True`` (the scatter's layout): per-observation results gathered with
        ``gather=True`` come back in the original order of the scattered sequence; ``False``:
        the shards are consecutive blocks, gathered back as rank 0's rows, then rank 1's, ...
        Ranks agree on the observations' shape and dtype; a rank with no observations of
        vector data passes an empty array of their shape (``np.empty((0, D))``), which is what
        a scatter of fewer rows than ranks gives it. Every other argument is as for the
        constructor."""
        self = cls.__new__(cls)
        sub_chunks = self._join(estimator, model, encoder, sub_chunks, group, root, init_process_group,
                                backend, fold)
        self.interleaved = bool(interleaved)
        error, parts, signature, empty = None, (), None, None
        try:
            encoder = self._place(_choose_encoder(estimator, model, encoder), device)
            if shard is None:
                raise ValueError(f"from_shards got None on rank {self.rank}: pass this rank's observations "
                                 "(an empty sequence if it has none)")
            shard = shard if isinstance(shard, np.ndarray) else rank_slice(shard, 0, 1)
            parts, signature, empty = split_parts(shard, sub_chunks), describe_rows(shard), shard[:0]
        except Exception as exc:
            error = exc
        self._encode(encoder, parts, None, signature, error, "the shard", empty,
                     locate=lambda part, row, _: f"row {row} of the shard passed on rank {self.rank}", fix=SAME_ROWS)
        return self

    @classmethod
    def from_npy(cls, path: Any, estimator: Optional[Estimator] = None, model: Optional[Distribution] = None,
                 encoder: Any = None, sub_chunks: int = 1, group: Any = None, root: int = 0,
                 init_process_group: bool = True, backend: Optional[str] = None, *,
                 fold: str = "auto", device: Any = None) -> "TorchRunEncodedData":
        """Each rank reads its own rows of the ``.npy`` file at ``path`` (a path every rank can
        open): rows ``rank, rank + world, ...``, the same shard — and so the same model (bit for
        bit in our 1-D test; to rounding where BLAS treats a strided view and a contiguous copy
        differently) — as the in-memory handle given the whole array.

        Why strided rows rather than a contiguous block: the shards, their order and so every
        result (per-observation scores gathered back in the original order included) are those
        of the in-memory handle, and the file is read part by part in blocks of at most 32 MB, so
        a rank holds its encoded shard, one raw part and one block. The cost is that every rank
        reads the whole file (from the page cache on one host). ``sub_chunks`` parts are read and
        encoded one after another: more parts, less raw data alive beside the encodings."""
        self = cls.__new__(cls)
        sub_chunks = self._join(estimator, model, encoder, sub_chunks, group, root, init_process_group,
                                backend, fold)
        error, parts, signature = None, (), None
        try:
            encoder = self._place(_choose_encoder(estimator, model, encoder), device)
            rows = NpyRows(path, self.rank, self.world)
            parts, signature, empty = rows.parts(sub_chunks), rows.describe(), rows.empty()
        except Exception as exc:
            error, empty = exc, None
        self._encode(encoder, parts, None, signature, error, "the file", empty,
                     locate=lambda part, row, _: f"row {self.rank + self.world * row} of {os.fspath(path)}",
                     fix=SAME_FILES)
        return self

    @classmethod
    def from_files(cls, paths: Sequence[Any], estimator: Optional[Estimator] = None,
                   model: Optional[Distribution] = None, encoder: Any = None, sub_chunks: int = 1,
                   group: Any = None, root: int = 0, init_process_group: bool = True,
                   backend: Optional[str] = None, *, reader: Callable[[str], Any] = load_npy,
                   fold: str = "auto", device: Any = None) -> "TorchRunEncodedData":
        """Files dealt out to ranks: rank ``r`` reads ``paths[r::world]`` with ``reader`` (default: a
        memory-mapped ``np.load``; any function from a path to a sequence of observations), one
        file at a time, each file encoded in ``sub_chunks`` parts. Every rank passes the same
        list. The model equals the in-memory handle's on the concatenated data up to the order
        of floating-point sums."""
        self = cls.__new__(cls)
        sub_chunks = self._join(estimator, model, encoder, sub_chunks, group, root, init_process_group,
                                backend, fold)
        error, parts, counts, sources, signature, empty = None, (), [], [], None, None
        try:
            encoder = self._place(_choose_encoder(estimator, model, encoder), device)
            names = [os.fspath(p) for p in paths]
            signature = f"the file list {names}"
            mine = dealt_files(names, self.rank, self.world)
            parts = file_parts(mine, reader, sub_chunks, counts, sources)
            if not mine and names:  # an empty rank: the first file's kind of row, so every step works
                empty = empty_like_rows(reader(names[0]))
        except Exception as exc:
            error = exc
        self._encode(encoder, parts, counts, signature, error, "the file list", empty,
                     locate=lambda part, _, row: f"row {sources[part][1] + row} of {sources[part][0]}", fix=SAME_FILES)
        return self

    # -- set-up ------------------------------------------------------------------------------

    def _join(self, estimator, model, encoder, sub_chunks, group, root, init_process_group, backend,
              fold) -> int:
        """Argument checks every rank makes alike, then the group; returns ``sub_chunks``."""
        self.fold = choice("fold", fold, FOLDS)
        sub_chunks = positive_int("sub_chunks", sub_chunks)
        if encoder is None and model is None and estimator is None:
            raise ValueError("TorchRunEncodedData needs encoder=, model= or estimator= to encode the data")
        self._membership = join_group(group, init_process_group=init_process_group, backend=backend)
        require_every_rank(self._membership, "building a TorchRunEncodedData")
        self.group, self.rank, self.world = group, self._membership.rank, self._membership.world
        self.device = self._membership.device  # where the encodings live; see _place
        self._encode_device = None
        if not 0 <= root < self.world:
            self._membership.release()
            raise ValueError(f"root must be a rank in [0, {self.world}); got {root}")
        self.root = root
        self._global_root = self._membership.global_rank(root)
        self._agreed: Optional[_AgreedFold] = None
        self._estimator_prints: dict = {}
        self.chunks: list = []
        self._counts: list = []
        self.last_timings: Optional[StepTimings] = None
        self.last_fold_floats: Optional[int] = None  # float64s the last all-reduce fold sent; None: gathered
        self.interleaved = True  # rank r holds observations r, r + world, ... (see from_shards)
        self._sample: Any = None  # one observation (none on an empty rank), to check a model against
        return sub_chunks

    def _place(self, encoder, device: Any):
        """Check ``device`` on this rank and choose where ``encoder`` puts the encodings: there, or
        by default on the group's device (the CPU for an encoder without ``device=``). Runs
        inside the constructor's carried ``try``, so a device that one rank cannot use fails
        every rank together in the count exchange. Returns ``encoder``."""
        ours = takes_device(encoder)
        chosen = checked_device(f"device on rank {self.rank}", device)
        if chosen is None:
            chosen = self._membership.device if ours else torch.device("cpu")
        self.device = chosen
        self._encode_device = chosen if ours else device  # encode() refuses a GPU for mixle's encoders
        return encoder

    def _scatter(self, shards):
        """The root's shards, one per rank (``None`` everywhere when the root failed)."""
        if self.world == 1:
            return None if shards is None else shards[0]
        received = [None]
        sent = shards if shards is not None or self.rank != self.root else [None] * self.world
        dist.scatter_object_list(received, sent if self.rank == self.root else None,
                                 src=self._global_root, group=self.group)
        return received[0]

    def _encode(self, encoder, parts: Iterable, counts: Optional[list], signature: Optional[str],
                error: Optional[BaseException], what: str, empty: Any = None,
                locate: Callable[[int, int, int], str] = lambda part, row, _: f"observation {row}",
                fix: str = SAME_DATA) -> None:
        """Encode the raw parts (one alive at a time), then the count exchange: global count,
        status word and agreement on ``signature``; every rank raises together on a failure.
        ``empty``: no observations of the data's kind, encoded when the shard is empty.
        ``locate(part, shard_row, part_row)`` names a row (of part number ``part``) as the user
        knows it (a row of the data passed, of a file), for the error on a non-finite value;
        ``fix`` what to do when the ranks' ``signature`` differ."""
        try:
            if error is None:
                sizes = []
                for number, part in enumerate(parts):
                    sizes.append(len(part))
                    if self._sample is None and len(part):
                        self._sample = _copy(part[:1])
                    if len(part):  # an empty part has nothing to encode (some encoders refuse it)
                        try:
                            self.chunks.append(encode(encoder, part, self._encode_device))
                        except Exception as exc:
                            raise _located(exc, part, sum(sizes) - len(part), lambda shard_row, part_row:
                                           locate(number, shard_row, part_row), self.rank) from exc
                        self._counts.append(len(part))
                    del part
                    release_freed_memory()
                if self._sample is None:
                    self._sample = empty
                if not self.chunks:  # an empty shard: keep its empty encoding where the encoder
                    self._encode_empty(encoder, empty)  # takes one (it tells k-means‖ the dimension)
                if counts is not None and sum(counts) != sum(sizes):
                    raise RuntimeError("internal: file parts miscounted")
        except Exception as exc:
            error = exc
        self.local_count = int(sum(self._counts))
        header = [0.0 if error is None else 1.0] + agreement_slots(signature, self.world)
        empty = [0.0] * self.world  # which ranks hold no observation, for the warning below
        empty[self.rank] = float(self.local_count == 0)
        summed = self._sum_across_ranks(header + [float(self.local_count)] + empty)
        if summed[0] > 0 or not agreed(summed[1:4]):
            self.chunks, self._counts = [], []
            try:
                self._settle("building the handle", error, signature, f"{what} on this rank", fix)
            finally:
                self._membership.release()  # as close() would: a group this handle made is destroyed
        self._count = int(summed[4])
        if self._count == 0:
            self.close()
            raise ValueError("TorchRunEncodedData got no observations on any rank")
        empty_ranks = [r for r in range(self.world) if summed[5 + r] > 0]
        if empty_ranks and self.rank == self.root:  # allowed, as in mixle's handle, but visible
            warnings.warn(f"TorchRunEncodedData: ranks {empty_ranks} of {self.world} hold no observations "
                          f"({self._count} in all): each step still waits for them, and the model is "
                          "single-process EM's; start fewer ranks, or give every rank data", stacklevel=3)

    def _encode_empty(self, encoder, empty) -> None:
        try:
            empty = encode(encoder, np.zeros(0) if empty is None else empty, self._encode_device)
        except Exception:  # mixle's encoders refuse empty data; the shard then holds no chunk
            return
        self.chunks.append(empty)
        self._counts.append(0)

    # -- collectives -------------------------------------------------------------------------

    def _sum_across_ranks(self, numbers) -> np.ndarray:
        """Element-wise sum of a float64 vector over the ranks, bit-identical on every rank.

        Small vectors take one ``all_to_all`` exchange, after which each rank adds the
        world's vectors in rank order: one round of messages against the ring all-reduce's
        2·(world - 1), which is what a per-step fold of a few statistics waits on. Vectors
        whose exchange would move over ``EXCHANGE_MAX_FLOATS`` take ``all_reduce``."""
        if self.world == 1:
            return np.array(numbers, dtype=np.float64)
        device = self._membership.device  # the backend's (nccl: CUDA), not necessarily the encodings'
        local = torch.as_tensor(np.asarray(numbers, dtype=np.float64), device=device)
        if local.numel() * self.world > EXCHANGE_MAX_FLOATS:
            dist.all_reduce(local, group=self.group)
            return local.cpu().numpy()
        received = torch.empty(self.world, local.numel(), dtype=local.dtype, device=device)
        _finish(dist.all_to_all_single(received, local.repeat(self.world), group=self.group, async_op=True))
        total = received[0].clone()
        for row in received[1:]:
            total += row
        return total.cpu().numpy()

    def _all_gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _settle(self, operation: str, error: Optional[BaseException], mine: Optional[str], what: str,
                fix: str) -> None:
        """The failure path, once a status word or an agreement check failed: every rank sends
        its error and its text, and all raise the same outcome. Never returns."""
        entries = self._all_gather((None if error is None else failure_message(error), mine))
        failures = {r: message for r, (message, _) in enumerate(entries) if message is not None}
        if not failures:
            failures = odd_ones_out({r: text for r, (_, text) in enumerate(entries)}, what, fix)
        raise_failures(failures, self.rank, error, operation)

    def _estimator_print(self, estimator: Estimator) -> str:
        """The estimator's fingerprint, computed once per estimator object."""
        known = self._estimator_prints.get(id(estimator))
        if known is None or known[0] is not estimator:
            if len(self._estimator_prints) > 16:
                self._estimator_prints.clear()
            known = (estimator, fingerprint(estimator))
            self._estimator_prints[id(estimator)] = known
        return known[1]

    def _negotiate(self, operation, estimator, value, error, est_print, model_print) -> None:
        """Agree, once per estimator, how its statistics cross ranks; also where every rank
        compares estimator and model and learns of any failure. Sets ``self._agreed``."""
        plan = None
        if error is None and self.fold != "gather":
            try:
                plan = fold_plan(value, estimator.accumulator_factory().make)
            except Exception as exc:  # still take part in the exchange below
                error = exc
        mine = (None if error is None else failure_message(error), est_print, model_print, plan)
        entries = self._all_gather(mine)
        failures = {r: e[0] for r, e in enumerate(entries) if e[0] is not None}
        if not failures:
            failures = odd_ones_out({r: e[1] for r, e in enumerate(entries)}, "the estimator on this rank", SAME_MODEL)
        if not failures:
            failures = odd_ones_out({r: e[2] for r, e in enumerate(entries)}, "the model on this rank", SAME_MODEL)
        if failures:
            raise_failures(failures, self.rank, error, operation)
        plans = [e[3] for e in entries]
        same = plans[0] is not None and all(p == plans[0] for p in plans)
        if self.fold == "allreduce" and not same:
            raise ValueError("fold='allreduce' needs numeric statistics with the same layout on every "
                             f"rank, which combine adds; got {len(set(map(repr, plans)))} layouts. "
                             "Use fold='gather' or 'auto'")
        self._agreed = _AgreedFold(est_print, plans[0] if same else None)

    def _fold_path(self, estimator: Estimator, value: Any) -> tuple[str, Any]:
        """The agreed path for ``estimator`` (agreeing now if need be), and its plan."""
        if self._agreed is None or self._agreed.estimator != self._estimator_print(estimator):
            self._negotiate("folding statistics", estimator, value, None, self._estimator_print(estimator), None)
        return ("allreduce" if self._agreed.plan is not None else "gather"), self._agreed.plan

    def _fold(self, estimator: Estimator, count: float, acc, log_density: float, *, model: Any = None,
              error: Optional[BaseException] = None, operation: str = "folding statistics"):
        """Combine every rank's statistics into ``acc`` on every rank; returns the global
        ``(count, log_density)``. Either path leaves bit-identical statistics on all ranks, so
        the M-step that follows is deterministic and needs no broadcast of the model.

        ``error``: this rank already failed (``acc`` may be ``None``); it still takes part, so
        every rank raises together. ``model``: the model the statistics were taken under, which
        must be the same on every rank."""
        value = est_print = model_print = None
        try:
            est_print = self._estimator_print(estimator)
            model_print = None if model is None else fingerprint(model)
            if error is None:
                value = acc.value()
        except Exception as exc:
            error = error or exc
        while True:
            if self._agreed is None:
                self._negotiate(operation, estimator, value, error, est_print, model_print)
            if self._agreed.plan is None:
                return self._gather_fold(operation, estimator, count, acc, log_density, value, error,
                                         est_print, model_print)
            folded = self._allreduce_fold(operation, count, acc, log_density, value, error, est_print,
                                          model_print)
            if folded is not None:
                return folded
            self._agreed = None  # some rank's statistics no longer fit the plan: agree again

    def _allreduce_fold(self, operation, count, acc, log_density, value, error, est_print, model_print):
        """One summed vector: status, replan flag, model agreement, count, log-density, the
        statistics. Returns ``None`` when a rank asked to agree a new plan."""
        plan = self._agreed.plan
        flat, fits = None, False
        if error is None:
            try:
                flat = flatten_value(value)
                fits = (est_print == self._agreed.estimator and value_layout(value) == plan.layout
                        and plan.matches(flat))
            except Exception as exc:
                error = exc
        body = flat if fits else np.zeros(plan.size)
        header = [0.0 if error is None else 1.0, 0.0 if error is not None or fits else 1.0]
        header += agreement_slots(model_print, self.world) + [count if fits else 0.0,
                                                              log_density if fits else 0.0]
        summed = self._sum_across_ranks(np.concatenate([header, body]))
        self.last_fold_floats = len(header) + len(body)
        if summed[0] > 0 or not agreed(summed[2:5]):
            self._settle(operation, error, model_print, "the model on this rank", SAME_MODEL)
        if summed[1] > 0:
            return None
        acc.from_value(plan.restore(summed[7:]))
        return float(summed[5]), float(summed[6])

    def _gather_fold(self, operation, estimator, count, acc, log_density, value, error, est_print, model_print):
        """The reference path: statistics pickled to the root, combined there (mixle's
        ``combine``, so any value works), the sum broadcast; failures ride in both messages."""
        mine = (("failed", failure_message(error)) if error is not None
                else ("ok", est_print, model_print, count, log_density, value))
        self.last_fold_floats = None
        if self.world == 1:
            parts = [mine]
        else:
            parts = [None] * self.world if self.rank == self.root else None
            dist.gather_object(mine, parts, dst=self._global_root, group=self.group)
        message = None
        if self.rank == self.root:
            message = self._combine_on_root(estimator, parts)
        if self.world > 1:
            box = [message]
            dist.broadcast_object_list(box, src=self._global_root, group=self.group)
            message = box[0]
        if message[0] == "failed":
            raise_failures(message[1], self.rank, error, operation)
        _, count, log_density, value, renegotiate = message
        acc.from_value(value)
        if renegotiate:
            self._agreed = None
        return float(count), float(log_density)

    def _combine_on_root(self, estimator, parts) -> tuple:
        failures = {r: p[1] for r, p in enumerate(parts) if p[0] == "failed"}
        if not failures:
            failures = odd_ones_out({r: p[1] for r, p in enumerate(parts)}, "the estimator on this rank", SAME_MODEL)
        if not failures:
            failures = odd_ones_out({r: p[2] for r, p in enumerate(parts)}, "the model on this rank", SAME_MODEL)
        if failures:
            return ("failed", failures)
        total = estimator.accumulator_factory().make()
        for rank, part in enumerate(parts):
            try:
                total.combine(part[5])
            except Exception as exc:
                return ("failed", {rank: f"its statistics could not be combined with rank 0's: {failure_message(exc)}"})
        renegotiate = parts[0][1] != self._agreed.estimator
        return ("ok", sum(p[3] for p in parts), sum(p[4] for p in parts), total.value(), renegotiate)

    # -- the handle protocol -----------------------------------------------------------------

    def _local_statistics(self, estimator: Estimator, model: Distribution, with_log_density: bool = True):
        try:
            return accumulate(self.chunks, estimator, model, self._counts, with_log_density), None
        except Exception as exc:  # carried in the fold, so no peer waits for this rank
            return None, self._explained(exc, model)

    def _explained(self, error: BaseException, model: Any) -> BaseException:
        """``error`` of a step under ``model``, or, when ``model`` does not fit the data (a
        model of another dimension), the error its own encoder gives for an observation of this
        shard, which names the mismatch. Only on the failure path: a step pays nothing for it."""
        if model is None or self._sample is None or not hasattr(model, "dist_to_encoder"):
            return error
        try:
            model.dist_to_encoder().seq_encode(self._sample)
        except Exception as mismatch:
            return ValueError(f"the model does not fit the data on rank {self.rank}: {mismatch}. Pass a "
                              "model of the data's dimension, or start from the data (init='kmeans++')")
        return error

    def pysp_em_step(self, estimator: Estimator, prev_estimate: Distribution,
                     with_log_density: bool = True) -> EMStep:
        """One distributed EM step and the all-reduced log-density of ``prev_estimate``:
        one pass over the shard, one collective. ``with_log_density=False`` skips a separate
        log-density pass for families whose update does not yield it (the log-density is then
        NaN unless the update gave it)."""
        require_every_rank(self._membership, "an EM step on a TorchRunEncodedData")
        t0 = time.perf_counter()
        local, error = self._local_statistics(estimator, prev_estimate, with_log_density)
        t1 = time.perf_counter()
        acc = None if local is None else local.accumulator
        count, log_density = self._fold(estimator, 0.0 if local is None else local.count, acc,
                                        0.0 if local is None else local.log_density, model=prev_estimate,
                                        error=error, operation="EM step")
        t2 = time.perf_counter()
        model = m_step(estimator, count, acc)
        self.last_timings = StepTimings(self.local_count, t1 - t0, t2 - t1, time.perf_counter() - t2)
        return EMStep(model, count, log_density)

    def pysp_seq_estimate(self, estimator: Estimator, prev_estimate: Distribution) -> Distribution:
        """One distributed EM step; every rank returns the identical model."""
        return self.pysp_em_step(estimator, prev_estimate, with_log_density=False).model

    def pysp_seq_initialize(self, estimator: Estimator, rng: Any, p: float) -> Distribution:
        """Distributed randomized initialization; identical model on all ranks.

        As mixle's own handle does: the root draws one seed per rank from ``rng`` (a
        ``RandomState``, a ``Generator`` or a seed) and scatters them; each rank's observations
        take part with probability ``p`` and its accumulators get a ``RandomState``. The result
        is reproducible for a seed and world size, but differs from a one-process
        ``seq_initialize`` with the same seed (each rank draws its own subset)."""
        require_every_rank(self._membership, "initialising from a TorchRunEncodedData")
        error, seeds = None, None
        try:
            p = fraction("initialisation fraction p", p)
            if self.rank == self.root:
                seeds = [int(s) for s in _seed_source(rng).randint(2**31, size=self.world)]
        except Exception as exc:
            error = exc
        seed = self._scatter(seeds)
        acc, included = None, 0.0
        if error is None and seed is not None:
            try:
                local_rng = np.random.RandomState(seed)
                weight_rng = np.random.RandomState(local_rng.randint(2**31))
                acc = estimator.accumulator_factory().make()
                for enc, n in zip(self.chunks, self._counts):
                    weights = (weight_rng.rand(n) <= p).astype(np.float64)
                    acc.seq_initialize(enc, weights, local_rng)
                    included += float(weights.sum())
            except Exception as exc:
                error = exc
        count, _ = self._fold(estimator, included, acc, 0.0, error=error, operation="initialisation")
        return m_step(estimator, count, acc)

    def pysp_seq_log_density_sum(self, estimate: Distribution) -> tuple[float, float]:
        """Allreduced count and summed log density."""
        require_every_rank(self._membership, "a log-density sum on a TorchRunEncodedData")
        error, total, model_print = None, 0.0, None
        try:
            model_print = fingerprint(estimate)
            total = sum(log_density_total(estimate, c) for c in self.chunks)
        except Exception as exc:
            error = self._explained(exc, estimate)
        header = [0.0 if error is None else 1.0] + agreement_slots(model_print, self.world)
        summed = self._sum_across_ranks(header + [float(self.local_count), total])
        if summed[0] > 0 or not agreed(summed[1:4]):
            self._settle("log-density sum", error, model_print, "the model on this rank", SAME_MODEL)
        return float(summed[4]), float(summed[5])

    def pysp_stream_accumulate(self, estimator: Estimator, model: Distribution) -> tuple[float, Any]:
        """Globally folded, key-tied batch sufficient statistics for streaming EM: ``(count,
        value)`` as mixle's handle returns them (mixle's streaming driver rebuilds the
        accumulator with ``from_value``)."""
        require_every_rank(self._membership, "stream accumulate on a TorchRunEncodedData")
        local, error = self._local_statistics(estimator, model, with_log_density=False)
        acc = None if local is None else local.accumulator
        count, _ = self._fold(estimator, 0.0 if local is None else local.count, acc,
                              0.0 if local is None else local.log_density, model=model, error=error,
                              operation="stream accumulate")
        return count, tie_keys(acc).value()

    def pysp_kmeans_init(self, estimator: Estimator, rng: Any, init: str = "kmeans++") -> Distribution:
        """A mixture start from k-means‖ (``"kmeans++"``) or random observations
        (``"random_from_data"``) run on the shards where they live; identical on every rank
        and reproducible for a seed and world size (mixle_nb/stats/kmeans.py)."""
        require_every_rank(self._membership, "a k-means start on a TorchRunEncodedData")
        return kmeans_init(self.chunks, estimator, rng, HandleExchange(self), init)

    def pysp_shard_map(self, function, gather: bool = False) -> np.ndarray:
        """``function(enc)`` over this rank's shard; ``gather=True``: every observation's, in
        the original order, on every rank (mixle_nb/parallel/rank_exchange.py)."""
        if gather:  # without it, each rank scores its own shard: no collective
            require_every_rank(self._membership, "gathering the scores of a TorchRunEncodedData")
        return map_shard(self, function, gather)

    def close(self) -> None:
        """Release the resident shard; destroy the process group only if this handle made it."""
        self.chunks, self._counts = [], []
        self._membership.release()

    def __len__(self) -> int:
        return self._count


def _copy(rows: Any) -> Any:
    """``rows`` as a copy that holds no reference to the part they came from (a memory map)."""
    return np.array(rows) if isinstance(rows, np.ndarray) else list(rows)


def _located(error: BaseException, part: Any, start: int, locate: Callable[[int, int], str],
             rank: int) -> BaseException:
    """``error`` (an encoder's), or, when ``part`` (shard rows from ``start``) holds a NaN or an
    infinity, an error naming the first such row as the user knows it (``locate(shard_row,
    part_row)``): the encoder's own message counts within the part."""
    try:
        values = np.asarray(part, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
    except (TypeError, ValueError):  # not numbers: the encoder's error stands
        return error
    if not len(bad):
        return error
    row = int(bad[0])
    return ValueError(f"{locate(start + row, row)} is NaN or infinite: drop or impute it first (rank {rank}'s "
                      f"encoder, counting within its part: {failure_message(error)})")


def _seed_source(rng: Any) -> np.random.RandomState:
    """mixle draws per-rank seeds with ``RandomState.randint``; a ``Generator`` or a seed is
    turned into one the way mixle's dispatch does."""
    if isinstance(rng, np.random.RandomState):
        return rng
    if isinstance(rng, np.random.Generator):
        return np.random.RandomState(int(rng.integers(2**31 - 1)))
    return np.random.RandomState(rng)

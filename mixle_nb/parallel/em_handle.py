"""The EM handle, TorchRunEncodedData: encoded shards resident on a process group's ranks.

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
holds the same data description, estimator and model. The exchanges are ``exchange.py``'s
(:class:`~mixle_nb.parallel.exchange.RankExchange`), the statistics' fold is ``fold.py``'s, what
both handles share is ``group_handle.py``'s; where the observations come from is a
``data_sources.py`` source, and the chunks a rank holds are ``resident_shards.py``'s.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..stats.base import Distribution, Estimator
from ..stats.estimation import (
    Accumulated,
    EMStep,
    accumulate,
    log_density_total,
    m_step,
    sample_weights,
    takes_device,
    tie_keys,
)
from ..stats.kmeans import kmeans_init
from ..validation import choice, fraction, positive_int
from ..validation import device as checked_device
from .data_sources import NOT_ELASTIC, SAME_FILES, DataSource, FileList, NpyFile, RootData, SameData, ScatteredShard
from .exchange import STATUS, Header, StatusCheck
from .fail_together import fingerprint
from .fold import FOLDS, StatisticsFold
from .group import GROUP_TIMEOUT_S, require_every_rank
from .group_handle import GroupHandle
from .logical_shards import rebalance
from .resident_shards import ResidentShards
from .sequence_sources import NpySequences, SequenceFiles
from .shard_map import map_shard
from .shards import load_npy

REJOIN_HEADER = Header(**STATUS, count=1)


@dataclass
class StepTimings:
    """What one rank spent on the last step, in ``last_timings`` of :class:`TorchRunEncodedData`.

    Parameters
    ----------
    shard : int
        The observations this rank holds.
    e_step_s : float
        Seconds of the E-step on this rank's shard.
    fold_s : float
        Seconds of the fold across ranks (waiting for the slowest rank included).
    m_step_s : float
        Seconds of the M-step.

    Examples
    --------
    >>> import numpy as np
    >>> from mixle_nb.parallel import TorchRunEncodedData
    >>> from mixle_nb.stats import GaussianEstimator
    >>> with TorchRunEncodedData(np.arange(10.0), GaussianEstimator(), init_process_group=False) as h:
    ...     model = h.pysp_seq_estimate(GaussianEstimator(), None)
    >>> h.last_timings.shard
    10
    """

    shard: int
    e_step_s: float
    fold_s: float
    m_step_s: float


def _count_header(world: int) -> Header:
    """Construction's count exchange: status, the global count, which ranks hold no observation."""
    return Header(**STATUS, count=1, empty=world)


def _choose_encoder(estimator: Estimator | None, model: Distribution | None, encoder: Any) -> Any:
    if encoder is not None:
        return encoder
    if model is not None:
        return model.dist_to_encoder()
    if estimator is None:
        raise ValueError("TorchRunEncodedData needs encoder=, model= or estimator= to encode the data")
    return estimator.accumulator_factory().make().acc_to_encoder()


class TorchRunEncodedData(GroupHandle):
    """Encoded-data handle sharded across torch.distributed ranks.

    Each rank encodes its shard once and keeps it resident; an EM step is one pass over it and
    one collective. With ``root_only=False`` every rank passes the same full dataset and keeps
    ``data[rank::world]`` (a numpy array stays an array; anything else — ragged sequences,
    tuples, strings, dicts — becomes a list of the observations as they are); with
    ``root_only=True`` only the root needs real data and scatters the shards. To let each rank
    read its own part from disk, see :meth:`from_npy` and :meth:`from_files`; for data each rank
    already holds its own part of (after ``%mixle_scatter``), :meth:`from_shards`.

    ``fold`` picks how statistics cross ranks. ``"allreduce"`` flattens every number of the
    statistics, the count and the log-density into one float64 tensor, sums it across ranks in
    one collective, and lets every rank run the deterministic M-step (no broadcast); numbers that
    ``combine`` keeps rather than adds (a hidden Markov model's state count) are put back.
    ``"gather"`` is the reference path: pickle statistics to the root, combine there, broadcast
    the folded statistics. ``"auto"`` takes the all-reduce whenever the statistics flatten to the
    same layout on every rank (agreed once per estimator; dict statistics, whose keys differ by
    rank, are gathered).

    Every rank makes the same calls (in a ``%%mixle`` cell, or under ``torchrun``); the drivers
    of :mod:`mixle_nb.inference` (``fit``, ``em_step``, ``predict``, ...) take the handle in place
    of data, and :class:`~mixle_nb.widgets.EMPanel` steps it from the notebook.

    Parameters
    ----------
    data : sequence or DataSource or None
        The observations, or a ``DataSource`` (``mixle_nb.parallel.data_sources``: what
        :meth:`from_shards`, :meth:`from_npy` and :meth:`from_files` pass).
    estimator, model, encoder : object, optional
        What encodes the data: ``encoder``, else the model's, else the estimator's (at least one).
    sub_chunks : int, default 1
        Encoded parts per logical shard.
    group : ProcessGroup, optional
        The group to run in (default: the default group, created from the launcher's variables
        if need be).
    root : int, default 0
        The group rank that folds statistics on the gather path.
    root_only : bool, default False
        The data are on the root only, which scatters the shards.
    init_process_group : bool, default True
        ``False`` with no group: one process, rank 0 of 1.
    backend : str, optional
        The backend of a group created here (default: nccl with CUDA, else gloo).
    fold : {"auto", "allreduce", "gather"}, default "auto"
        How statistics cross ranks.
    device : str or torch.device, optional
        Where the encodings live and every E-step kernel runs (``"cpu"``, ``"cuda"``,
        ``"cuda:1"``); ``None`` is the group's device: the rank's CUDA device under nccl, else the
        CPU. An encoder without ``device=`` (mixle's) encodes on the CPU.
    shards : int, optional
        Logical shards of data read from files (default: one per rank).
    elastic : bool, default False
        Let the survivors read a dead rank's shards again (data read from files only).
    timeout : float, default 300
        Seconds a group created here waits, at the rendezvous for every rank and in a collective
        for a missing peer (torch's own default is 30 minutes); a rank's slowest E-step must fit
        in it. An existing group keeps its own.

    Attributes
    ----------
    rank, world : int
        This rank and the number of ranks.
    last_timings : StepTimings or None
        What this rank spent on the last step.
    steps_taken : int
        The EM steps run on the handle.

    Raises
    ------
    ValueError
        Bad arguments, or data every rank could not read and encode alike (on every rank
        together: the failed rank its own error, the others :class:`PeerRankError`); a device
        this rank cannot use fails every rank together, before any data are read.
    RuntimeError
        No group exists and the launcher's variables are missing.

    See Also
    --------
    StreamingTokenEncodedData : The handle for streaming training.
    mixle_nb.inference.fit : EM to convergence on a handle.

    Examples
    --------
    In one process (``init_process_group=False``); under ``torchrun`` or on a cluster's ranks
    every rank runs the same lines without it:

    >>> import numpy as np
    >>> from mixle_nb.inference import fit
    >>> from mixle_nb.parallel import TorchRunEncodedData
    >>> from mixle_nb.stats import GaussianEstimator, MixtureEstimator
    >>> x = np.random.default_rng(0).normal(size=300)
    >>> estimator = MixtureEstimator([GaussianEstimator()] * 2)
    >>> with TorchRunEncodedData(x, estimator, init_process_group=False) as h:
    ...     result = fit(h, estimator, init="kmeans++", max_its=5, out=None)
    ...     count, total = h.pysp_seq_log_density_sum(result.model)
    >>> h.rank, h.world, count
    (0, 1, 300.0)
    >>> result.n_iter
    5
    """

    handle_name = "TorchRunEncodedData"

    def __init__(
        self,
        data: Sequence | DataSource | None,
        estimator: Estimator | None = None,
        model: Distribution | None = None,
        encoder: Any = None,
        sub_chunks: int = 1,
        group: Any = None,
        root: int = 0,
        root_only: bool = False,
        init_process_group: bool = True,
        backend: str | None = None,
        *,
        fold: str = "auto",
        device: Any = None,
        shards: int | None = None,
        elastic: bool = False,
        timeout: float = GROUP_TIMEOUT_S,
    ):
        """Join the group, read and encode this rank's shards, and agree on the count.

        The parameters are described in the class docstring.
        """
        source = self._source_of(data, root, root_only)
        if elastic and source.held_in is not None:
            raise ValueError(NOT_ELASTIC.format(what=source.held_in))
        fold = choice("fold", fold, FOLDS)
        sub_chunks = positive_int("sub_chunks", sub_chunks)
        if encoder is None and model is None and estimator is None:
            raise ValueError("TorchRunEncodedData needs encoder=, model= or estimator= to encode the data")
        self._join_group(group, init_process_group=init_process_group, backend=backend, timeout=timeout)
        try:
            if not 0 <= root < self.world:
                raise ValueError(f"root must be a rank in [0, {self.world}); got {root}")
            self.layout = source.layout(self.world, shards)
        except ValueError:
            self._membership.release()
            raise
        self.group, self.source, self._sub_chunks, self._fold_choice = group, source, sub_chunks, fold
        self.elastic, self.interleaved = bool(elastic), source.interleaved
        self._connect(root)
        self._reset_state()
        error = None
        try:  # whatever fails here is carried to the peers in the count exchange
            encoder = self._place(_choose_encoder(estimator, model, encoder), device)
            source.open(self.rank, self.world, self.layout)
        except Exception as exc:
            error = exc
        source.share(self.exchange)
        pieces = [(s, source.parts(s, sub_chunks)) for s in self.layout.held_by(self.rank)] if error is None else []
        self._encode(encoder, pieces, error)
        source.release()

    @staticmethod
    def _source_of(data: Any, root: int, root_only: bool) -> DataSource:
        if isinstance(data, DataSource):
            if root_only:
                raise ValueError("root_only=True scatters data passed in memory; a DataSource reads its own")
            return data
        return RootData(data, root) if root_only else SameData(data)

    @classmethod
    def from_shards(
        cls, shard: Sequence, estimator: Estimator | None = None, *, interleaved: bool = True, **options: Any
    ) -> TorchRunEncodedData:
        """A handle on data already split across ranks: each rank passes its own observations
        ``shard`` and keeps all of them (sizes may differ). This is the constructor for a
        sequence ``%mixle_scatter`` (or ``cluster.scatter``) dealt out, where rank ``r`` holds
        ``data[r::world]``; the constructor proper would keep ``shard[rank::world]`` of it.

        Parameters
        ----------
        shard : sequence
            This rank's observations. Ranks agree on their shape and dtype; a rank with none
            of vector data passes an empty array of their shape (``np.empty((0, D))``), which is
            what a scatter of fewer rows than ranks gives it.
        estimator : Estimator, optional
            As for the constructor.
        interleaved : bool
            ``True`` (the scatter's layout): per-observation results gathered with
            ``gather=True`` come back in the original order of the scattered sequence;
            ``False``: the shards are consecutive blocks, gathered back as rank 0's rows, then
            rank 1's, ...
        **options
            The constructor's other keywords.

        Returns
        -------
        TorchRunEncodedData
            The handle over every rank's shard.

        Raises
        ------
        ValueError
            As the constructor, and for ``elastic=True``: scattered data cannot be read again."""
        return cls(ScatteredShard(shard, interleaved), estimator, **options)

    @classmethod
    def from_npy(
        cls, path: str | os.PathLike, estimator: Estimator | None = None, *, lengths: Any = None, **options: Any
    ) -> TorchRunEncodedData:
        """Each rank reads its own rows of the ``.npy`` file at ``path`` (a path every rank can
        open): rows ``rank, rank + world, ...``, the same shard — and so the same model (bit for
        bit in our 1-D test; to rounding where BLAS treats a strided view and a contiguous copy
        differently) — as the in-memory handle given the whole array.

        Why strided rows rather than a contiguous block: the shards, their order and so every
        result (per-observation scores gathered back in the original order included) are those
        of the in-memory handle, and the file is read part by part in blocks of at most 32 MB, so
        a rank holds its encoded shard, one raw part and one block. The cost is that every rank
        reads the whole file (from the page cache on one host). ``sub_chunks`` parts are read and
        encoded one after another: more parts, less raw data alive beside the encodings.

        Parameters
        ----------
        path : str or os.PathLike
            A C-ordered ``.npy`` array of observations, one per row.
        estimator : Estimator, optional
            As for the constructor.
        lengths : str or os.PathLike or array_like of int, optional
            The file holds sequences, one after another (hmmlearn's ``X`` and ``lengths``): a
            ``.npy`` of their lengths (or the lengths themselves), summing to the file's rows.
            Each logical shard is then a contiguous block of whole sequences holding about
            ``rows / shards`` rows (never a cut sequence), read as contiguous rows, and the
            handle's observations are the sequences (what an HMM family encodes; its count is the
            number of sequences). A zero length, or lengths that do not sum to the rows, fail
            every rank together before anything is encoded, naming the global sequence index.
        **options
            The constructor's other keywords. ``shards`` logical shards (default: one per rank;
            at least one per rank): shard ``s`` is rows ``s, s + shards, ...``, held by rank
            ``s % world``, and the fold sums the shards' statistics in shard order, so the model
            is bit-identical for any world size and whichever rank holds which shard.
            ``elastic=True``: when a rank dies, the survivors read its shards again from the file
            and the step goes on (see :meth:`rejoin`).

        Returns
        -------
        TorchRunEncodedData
            The handle over the file's rows.

        Raises
        ------
        ValueError
            As the constructor; a file a rank cannot read fails every rank together."""
        source = NpyFile(path) if lengths is None else NpySequences(path, lengths)
        return cls(source, estimator, **options)

    @classmethod
    def from_files(
        cls,
        paths: Sequence[Any],
        estimator: Estimator | None = None,
        *,
        reader: Callable[[str], Any] = load_npy,
        lengths: Any = None,
        **options: Any,
    ) -> TorchRunEncodedData:
        """Files dealt out to ranks: rank ``r`` reads ``paths[r::world]`` with ``reader``, one
        file at a time, each file encoded in ``sub_chunks`` parts. Every rank passes the same
        list. The model equals the in-memory handle's on the concatenated data up to the order
        of floating-point sums, and per-observation results gathered with ``gather=True`` come
        back in that order (file by file, as listed).

        Parameters
        ----------
        paths : sequence of path
            The files, the same list on every rank.
        estimator : Estimator, optional
            As for the constructor.
        reader : callable
            From a path to a sequence of observations (default: a memory-mapped ``np.load``).
        lengths : {"per_file"} or sequence of path, optional
            The files hold sequences: ``"per_file"``, each file is one whole sequence; a list
            of ``.npy`` files of lengths, one beside each data file (``lengths[i]`` for
            ``paths[i]``), each file a block of sequences one after another. The handle's
            observations are then the sequences, numbered through the files in the order
            listed; a zero length, or lengths that do not sum to their file's rows, fail every
            rank together, naming the global sequence index, the file and the rank.
        **options
            The constructor's other keywords; ``shards`` and ``elastic`` as for
            :meth:`from_npy`, shard ``s`` being the files ``paths[s::shards]``.

        Returns
        -------
        TorchRunEncodedData
            The handle over the files.

        Raises
        ------
        ValueError
            As the constructor; a file or ``reader`` that fails on one rank fails every rank."""
        source = FileList(paths, reader) if lengths is None else SequenceFiles(paths, lengths, reader)
        return cls(source, estimator, **options)

    # -- set-up ------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        """What a rank holds before it reads its shards."""
        self.device = self._membership.device  # where the encodings live; see _place
        self.resident = ResidentShards(self.source, self.rank)
        self._kept: tuple | None = None  # elastic: the last E-step's statistics, per shard
        self.phase_hook: Callable[[str, int], None] | None = None  # (phase, step), for fault tests
        self.steps_taken = 0
        self.last_timings: StepTimings | None = None

    @property
    def chunks(self) -> list:
        """This rank's encoded chunks, shard after shard."""
        return self.resident.chunks

    @chunks.setter
    def chunks(self, chunks: list) -> None:  # tests put a bad encoding in place of a rank's
        self.resident.chunks = chunks

    @property
    def shard_chunks(self) -> list[tuple[int, int, int]]:
        """``(shard id, first chunk, end chunk)`` of each shard this rank holds, in shard order."""
        return self.resident.shard_chunks

    @property
    def chunk_origins(self) -> list:
        """Where each chunk sits in the data's order (``None``: an empty chunk)."""
        return self.resident.origins

    @property
    def rereadable(self) -> bool:
        """Whether the ranks can read the data again after a rank died (built from files)."""
        return self.source.rereadable

    def _connect(self, root: int = 0) -> None:
        """The exchange among the group's ranks (``root`` gathers and broadcasts) and the fold on it."""
        super()._connect(root)
        self.folding = StatisticsFold(self.exchange, self._fold_choice)

    def _sent(self, phase: str | None) -> None:
        self._phase(phase)

    @property
    def last_fold_floats(self) -> int | None:
        """The float64s the last all-reduce fold sent; ``None``: it gathered."""
        return self.folding.last_floats

    def _place(self, encoder: Any, device: Any) -> Any:
        """Check ``device`` on this rank and choose where ``encoder`` puts the encodings: there, or
        by default on the group's device (the CPU for an encoder without ``device=``). Runs
        inside the constructor's carried ``try``, so a device that one rank cannot use fails
        every rank together in the count exchange. Returns ``encoder``."""
        ours = takes_device(encoder)
        chosen = checked_device(f"device on rank {self.rank}", device)
        if chosen is None:
            chosen = self._membership.device if ours else torch.device("cpu")
        self.device = chosen
        self.resident.device = chosen if ours else device  # encode() refuses a GPU for mixle's encoders
        return encoder

    def _encode(self, encoder: Any, pieces: list, error: BaseException | None) -> None:
        """Encode each held shard's raw parts (``pieces``: (shard id, its parts); one part alive
        at a time), then the count exchange: global count, status word and agreement on the
        source's ``signature``; every rank raises together on a failure. A rank that holds no
        observations encodes the source's ``empty`` where the encoder takes it."""
        source, resident = self.source, self.resident
        resident.encoder = encoder
        try:
            if error is None:
                sizes = resident.read(pieces)
                resident.keep_empty(source.empty)
                if source.counts is not None and sum(source.counts) != sizes:
                    raise RuntimeError("internal: file parts miscounted")
        except Exception as exc:
            error = exc
        self.local_count = resident.count
        held_none = np.zeros(self.world)
        held_none[self.rank] = float(self.local_count == 0)
        check = StatusCheck("building the handle", source.signature, f"{source.what} on this rank", source.fix)
        try:
            summed = self.exchange.checked_sum(
                _count_header(self.world), check, error, count=self.local_count, empty=held_none
            )
        except BaseException:
            self.close()  # a group this handle made is destroyed
            raise
        self._count = int(summed.count)
        if self._count == 0:
            self.close()
            raise ValueError("TorchRunEncodedData got no observations on any rank")
        empty_ranks = np.flatnonzero(summed.empty).tolist()
        if empty_ranks and self.rank == self.root:  # allowed, as in mixle's handle, but visible
            warnings.warn(
                f"TorchRunEncodedData: ranks {empty_ranks} of {self.world} hold no observations "
                f"({self._count} in all): each step still waits for them, and the model is "
                "single-process EM's; start fewer ranks, or give every rank data",
                stacklevel=3,
            )

    # -- the handle protocol -----------------------------------------------------------------

    def _phase(self, phase: str | None) -> None:
        """Tell ``phase_hook`` (fault-injection tests) where step ``steps_taken + 1`` is: ``"e_step"``
        (before it), ``"e_step_shard"`` (between two shards' E-steps), ``"e_step_done"``,
        ``"fold"`` (this rank's part sent), ``"rejoin"``."""
        if self.phase_hook is not None and phase is not None:
            self.phase_hook(phase, self.steps_taken + 1)

    def _shard_statistics(
        self, estimator: Estimator, model: Distribution, with_log_density: bool = True
    ) -> tuple[list[Accumulated] | None, BaseException | None]:
        """(this rank's statistics, one :class:`Accumulated` per shard held, in shard order;
        ``None``) or (``None``, the error). An elastic handle keeps them with the estimator and
        model they were taken under and gives them again for the same pair, so a step taken
        again after a rank died computes only the shards that rank held."""
        try:
            key = (
                (self.folding.estimator_print(estimator), fingerprint(model), with_log_density)
                if self.elastic
                else None
            )
            kept = dict(self._kept[1]) if key is not None and self._kept is not None and self._kept[0] == key else {}
            pieces = []
            for number, (shard, first, end) in enumerate(self.shard_chunks):
                if number:
                    self._phase("e_step_shard")
                if shard not in kept:
                    kept[shard] = accumulate(
                        self.chunks[first:end], estimator, model, self.resident.counts[first:end], with_log_density
                    )
                pieces.append(kept[shard])
            if key is not None:
                self._kept = (key, {shard: kept[shard] for shard, _, _ in self.shard_chunks})
            return pieces, None
        except Exception as exc:  # carried in the fold, so no peer waits for this rank
            return None, self.explain_failure(exc, model)

    def explain_failure(self, error: BaseException, model: Any) -> BaseException:
        """Explain a step's failure when the model does not fit the data.

        Only on the failure path: a step pays nothing.

        Parameters
        ----------
        error : BaseException
            What a step (or a score) under ``model`` raised.
        model : object
            The model it ran under.

        Returns
        -------
        BaseException
            When ``model`` does not fit the data (a model of another dimension), a ``ValueError``
            with the error its own encoder gives for an observation of this shard, which names the
            mismatch; else ``error`` itself.
        """
        sample = self.resident.sample
        if model is None or sample is None or not hasattr(model, "dist_to_encoder"):
            return error
        try:
            model.dist_to_encoder().seq_encode(sample)
        except Exception as mismatch:
            return ValueError(
                f"the model does not fit the data on rank {self.rank}: {mismatch}. Pass a "
                "model of the data's dimension, or start from the data (init='kmeans++')"
            )
        return error

    def pysp_em_step(self, estimator: Estimator, prev_estimate: Distribution, with_log_density: bool = True) -> EMStep:
        """One distributed EM step and the all-reduced log-density of ``prev_estimate``:
        one pass over the shard, one collective.

        Parameters
        ----------
        estimator : Estimator
            The same estimator on every rank.
        prev_estimate : Distribution
            The model the E-step runs under, the same on every rank.
        with_log_density : bool
            ``False`` skips a separate log-density pass for families whose update does not
            yield it (the log-density is then NaN unless the update gave it).

        Returns
        -------
        EMStep
            The new model (identical on every rank), the global count and the log-density.

        Raises
        ------
        Exception
            On every rank together when any rank failed: the failed rank its own error, the
            others :class:`~mixle_nb.parallel.fail_together.PeerRankError` naming it; a
            ``ValueError`` on a rank whose estimator or model differs from the others'."""
        require_every_rank(self._membership, "an EM step on a TorchRunEncodedData")
        self._phase("e_step")
        t0 = time.perf_counter()
        pieces, error = self._shard_statistics(estimator, prev_estimate, with_log_density)
        t1 = time.perf_counter()
        if error is None:
            self._phase("e_step_done")
        count, log_density, acc = self.folding.shards(
            estimator, pieces, self.layout, model=prev_estimate, error=error, operation="EM step"
        )
        t2 = time.perf_counter()
        model = m_step(estimator, count, acc)
        self.steps_taken += 1
        self.last_timings = StepTimings(self.local_count, t1 - t0, t2 - t1, time.perf_counter() - t2)
        return EMStep(model, count, log_density)

    def pysp_seq_estimate(self, estimator: Estimator, prev_estimate: Distribution) -> Distribution:
        """One distributed EM step; every rank returns the identical model.

        Parameters
        ----------
        estimator : Estimator
            The same estimator on every rank.
        prev_estimate : Distribution
            The model the E-step runs under.

        Returns
        -------
        Distribution
            The new model.

        Raises
        ------
        Exception
            Together on every rank, as :meth:`pysp_em_step` says."""
        return self.pysp_em_step(estimator, prev_estimate, with_log_density=False).model

    def pysp_seq_initialize(self, estimator: Estimator, rng: Any, p: float) -> Distribution:
        """Distributed randomized initialization; identical model on all ranks.

        As mixle's own handle does: the root draws one seed per logical shard (one per rank
        unless the handle was built with ``shards=``) from ``rng`` (a ``RandomState``, a
        ``Generator`` or a seed) and scatters them; each shard's observations take part with
        probability ``p`` and its accumulators get a ``RandomState``. The result is reproducible
        for a seed and shard count, but differs from a one-process ``seq_initialize`` with the
        same seed (each shard draws its own subset).

        Parameters
        ----------
        estimator : Estimator
            The same estimator on every rank.
        rng : numpy.random.RandomState or numpy.random.Generator or int
            Used on the root only.
        p : float
            The fraction of observations that take part, in ``(0, 1]``.

        Returns
        -------
        Distribution
            The initial model, identical on every rank.

        Raises
        ------
        Exception
            Together on every rank, as :meth:`pysp_em_step` says."""
        require_every_rank(self._membership, "initialising from a TorchRunEncodedData")
        error, seeds = None, None
        try:
            p = fraction("initialisation fraction p", p)
            if self.rank == self.root:
                drawn = [int(s) for s in _seed_source(rng).randint(2**31, size=self.layout.count)]
                seeds = [[drawn[s] for s in self.layout.held_by(r)] for r in range(self.world)]
        except Exception as exc:
            error = exc
        mine = self.exchange.scatter(seeds)
        pieces = []
        if error is None and mine is not None:
            try:
                for seed, (_, first, end) in zip(mine, self.shard_chunks):
                    local_rng: Any = np.random.RandomState(seed)  # mixle's accumulators take a RandomState
                    weight_rng = np.random.RandomState(local_rng.randint(2**31))
                    acc, included = estimator.accumulator_factory().make(), 0.0
                    for enc, n in zip(self.chunks[first:end], self.resident.counts[first:end]):
                        weights = (weight_rng.rand(n) <= p).astype(np.float64)
                        carried = sample_weights(enc)  # rows that carry sample weights weigh by them
                        if carried is not None:
                            weights = weights * carried.cpu().numpy()
                        acc.seq_initialize(enc, weights, local_rng)
                        included += float(weights.sum())
                    pieces.append(Accumulated(included, acc, 0.0))
            except Exception as exc:
                error = exc
        count, _, acc = self.folding.shards(estimator, pieces, self.layout, error=error, operation="initialisation")
        return m_step(estimator, count, acc)

    def _local_log_density(self, model: Distribution) -> tuple[float, float]:
        return float(self.local_count), float(sum(log_density_total(model, c) for c in self.chunks))

    def _model_text(self, model: Distribution) -> str:
        return fingerprint(model)

    def pysp_stream_accumulate(self, estimator: Estimator, model: Distribution) -> tuple[float, Any]:
        """Globally folded, key-tied batch sufficient statistics for streaming EM: ``(count,
        value)`` as mixle's handle returns them (mixle's streaming driver rebuilds the
        accumulator with ``from_value``).

        Parameters
        ----------
        estimator : Estimator
            The same estimator on every rank.
        model : Distribution
            The model the statistics are taken under, the same on every rank.

        Returns
        -------
        tuple of (float, object)
            The global count and the folded statistics value, identical on every rank.

        Raises
        ------
        Exception
            Together on every rank, as :meth:`pysp_em_step` says."""
        require_every_rank(self._membership, "stream accumulate on a TorchRunEncodedData")
        pieces, error = self._shard_statistics(estimator, model, with_log_density=False)
        count, _, acc = self.folding.shards(
            estimator, pieces, self.layout, model=model, error=error, operation="stream accumulate"
        )
        return count, tie_keys(acc).value()

    def pysp_kmeans_init(self, estimator: Estimator, rng: Any, init: str = "kmeans++") -> Distribution:
        """A mixture start from k-means‖ (``"kmeans++"``) or random observations
        (``"random_from_data"``) run on the shards where they live; identical on every rank
        and reproducible for a seed and world size (mixle_nb/stats/kmeans.py).

        Parameters
        ----------
        estimator : Estimator
            A mixture estimator, the same on every rank.
        rng : numpy.random.RandomState or numpy.random.Generator or int
            The seed source.
        init : {"kmeans++", "random_from_data"}
            How the centres are chosen.

        Returns
        -------
        Distribution
            The starting mixture, identical on every rank.

        Raises
        ------
        Exception
            Together on every rank, as :meth:`pysp_em_step` says."""
        require_every_rank(self._membership, "a k-means start on a TorchRunEncodedData")
        return kmeans_init(self.chunks, estimator, rng, self.folding, init)

    def pysp_shard_map(self, function: Callable[[Any], np.ndarray], gather: bool = False) -> np.ndarray:
        """``function(enc)`` over this rank's shard; ``gather=True``: every observation's, in
        the original order, on every rank (mixle_nb/parallel/shard_map.py).

        Parameters
        ----------
        function : callable
            From an encoded chunk to one row per observation.
        gather : bool
            Gather every rank's rows (collective) rather than this rank's only.

        Returns
        -------
        numpy.ndarray
            The rows, in the original order when gathered.

        Raises
        ------
        Exception
            Together on every rank, as :meth:`pysp_em_step` says."""
        if gather:  # without it, each rank scores its own shard: no collective
            require_every_rank(self._membership, "gathering the scores of a TorchRunEncodedData")
        return map_shard(self, function, gather)

    def _check_rejoin(self) -> None:
        if not self.elastic:
            raise RuntimeError("rejoin() needs a handle built with elastic=True (from_npy or from_files)")

    def _read_again(self) -> list:
        """Reads again from the files the shards no survivor holds, each to the survivor holding
        fewest. The statistics kept from the last E-step stay, so the step taken again computes
        only the shards read here. Returns the shards this rank read."""
        self.group = None
        mine = np.zeros(self.layout.count)
        mine[[shard for shard, _, _ in self.shard_chunks]] = 1.0
        rows = self.exchange.rows(mine, phase="rejoin")  # all pairs: a death here fails every survivor
        layout, drop, adopt = rebalance([np.flatnonzero(row).tolist() for row in rows], self.layout.count)
        error = None
        try:
            self.resident.rank = self.rank
            self.resident.drop(drop[self.rank])
            self.resident.read([(s, self.source.parts(s, self._sub_chunks)) for s in adopt[self.rank]])
        except Exception as exc:  # carried in the count exchange below
            error = exc
        self.local_count = self.resident.count
        check = StatusCheck("reading a lost rank's shards", None, "the shards on this rank", SAME_FILES)
        summed, _ = self.exchange.checked_rows(REJOIN_HEADER, check, error, count=self.local_count)  # all pairs
        if int(summed.count) != self._count:
            raise RuntimeError(
                f"the survivors hold {int(summed.count)} of the {self._count} observations after "
                "reading the lost shards: did a file change since the handle was built?"
            )
        self.layout = layout
        return adopt[self.rank]

    def _drop_resident(self) -> None:
        self.resident.clear()
        self._kept = None

    def __len__(self) -> int:
        return self._count


def _seed_source(rng: Any) -> np.random.RandomState:
    """mixle draws per-rank seeds with ``RandomState.randint``; a ``Generator`` or a seed is
    turned into one the way mixle's dispatch does."""
    if isinstance(rng, np.random.RandomState):
        return rng
    if isinstance(rng, np.random.Generator):
        return np.random.RandomState(int(rng.integers(2**31 - 1)))
    return np.random.RandomState(rng)

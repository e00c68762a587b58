"""StreamingTokenEncodedData: each rank streams its own token shard and trains the module SPMD.

The inverse of a gather-to-root handle: there is no fold of statistics and no broadcast of a
model. Every rank holds an identical module (built from the same seed, or pushed), trains it on
micro-batches from its own shard, and the gradient all-reduce inside backward (DDP) or the
reduce-scatter (FSDP2) keeps the replicas identical step for step.

Fail together: construction and the log-density sum carry the status word in the one exchange
each makes (:class:`~mixle_nb.parallel.group_handle.GroupHandle`); how a training step fails on
every rank at once (the failed rank its own error, the others
:class:`~mixle_nb.parallel.fail_together.PeerRankError` naming it) is the training mode's:
:mod:`~mixle_nb.parallel.training_modes` (none, DDP, FSDP2: how each wraps the module, agrees to
stop, fails and exports).
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import validation
from ..checkpoint.training import TrainingCheckpoints
from ..neural.leaf import StreamingTransformerLeaf
from ..neural.source import (
    SequenceOrder,
    as_token_array,
    check_window_args,
    gather_sequences,
    gather_windows,
    window_view,
)
from .exchange import STATUS, Header, StatusCheck
from .fail_together import PeerRankError
from .group import GROUP_TIMEOUT_S, require_every_rank
from .group_handle import GroupHandle
from .training_modes import MODES, OneProcess

_PARALLEL_MODES = ("auto", "ddp", "fsdp", "none")
_PRECISIONS = ("fp32", "bf16")
_FILE_DTYPES = ("uint16", "uint32", "int32", "int64")
ELASTIC_TRAINING = (
    "elastic training resumes the survivors from the newest checkpoint, reading their new "
    "slices of the token file: build the handle with StreamingTokenEncodedData.from_file(path, "
    "..., checkpoint=DIR) on a DIR every rank can read"
)
SAME_TOKENS = "pass the same token ids, block and batch_size on every rank"
CONSTRUCTION_HEADER = Header(**STATUS, max_id=1)  # the status agrees on tokens, block, batch_size
_OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}  # mixle's estimator names none: AdamW


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[lo, hi)`` of rank's contiguous slice; lengths differ by at most one."""
    return n * rank // world, n * (rank + 1) // world


def open_token_file(path: str | os.PathLike, dtype: Any = None) -> np.ndarray:
    """A read-only memory map of a token file: a ``.npy`` (its header gives the dtype) or raw
    ``.bin`` ids of ``dtype``. Nothing is read until a slice of it is touched."""
    path = os.fspath(path)
    if path.endswith(".npy"):
        if dtype is not None:
            raise ValueError(f"{path} is a .npy file, whose header fixes the dtype; drop dtype=")
        tokens = np.load(path, mmap_mode="r")
    else:
        if dtype is None:
            raise ValueError(f"{path} is raw token ids: say their dtype, e.g. dtype='uint16'")
        validation.choice("dtype", np.dtype(dtype).name, _FILE_DTYPES)
        tokens = np.memmap(path, dtype=dtype, mode="r")
    if tokens.ndim != 1:
        raise ValueError(f"{path} holds shape {tokens.shape}; a token file is one 1-D stream of ids")
    return tokens


def _stop_requested(stop: Any) -> bool:
    if stop is None:
        return False
    return bool(stop.is_set() if hasattr(stop, "is_set") else stop())


class _Training:
    """What persists between ``pysp_seq_estimate`` calls for one module: the training mode
    (which holds the module and its wrapper), the optimizer, the steps and targets taken."""

    def __init__(self, mode: OneProcess, optimizer: torch.optim.Optimizer):
        self.mode, self.optimizer = mode, optimizer
        self.module, self.wrapped, self.device = mode.module, mode.wrapped, mode.device
        self.step = 0  # optimizer steps taken; also the cursor into the batch schedule
        self.targets = 0


class StreamingTokenEncodedData(GroupHandle):
    """Per-rank streamed token shard; ``pysp_seq_estimate`` trains the module SPMD.

    **What is counted.** A *window* is ``block + 1`` consecutive tokens of a rank's shard;
    windows start every ``block`` tokens, from an offset in ``[0, block)`` drawn anew each epoch
    (0 with ``shuffle=False``), in a shuffled order. The loss of a window is the mean next-token
    loss over all its ``block`` positions (position ``j`` predicts token ``j + 1`` from tokens
    ``0..j``, under the causal mask), so a window yields ``block`` *targets* (tokens whose loss
    was taken). A *step* is one optimizer step on ``batch_size`` windows a rank, i.e.
    ``batch_size * block`` targets a rank. An *epoch* is ``len(shard) // block - 1`` windows a
    rank, so it predicts each token of the shard about once (the smallest shard sets the step
    count, so every rank calls backward equally often; the short last batch is dropped). The
    reference (mixle) instead starts a window at every position and takes the loss of the
    token after it only: one target per window, so its epoch also predicts each token once but
    runs ``block`` times as many windows (and steps) through the model.

    The module must accept ``module(inputs, return_all_logits=True)`` and return
    ``(batch, t, vocab)`` logits, as :class:`~mixle_nb.neural.CausalLM` and mixle's
    ``CausalLM`` do. :meth:`from_file` builds the handle from a memory-mapped token file.

    ``progress``, ``seed``, ``max_steps`` and ``stop`` may also be set as attributes between
    calls.

    Checkpoints (``torch.distributed.checkpoint``; see ``mixle_nb.checkpoint.training``)
    are configured on the handle, not the estimator or a panel, because the handle alone holds
    the optimizer and the data position and runs on every rank (a notebook, ``torchrun`` or the
    cluster alike).

    Errors: construction, every DDP training step and the log-density sum fail together (see
    the module docstring). After a failed step every rank drops its optimizer state (the
    parameters are those before the failed step), so the next call starts a fresh optimizer.
    A failed FSDP2 step leaves the group unusable (see the module docstring): on a
    MixleCluster the group is formed again by itself; train a new model after it.

    Parameters
    ----------
    token_ids : array_like of int
        The token ids, the same on every rank (a memory map stays mapped: see
        :meth:`from_file`).
    block : int
        The context length: a window is ``block + 1`` tokens.
    batch_size : int
        Windows per optimizer step on each rank.
    epochs : int, default 1
        Passes over the shard per training call.
    shuffle : bool, default True
        Draw a window offset and a window order each epoch (``False``: offset 0, in order).
    shard_by_rank : bool, default True
        Each rank keeps a disjoint contiguous slice; ``False``: every rank keeps all the tokens,
        in an order of its own.
    init_process_group : bool, default True
        ``False`` with no group: one process, rank 0 of 1.
    backend : str, optional
        The backend of a group created here (default: nccl with CUDA, else gloo).
    group : ProcessGroup, optional
        The process group to train in (default: the existing default group, else one created
        from the launcher's variables; see :func:`~mixle_nb.parallel.join_group`). Every
        collective of the handle, DDP's and FSDP2's included, runs in it; ranks outside it take
        no part.
    timeout : float, default 300
        Seconds a group created here waits for its rendezvous and in a collective.
    parallel : {"auto", "ddp", "fsdp", "none"}, default "auto"
        How the module is wrapped: "auto" is "none" in one process, FSDP2 on CUDA, else DDP.
    precision : {"fp32", "bf16"}, default "fp32"
        ``"bf16"`` runs the forward pass under bfloat16 autocast.
    activation_checkpointing : bool, default False
        Recompute activations in backward (a module with that switch, as
        :func:`~mixle_nb.neural.build_causal_lm`'s).
    progress : callable, optional
        Receives ``{step, loss, targets, targets_per_s, rank}`` every ``progress_every`` steps
        and at the last step of a call, on each rank, from local values only (nothing is
        all-reduced for it). ``step`` and ``targets`` count over the handle's life; ``loss`` is
        this rank's mean loss per target since the previous report; ``targets_per_s`` is this
        rank's throughput in the current call.
    progress_every : int, default 10
        Steps between progress reports.
    seed : int, default 0
        Keys the window offsets and order (same seed: a bit-identical run on the CPU).
    max_steps : int, optional
        A cap on optimizer steps per call (default: ``epochs`` epochs).
    stop : callable or threading.Event, optional
        A zero-argument callable or an object with ``is_set()``, polled before each step. All
        ranks stop after the same step: under DDP the flag rides in the gradient all-reduce
        (zero extra collectives; stops after the step where any rank first saw it); under FSDP2
        one 1-element all-reduce runs every ``progress_every`` steps, only when ``stop`` is set
        (it must then be set on every rank); in one process it stops at once.
    checkpoint : str or os.PathLike, optional
        A directory. Every ``checkpoint_every`` optimizer steps the module, the optimizer, the
        data position (steps and targets taken) and each rank's RNG state are saved there,
        sharded under FSDP2. The first training call with a new module resumes from the newest
        complete checkpoint there, on any number of ranks (DCP reshards); a checkpoint a rank
        died writing is never loaded. On the CPU at the same world size the resumed run is the
        uninterrupted one, bit for bit.
    checkpoint_every : int, default 50
        Optimizer steps between checkpoints.
    checkpoint_async : bool, default True
        Overlap each checkpoint's write with the following steps.

    Attributes
    ----------
    rank, world : int
        This rank and the number of ranks.
    steps_per_epoch : int
        Optimizer steps in one epoch.

    Raises
    ------
    ValueError
        Bad window arguments (too few tokens for one batch, ...), an unknown ``parallel`` or
        ``precision``, or ranks that disagree on the tokens, ``block`` or ``batch_size`` (on
        every rank together).
    TypeError
        A ``progress`` that is not callable, or a ``stop`` that is neither callable nor has
        ``is_set()``.

    See Also
    --------
    TorchRunEncodedData : The EM handle.
    mixle_nb.widgets.TrainPanel : Training it with a live loss plot.
    mixle_nb.neural.StreamingTransformerLeafEstimator : The estimator it trains.

    Examples
    --------
    In one process (``init_process_group=False``); under ``torchrun`` or on a cluster's ranks
    every rank runs the same lines without it and trains its own shard:

    >>> from mixle_nb.neural import CharTokenizer, StreamingTransformerLeafEstimator, build_causal_lm
    >>> from mixle_nb.parallel import StreamingTokenEncodedData
    >>> text = "the quick brown fox jumps over the lazy dog. " * 8
    >>> tok = CharTokenizer.fit(text)
    >>> lm = StreamingTransformerLeafEstimator(
    ...     build_causal_lm(tok.vocab_size, d_model=16, n_layer=1, n_head=2, block=8, seed=0), lr=1e-2
    ... )
    >>> reports = []
    >>> with StreamingTokenEncodedData(
    ...     tok.encode(text), block=8, batch_size=4, progress=reports.append, init_process_group=False
    ... ) as th:
    ...     leaf = th.pysp_seq_estimate(lm, None)
    ...     steps = th.steps_done
    >>> th.world, th.steps_per_epoch, steps
    (1, 11, 11)
    >>> reports[-1]["step"], reports[-1]["targets"]
    (11, 352)
    """

    def __init__(
        self,
        token_ids: Any,
        *,
        block: int,
        batch_size: int,
        epochs: int = 1,
        shuffle: bool = True,
        shard_by_rank: bool = True,
        init_process_group: bool = True,
        backend: str | None = None,
        group: Any = None,
        timeout: float = GROUP_TIMEOUT_S,
        parallel: str = "auto",
        precision: str = "fp32",
        activation_checkpointing: bool = False,
        progress: Callable[[dict], None] | None = None,
        progress_every: int = 10,
        seed: int = 0,
        max_steps: int | None = None,
        stop: Any = None,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int = 50,
        checkpoint_async: bool = True,
    ):
        self._join_group(group, init_process_group=init_process_group, backend=backend, timeout=timeout)
        self._connect(0)
        failure, n_tokens, max_id = None, 0, -1
        try:  # everything that can fail on one rank only, before the construction exchange
            tokens = as_token_array(token_ids, check_values=False)
            n_tokens = len(tokens)
            check_window_args(n_tokens, block, batch_size, epochs)
            validation.choice("parallel", parallel, _PARALLEL_MODES)
            validation.choice("precision", precision, _PRECISIONS)
            if progress is not None and not callable(progress):
                raise TypeError("progress must be a callable taking one dict, or None")
            validation.positive_int("progress_every", progress_every)
            validation.optional_int("max_steps", max_steps)
            if stop is not None and not (callable(stop) or hasattr(stop, "is_set")):
                raise TypeError("stop must be None, a zero-argument callable, or have is_set()")
            self.checkpoints = (
                None
                if checkpoint is None
                else TrainingCheckpoints(
                    checkpoint, checkpoint_every, checkpoint_async, group=self._membership.group, timeout_s=timeout
                )
            )
            self._shard(tokens, block, batch_size, shard_by_rank, mapped=isinstance(token_ids, np.memmap))
            max_id = int(self.tokens.max())  # of this rank's part only: a file is never read whole
        except Exception as error:  # noqa: BLE001 - every error is carried to the peers
            failure = error
        max_id = self._construction_exchange(failure, n_tokens, max_id, block, batch_size)
        self.max_token_id = max_id
        self.block, self.batch_size, self.epochs, self.shuffle = block, batch_size, epochs, shuffle
        self.shard_by_rank, self.parallel, self.precision = shard_by_rank, parallel, precision
        self.activation_checkpointing = activation_checkpointing
        self.progress, self.progress_every = progress, progress_every
        self.seed, self.max_steps, self.stop = seed, max_steps, stop
        # Replicated data needs a per-rank order, or every rank would take the same batch.
        self._windows = window_view(self.tokens, block)
        self._order = SequenceOrder(
            len(self.tokens), block, batch_size, shuffle=shuffle, seed=seed if shard_by_rank else seed + self.rank
        )
        self._training: _Training | None = None
        self._resumed = False  # the checkpoint is loaded into the first module trained only
        self._n_tokens = n_tokens
        self._source: tuple[str, Any] | None = None  # (path, dtype) when built by from_file

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, dtype: Any = None, **kwargs: Any) -> StreamingTokenEncodedData:
        """The handle over a token file that every rank maps, reading only its own shard.

        ``path`` is a ``.npy`` of ``uint16`` / ``uint32`` ids (dtype from its header) or raw
        ids in a ``.bin`` with ``dtype`` given (e.g. ``'uint16'``, nanoGPT's format). Every
        rank memory-maps the file and keeps its slice mapped (no copy); only pages of its own
        slice are ever read, and the caller (a notebook) never holds the data. The other
        keywords are those of the constructor; training is identical to passing the same ids
        as an array.

        Parameters
        ----------
        path : str or os.PathLike
            The token file, the same on every rank.
        dtype : str, optional
            The ids' dtype of a raw file (a ``.npy`` says its own).
        **kwargs
            The constructor's keywords.

        Returns
        -------
        StreamingTokenEncodedData

        Raises
        ------
        ValueError
            A missing or needless ``dtype``, a file that is not one stream of ids, or what the
            constructor refuses (on every rank together).
        """
        handle = cls(open_token_file(path, dtype), **kwargs)
        handle._source = (os.fspath(path), dtype)
        return handle

    def check_elastic(self) -> None:
        """Raise unless the survivors of a lost rank can go on (:meth:`rejoin`): the handle reads
        a token file again, and has checkpoints to resume from.

        Raises
        ------
        ValueError
            Saying what the handle lacks and how to build one that can go on.
        """
        missing = [
            what
            for what, ok in (
                ("was built without checkpoint=", self.checkpoints is not None),
                ("holds tokens passed from memory, which the survivors cannot read again", self._source is not None),
            )
            if not ok
        ]
        if missing:
            raise ValueError(f"the handle {' and '.join(missing)}; {ELASTIC_TRAINING}")

    def _check_rejoin(self) -> None:
        self.check_elastic()

    def _read_again(self) -> list:
        """Takes this rank's slice of the token file for the new rank and world; the next
        training call wraps the module and builds the optimizer again and resumes from the newest
        complete checkpoint (DCP reshards): module, optimizer, data position, RNG. The steps after
        it are trained again, on the new slices. Returns ``[lo, hi)``, the tokens this rank now
        holds."""
        assert self.checkpoints is not None and self._source is not None  # check_elastic said so
        self.checkpoints.abandon()
        self._training, self._resumed = None, False
        if self.checkpoints.latest() is None:
            raise RuntimeError(
                f"no complete checkpoint in {self.checkpoints.root} yet (one is written every "
                f"{self.checkpoints.every} steps): nothing to resume the survivors from; "
                "call cluster.restart() and train again"
            )
        path, dtype = self._source
        tokens = open_token_file(path, dtype)
        if len(tokens) != self._n_tokens:
            raise RuntimeError(
                f"{path} holds {len(tokens)} tokens, not the {self._n_tokens} the "
                "handle was built on: did the file change?"
            )
        self._shard(tokens, self.block, self.batch_size, self.shard_by_rank, mapped=True)
        self._windows = window_view(self.tokens, self.block)
        self._order = SequenceOrder(
            len(self.tokens),
            self.block,
            self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed if self.shard_by_rank else self.seed + self.rank,
        )
        return list(shard_bounds(len(tokens), self.rank, self.world if self.shard_by_rank else 1))

    def _shard(self, tokens: np.ndarray, block: int, batch_size: int, shard_by_rank: bool, *, mapped: bool) -> None:
        """Keep this rank's slice; derive the step count from the global length, so every rank
        calls backward equally often without agreeing over the network."""
        shards = self.world if shard_by_rank else 1
        lengths = [hi - lo for lo, hi in (shard_bounds(len(tokens), r, shards) for r in range(shards))]
        if 2 * block > min(lengths):
            raise ValueError(
                f"block={block} needs rank shards of at least 2 * block = {2 * block} "
                f"tokens, more than the smallest rank shard ({min(lengths)} of "
                f"{len(tokens)} tokens over {shards} ranks); use a smaller block or "
                "more tokens"
            )
        windows = min(n // block - 1 for n in lengths)
        self.steps_per_epoch = windows // batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"batch_size={batch_size} exceeds the {windows} windows of the "
                f"smallest rank shard (one every block={block} tokens); use a "
                f"smaller batch_size or more tokens"
            )
        lo, hi = shard_bounds(len(tokens), self.rank, shards) if shard_by_rank else (0, len(tokens))
        shard = tokens[lo:hi]
        # An in-memory array is copied so the rest can be freed; a memory map stays mapped.
        self.tokens = shard.copy() if shards > 1 and not mapped else shard
        as_token_array(self.tokens)  # integer ids, none negative: checked on this rank's part

    def _construction_exchange(
        self, failure: BaseException | None, n_tokens: int, max_id: int, block: int, batch_size: int
    ) -> int:
        """One exchange of every rank's status, largest token id and the arguments every rank
        must share; returns the largest id of all shards. Raises together if any rank failed
        or disagreed (naming the ranks whose arguments differ)."""
        if self.world == 1 or not self._membership.grouped:
            if failure is not None:
                raise failure
            return max_id
        shared = f"{n_tokens} tokens, block={block}, batch_size={batch_size}"
        check = StatusCheck(
            "building a StreamingTokenEncodedData", shared, "the token ids or arguments on this rank", SAME_TOKENS
        )
        _, rows = self.exchange.checked_rows(CONSTRUCTION_HEADER, check, failure, max_id=max_id)
        return int(max(CONSTRUCTION_HEADER.read(row).max_id for row in rows))

    def __len__(self) -> int:
        return len(self.tokens)

    # -- setup ---------------------------------------------------------------------------

    def _device(self, estimator: Any) -> torch.device:
        device = torch.device(getattr(estimator, "device", "cpu"))
        if device.type == "cuda" and device.index is None:
            # The group's device: a cluster's engines set_device without LOCAL_RANK, and
            # cuda:0 on every rank would put all of a host's ranks on one GPU.
            own = self._membership.device
            device = own if own.type == "cuda" else torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return device

    def _check_module(self, estimator: Any) -> nn.Module:
        module = getattr(estimator, "module", None)
        if not isinstance(module, nn.Module):
            raise TypeError(
                "estimator must carry a torch.nn.Module as .module; use "
                "StreamingTransformerLeafEstimator(build_causal_lm(vocab))"
            )
        vocab = getattr(module, "vocab", None)
        if vocab is not None and self.max_token_id >= vocab:
            raise ValueError(
                f"token id {self.max_token_id} is outside the model's vocabulary "
                f"[0, {vocab}); build the model with vocab > {self.max_token_id}"
            )
        model_block = getattr(module, "block", None)
        if model_block is not None and self.block > model_block:
            raise ValueError(
                f"handle block={self.block} exceeds the model's block={model_block}; "
                "build the model with a block at least as long"
            )
        if "return_all_logits" not in inspect.signature(type(module).forward).parameters:
            raise TypeError(
                f"{type(module).__name__}.forward has no return_all_logits keyword; "
                "training takes the loss at every position, so the module must return "
                "(batch, t, vocab) logits for module(x, return_all_logits=True), as "
                "build_causal_lm's CausalLM (and mixle's) do"
            )
        if self.activation_checkpointing and not hasattr(module, "activation_checkpointing"):
            raise TypeError(
                f"{type(module).__name__} has no activation_checkpointing switch; "
                "use build_causal_lm or pass activation_checkpointing=False"
            )
        return module

    def _resolve_mode(self, device: torch.device) -> str:
        grouped = self._membership.grouped
        if self.parallel == "auto":
            return "none" if self.world == 1 else ("fsdp" if device.type == "cuda" else "ddp")
        if self.parallel == "none":
            if self.world > 1:
                raise ValueError(
                    f"parallel='none' on {self.world} ranks would train {self.world} "
                    "different models; use 'auto', 'ddp' or 'fsdp'"
                )
            return "none"
        if not grouped:
            raise RuntimeError(
                f"parallel={self.parallel!r} needs a torch.distributed process group; "
                "launch with torchrun or on a MixleCluster, or use parallel='none'"
            )
        if dist.get_backend(self._membership.group) == "nccl" and device.type != "cuda":
            raise RuntimeError(
                f"parallel={self.parallel!r} on the nccl backend needs a CUDA device, "
                f"got {device}; use backend='gloo' or estimator device='cuda'"
            )
        return self.parallel

    def _training_for(self, estimator: Any) -> _Training:
        module = self._check_module(estimator)
        if self._training is not None and self._training.module is module:
            for group in self._training.optimizer.param_groups:
                group["lr"] = estimator.lr
            return self._training
        device = self._device(estimator)
        mode = self._resolve_mode(device)
        module.to(device)
        if hasattr(module, "activation_checkpointing"):
            setattr(module, "activation_checkpointing", self.activation_checkpointing)  # noqa: B010 - not a Module attribute
        strategy = MODES[mode](module, device, self._membership, self.exchange, precision=self.precision)
        optimizer = _OPTIMIZERS[getattr(estimator, "optimizer_kind", "adamw")](module.parameters(), lr=estimator.lr)
        self._training = _Training(strategy, optimizer)
        if self.checkpoints is not None and not self._resumed:
            self._resumed = True
            progress = self.checkpoints.load(module, optimizer)
            if progress is not None:
                self._training.step, self._training.targets = progress["step"], progress["targets"]
        return self._training

    # -- training --------------------------------------------------------------------------

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._order.batch(*divmod(step, self.steps_per_epoch))
        inputs, targets = gather_sequences(self._windows, starts)
        return torch.from_numpy(inputs), torch.from_numpy(targets)

    def _loss(self, tr: _Training, autocast: torch.autocast) -> torch.Tensor:
        """Mean next-token loss over every position of this step's windows."""
        inputs, targets = (t.to(tr.device, non_blocking=True) for t in self._batch(tr.step))
        with autocast:
            logits = tr.wrapped(inputs, return_all_logits=True)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()  # the softmax in the loss needs fp32 range and precision
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def _fail_step(self, tr: _Training, error: BaseException | None, exchange_pending: bool) -> NoReturn:
        """Raise on every rank at once, as the training mode does; the training state is
        dropped first (DDP's reducer may be mid-step)."""
        self._training = None
        tr.mode.fail(error, exchange_pending, f"training step {tr.step + 1}")

    def _train(self, tr: _Training, n_steps: int) -> None:
        autocast = torch.autocast(tr.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")
        tr.wrapped.train()
        start, call_targets, since, loss_sum = time.perf_counter(), 0, 0, torch.zeros((), device=tr.device)
        local_stop = stopping = False
        for i in range(n_steps):
            exchanged = False
            try:
                local_stop = local_stop or _stop_requested(self.stop)  # sticky until all agree
                tr.mode.request_stop(local_stop)
                loss = self._loss(tr, autocast)
                tr.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # DDP: the step's one exchange, status words included
                exchanged = True
                if tr.mode.peer_failed:
                    self._fail_step(tr, None, exchange_pending=False)
                tr.optimizer.step()
                tr.step += 1
                stopping = tr.mode.agreed_stop(local_stop, tr.step, self.stop is not None, self.progress_every)
                n_targets = self.batch_size * self.block  # full batches only (drop_last)
                tr.targets += n_targets
                call_targets += n_targets
                if self.checkpoints is not None and self.checkpoints.due(tr.step):
                    self.checkpoints.save(tr.module, tr.optimizer, {"step": tr.step, "targets": tr.targets})
                loss_sum += loss.detach()
                since += 1
                if self.progress is not None and (tr.step % self.progress_every == 0 or stopping or i == n_steps - 1):
                    elapsed = time.perf_counter() - start
                    self.progress(
                        {
                            "step": tr.step,
                            "loss": loss_sum.item() / since,
                            "targets": tr.targets,
                            "targets_per_s": call_targets / elapsed,
                            "rank": self.rank,
                        }
                    )
                    loss_sum.zero_()
                    since = 0
            except PeerRankError:
                raise
            except Exception as error:  # noqa: BLE001 - carried to the peers, then re-raised
                # After this step's exchange, peers wait only if another step follows.
                last = exchanged and (i == n_steps - 1 or tr.mode.stop_in_exchange)
                self._fail_step(tr, error, exchange_pending=not last)
            if stopping:
                break

    @property
    def steps_done(self) -> int:
        """Optimizer steps taken so far with the current module (before training: 0, or the
        step of the checkpoint the first training call resumes from)."""
        if self._training is not None:
            return self._training.step
        found = self.checkpoints.latest() if self.checkpoints is not None and not self._resumed else None
        return 0 if found is None else found[0]

    @property
    def total_steps(self) -> int:
        """Optimizer steps in ``epochs`` epochs."""
        return self.epochs * self.steps_per_epoch

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        """Train this rank's shard for ``epochs`` epochs (or ``max_steps``), continuing any
        earlier call with the same estimator (same module: optimizer state and data cursor
        kept).

        Parameters
        ----------
        estimator : StreamingTransformerLeafEstimator
            Carries the module (the same on every rank) and the learning rate.
        prev_estimate : object
            Unused: the module carries the state.

        Returns
        -------
        StreamingTransformerLeaf
            A leaf on the live (for FSDP2: gathered) module.

        Raises
        ------
        Exception
            On every rank together when any rank failed: the failed rank its own error, the
            others :class:`~mixle_nb.parallel.fail_together.PeerRankError` naming it; after a failed FSDP2 step
            the group must be formed again."""
        require_every_rank(self._membership, "training on a StreamingTokenEncodedData")
        tr = self._training_for(estimator)
        n_steps = self.total_steps
        if self.max_steps is not None:
            n_steps = min(n_steps, self.max_steps)
        self._train(tr, n_steps)
        if self.checkpoints is not None:
            self.checkpoints.wait()
        try:
            module = tr.mode.export()
        except Exception:
            self._training = None  # FSDP2's gather of the weights failed: the group is severed
            raise
        return StreamingTransformerLeaf(module, tr.device)

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        """The estimator's module as an untrained leaf.

        Parameters
        ----------
        estimator : StreamingTransformerLeafEstimator
            Carries the module.
        rng : object
            Unused: the module's own seeded initialisation is what keeps ranks identical.
        p : float
            Unused, as ``rng``.

        Returns
        -------
        StreamingTransformerLeaf
            The leaf around the estimator's module, on the training device.

        Raises
        ------
        TypeError, ValueError
            A module the handle cannot train (see :meth:`pysp_seq_estimate`).
        """
        module = self._check_module(estimator)
        device = self._device(estimator)
        return StreamingTransformerLeaf(module.to(device), device)

    def _scores_are_summed(self) -> bool:
        return self.shard_by_rank  # replicated tokens are scored whole on each rank: no exchange

    def _local_log_density(self, model: Any) -> tuple[float, float]:
        """``(windows, total next-token log-probability)`` of this rank's tokens: the
        reference's windows (a full ``block`` of context before every token after the first
        ``block``), scored through ``model.seq_log_density``."""
        n_windows = len(self.tokens) - self.block
        count, total = 0.0, 0.0
        windows = window_view(self.tokens, self.block)
        for lo in range(0, n_windows, self.batch_size):
            starts = np.arange(lo, min(lo + self.batch_size, n_windows))
            log_p = model.seq_log_density(gather_windows(windows, starts))
            count, total = count + len(log_p), total + float(np.sum(log_p))
        return count, total

    def _drop_resident(self) -> None:
        self._training = None

"""StreamingTokenEncodedData: each rank streams its own token shard and trains the module SPMD.

The inverse of a gather-to-root handle: there is no fold of statistics and no broadcast of a
model. Every rank holds an identical module (built from the same seed, or pushed), trains it on
micro-batches from its own shard, and the gradient all-reduce inside backward (DDP) or the
reduce-scatter (FSDP2) keeps the replicas identical step for step.
"""
from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..neural.leaf import StreamingTransformerLeaf
from ..neural.source import (WindowOrder, as_token_array, check_window_args, gather_windows,
                             window_view)
from .group import join_group
from .handle import HandleLifetime

_PARALLEL_MODES = ("auto", "ddp", "fsdp", "none")
_PRECISIONS = ("fp32", "bf16")


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[lo, hi)`` of rank's contiguous slice; lengths differ by at most one."""
    return n * rank // world, n * (rank + 1) // world


def _stop_requested(stop) -> bool:
    if stop is None:
        return False
    return bool(stop.is_set() if hasattr(stop, "is_set") else stop())


class _StopSignal:
    """State of the DDP comm hook that carries one stop flag inside the gradient all-reduce."""

    def __init__(self):
        self.local = 0.0
        self.agreed: torch.Tensor | None = None


def _allreduce_carrying_stop(signal: _StopSignal, bucket):
    """DDP's mean all-reduce, with the stop flag appended to bucket 0 (no extra collective).

    Unannotated on purpose: DDP rejects a hook whose return annotation is a string."""
    world = dist.get_world_size()
    grads = bucket.buffer().div_(world)
    if bucket.index() != 0:
        return dist.all_reduce(grads, async_op=True).get_future().then(lambda f: f.value()[0])
    packed = torch.cat([grads, grads.new_tensor([signal.local])])

    def unpack(fut):
        out = fut.value()[0]
        signal.agreed = out[-1]
        return out[:-1]

    return dist.all_reduce(packed, async_op=True).get_future().then(unpack)


class _Training:
    """What persists between ``pysp_seq_estimate`` calls for one module."""

    def __init__(self, module, wrapped, optimizer, mode, device, signal, replica):
        self.module, self.wrapped, self.optimizer = module, wrapped, optimizer
        self.mode, self.device, self.signal, self.replica = mode, device, signal, replica
        self.step = 0  # optimizer steps taken; also the cursor into the batch schedule
        self.tokens = 0


class StreamingTokenEncodedData(HandleLifetime):
    """Per-rank streamed token shard; ``pysp_seq_estimate`` trains the module SPMD.

    Extension keywords (also settable as attributes between calls):

    - ``progress``: callable receiving ``{step, loss, tokens, tokens_per_s, rank}`` every
      ``progress_every`` steps and at the last step of a call, on each rank, from local values
      only (nothing is all-reduced for it). ``step`` and ``tokens`` count over the handle's life;
      ``loss`` is this rank's mean loss since the previous report; ``tokens_per_s`` is this
      rank's throughput in the current call. A token is one next-token target.
    - ``seed``: keys the shuffled window order (same seed -> bit-identical run on CPU).
    - ``max_steps``: cap on optimizer steps per call (default: ``epochs`` epochs).
    - ``stop``: a zero-argument callable or an object with ``is_set()``, polled before each
      step. All ranks stop after the same step: under DDP the flag rides in the gradient
      all-reduce (zero extra collectives; stops after the step where any rank first saw it);
      under FSDP2 one 1-element all-reduce runs every ``progress_every`` steps, only when
      ``stop`` is set (it must then be set on every rank); in one process it stops at once.
    """

    def __init__(self, token_ids: Any, *, block: int, batch_size: int, epochs: int = 1,
                 shuffle: bool = True, shard_by_rank: bool = True, init_process_group: bool = True,
                 backend: str | None = None, parallel: str = "auto", precision: str = "fp32",
                 activation_checkpointing: bool = False,
                 progress: Callable[[dict], None] | None = None, progress_every: int = 10,
                 seed: int = 0, max_steps: int | None = None, stop: Any = None):
        tokens = as_token_array(token_ids)
        check_window_args(len(tokens), block, batch_size, epochs)
        if parallel not in _PARALLEL_MODES:
            raise ValueError(f"parallel must be one of {_PARALLEL_MODES}, got {parallel!r}")
        if precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")
        if progress is not None and not callable(progress):
            raise TypeError("progress must be a callable taking one dict, or None")
        if not isinstance(progress_every, int) or progress_every <= 0:
            raise ValueError(f"progress_every must be a positive int, got {progress_every!r}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 0):
            raise ValueError(f"max_steps must be None or an int >= 0, got {max_steps!r}")
        if stop is not None and not (callable(stop) or hasattr(stop, "is_set")):
            raise TypeError("stop must be None, a zero-argument callable, or have is_set()")

        self._membership = join_group(init_process_group=init_process_group, backend=backend)
        self.rank, self.world = self._membership.rank, self._membership.world
        shards = self.world if shard_by_rank else 1
        lengths = [hi - lo for lo, hi in (shard_bounds(len(tokens), r, shards) for r in range(shards))]
        if block >= min(lengths):
            raise ValueError(f"block={block} must be smaller than the smallest rank shard "
                             f"({min(lengths)} of {len(tokens)} tokens over {shards} ranks); "
                             "use a smaller block or more tokens")
        # Every rank derives the same step count from the global length, so all ranks call
        # backward equally often without agreeing over the network.
        self.steps_per_epoch = min((n - block) // batch_size for n in lengths)
        if self.steps_per_epoch == 0:
            raise ValueError(f"batch_size={batch_size} exceeds the {min(lengths) - block} windows "
                             "of the smallest rank shard; use a smaller batch_size or more tokens")

        self.max_token_id = int(tokens.max())  # of the whole array: every rank judges alike
        lo, hi = shard_bounds(len(tokens), self.rank, shards) if shard_by_rank else (0, len(tokens))
        self.tokens = tokens[lo:hi].copy() if shards > 1 else tokens  # own copy frees the rest
        self.block, self.batch_size, self.epochs, self.shuffle = block, batch_size, epochs, shuffle
        self.shard_by_rank, self.parallel, self.precision = shard_by_rank, parallel, precision
        self.activation_checkpointing = activation_checkpointing
        self.progress, self.progress_every = progress, progress_every
        self.seed, self.max_steps, self.stop = seed, max_steps, stop
        # Replicated data needs a per-rank order, or every rank would take the same batch.
        self._windows = window_view(self.tokens, block)
        self._order = WindowOrder(len(self.tokens) - block, batch_size, shuffle=shuffle,
                                  seed=seed if shard_by_rank else seed + self.rank)
        self._training: _Training | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    # -- setup ---------------------------------------------------------------------------

    def _device(self, estimator) -> torch.device:
        device = torch.device(getattr(estimator, "device", "cpu"))
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return device

    def _check_module(self, estimator) -> nn.Module:
        module = getattr(estimator, "module", None)
        if not isinstance(module, nn.Module):
            raise TypeError("estimator must carry a torch.nn.Module as .module; use "
                            "StreamingTransformerLeafEstimator(build_causal_lm(vocab))")
        vocab = getattr(module, "vocab", None)
        if vocab is not None and self.max_token_id >= vocab:
            raise ValueError(f"token id {self.max_token_id} is outside the model's vocabulary "
                             f"[0, {vocab}); build the model with vocab > {self.max_token_id}")
        model_block = getattr(module, "block", None)
        if model_block is not None and self.block > model_block:
            raise ValueError(f"handle block={self.block} exceeds the model's block={model_block}; "
                             "build the model with a block at least as long")
        if self.activation_checkpointing and not hasattr(module, "activation_checkpointing"):
            raise TypeError(f"{type(module).__name__} has no activation_checkpointing switch; "
                            "use build_causal_lm or pass activation_checkpointing=False")
        return module

    def _resolve_mode(self, device: torch.device) -> str:
        grouped = dist.is_available() and dist.is_initialized()
        if self.parallel == "auto":
            return "none" if self.world == 1 else ("fsdp" if device.type == "cuda" else "ddp")
        if self.parallel == "none":
            if self.world > 1:
                raise ValueError(f"parallel='none' on {self.world} ranks would train {self.world} "
                                 "different models; use 'auto', 'ddp' or 'fsdp'")
            return "none"
        if not grouped:
            raise RuntimeError(f"parallel={self.parallel!r} needs a torch.distributed process group; "
                               "launch with torchrun or on a MixleCluster, or use parallel='none'")
        if dist.get_backend() == "nccl" and device.type != "cuda":
            raise RuntimeError(f"parallel={self.parallel!r} on the nccl backend needs a CUDA device, "
                               f"got {device}; use backend='gloo' or estimator device='cuda'")
        return self.parallel

    def _training_for(self, estimator) -> _Training:
        module = self._check_module(estimator)
        if self._training is not None and self._training.module is module:
            for group in self._training.optimizer.param_groups:
                group["lr"] = estimator.lr
            return self._training
        device = self._device(estimator)
        mode = self._resolve_mode(device)
        module.to(device)
        if hasattr(module, "activation_checkpointing"):
            module.activation_checkpointing = self.activation_checkpointing
        signal, replica, wrapped = _StopSignal(), None, module
        if mode == "ddp":
            # init_sync=False: replicas are identical by construction, so no broadcast.
            wrapped = nn.parallel.DistributedDataParallel(
                module, device_ids=[device.index] if device.type == "cuda" else None,
                forward_sync_buffers=False, init_sync=False)
            wrapped.register_comm_hook(signal, _allreduce_carrying_stop)
        elif mode == "fsdp":
            replica = self._shard_fsdp(module)
        optimizer = torch.optim.AdamW(module.parameters(), lr=estimator.lr)
        self._training = _Training(module, wrapped, optimizer, mode, device, signal, replica)
        return self._training

    def _shard_fsdp(self, module: nn.Module) -> nn.Module:
        """Shard each block, then the root; return a meta-device twin to export full weights into."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        blocks = getattr(module, "blocks", None)
        if blocks is None:
            raise TypeError(f"parallel='fsdp' shards module.blocks one by one; "
                            f"{type(module).__name__} has no .blocks")
        replica = copy.deepcopy(module).to("meta")
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if self.precision == "bf16" else MixedPrecisionPolicy())
        for blk in blocks:
            fully_shard(blk, mp_policy=policy)
        fully_shard(module, mp_policy=policy)
        return replica

    # -- training --------------------------------------------------------------------------

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self._order.batch(*divmod(step, self.steps_per_epoch))
        contexts, next_tokens = gather_windows(self._windows, starts)
        return torch.from_numpy(contexts), torch.from_numpy(next_tokens)

    def _agreed_stop(self, tr: _Training, local: bool) -> bool:
        if tr.mode == "none":
            return local
        if tr.mode == "ddp":
            return tr.signal.agreed is not None and bool(tr.signal.agreed.item() > 0)
        if self.stop is None or tr.step % self.progress_every:
            return False
        flag = torch.tensor([float(local)], device=tr.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def _train(self, tr: _Training, n_steps: int) -> None:
        autocast = torch.autocast(tr.device.type, dtype=torch.bfloat16,
                                  enabled=self.precision == "bf16")
        tr.wrapped.train()
        start, call_tokens, since, loss_sum = time.perf_counter(), 0, 0, torch.zeros((), device=tr.device)
        local_stop = False
        for i in range(n_steps):
            local_stop = local_stop or _stop_requested(self.stop)  # sticky until all agree
            tr.signal.local = float(local_stop)
            contexts, next_tokens = (t.to(tr.device, non_blocking=True) for t in self._batch(tr.step))
            with autocast:
                logits = tr.wrapped(contexts)
            if logits.dtype in (torch.bfloat16, torch.float16):
                logits = logits.float()  # the softmax in the loss needs fp32 range and precision
            loss = F.cross_entropy(logits, next_tokens)
            tr.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            tr.optimizer.step()
            tr.step += 1
            tr.tokens += len(next_tokens)
            call_tokens += len(next_tokens)
            loss_sum += loss.detach()
            since += 1
            stopping = self._agreed_stop(tr, local_stop)
            if self.progress is not None and (tr.step % self.progress_every == 0
                                              or stopping or i == n_steps - 1):
                elapsed = time.perf_counter() - start
                self.progress({"step": tr.step, "loss": loss_sum.item() / since, "tokens": tr.tokens,
                               "tokens_per_s": call_tokens / elapsed, "rank": self.rank})
                loss_sum.zero_()
                since = 0
            if stopping:
                break

    def _export(self, tr: _Training) -> nn.Module:
        """The plain trained module; FSDP2's shards are gathered into the replica once per call."""
        if tr.mode != "fsdp":
            return tr.module
        from torch.distributed.tensor import DTensor

        full = {k: v.full_tensor() if isinstance(v, DTensor) else v
                for k, v in tr.module.state_dict().items()}
        if next(tr.replica.parameters()).is_meta:
            tr.replica.to_empty(device=tr.device)
        tr.replica.load_state_dict(full)
        return tr.replica

    @property
    def steps_done(self) -> int:
        """Optimizer steps taken so far with the current module (0 before training)."""
        return 0 if self._training is None else self._training.step

    @property
    def total_steps(self) -> int:
        """Optimizer steps in ``epochs`` epochs."""
        return self.epochs * self.steps_per_epoch

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        """Train this rank's shard for ``epochs`` epochs (or ``max_steps``), continuing any
        earlier call with the same estimator (same module: optimizer state and data cursor
        kept). Returns a leaf on the live module; ``prev_estimate`` is not needed because the
        module carries the state."""
        tr = self._training_for(estimator)
        n_steps = self.total_steps
        if self.max_steps is not None:
            n_steps = min(n_steps, self.max_steps)
        self._train(tr, n_steps)
        return StreamingTransformerLeaf(self._export(tr), tr.device)

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        """The estimator's module as an untrained leaf (``rng`` and ``p`` are unused: the
        module's own seeded initialisation is what keeps ranks identical)."""
        module = self._check_module(estimator)
        device = self._device(estimator)
        return StreamingTransformerLeaf(module.to(device), device)

    def pysp_seq_log_density_sum(self, model: Any) -> tuple[float, float]:
        """``(windows, total next-token log-probability)`` over every shard, summed across ranks."""
        n_windows = len(self.tokens) - self.block
        count, total = 0.0, 0.0
        for lo in range(0, n_windows, self.batch_size):
            starts = np.arange(lo, min(lo + self.batch_size, n_windows))
            log_p = model.seq_log_density(gather_windows(self._windows, starts))
            count, total = count + len(log_p), total + float(log_p.sum())
        if self.world > 1 and self.shard_by_rank:
            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            sums = torch.tensor([count, total], dtype=torch.float64, device=device)
            dist.all_reduce(sums)
            count, total = sums.tolist()
        return count, total

    def close(self) -> None:
        """Drop the training state; destroy the process group only if this handle created it."""
        self._training = None
        self._membership.release()

"""Training checkpoints with ``torch.distributed.checkpoint`` (DCP): the module, the optimizer,
the data position and every rank's RNG state, every N steps, sharded under FSDP2.

Each checkpoint is a directory ``step-<8 digits>`` under the run's root. DCP writes the ranks'
shards first and its ``.metadata`` file last, atomically (write, fsync, rename), once every
rank has written its part: a directory without ``.metadata`` is torn (a rank died mid-save)
and is never loaded, and removed when the run resumes. DCP reshards on load, so a checkpoint
written by 2 ranks resumes on 1 or 4.

``asynchronous=True`` uses ``dcp.async_save``: the state is copied to host memory at the step
(which training must wait for, or it would change under the copy) and written to disk by a
background thread while training goes on, over a gloo group of its own so that its
collectives never interleave with the training step's. At most one save is in flight: the next
one, and the end of a training call, wait for it. Saves and loads run in the training's process
group (``group``; ``None``: the default group).
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import validation

_STEP_DIR = re.compile(r"^step-(\d{8})$")
KEEP = 2  # complete checkpoints kept; older ones are removed once a newer one is complete


@contextmanager
def _one_process_quietly() -> Iterator[None]:
    """DCP warns that it assumes one process whenever there is no group, even when told so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _complete(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".metadata"))


class TrainingCheckpoints:
    """The checkpoints of one training run under ``root``, one every ``every`` steps."""

    def __init__(
        self,
        root: str | os.PathLike,
        every: int,
        asynchronous: bool = True,
        *,
        group: Any = None,
        timeout_s: float | None = None,
    ):
        self.root = os.fspath(root)
        self.every = validation.positive_int("checkpoint_every", every)
        self.asynchronous = bool(asynchronous)
        self.group = group  # the training's; async saves get a gloo group of its ranks with timeout_s (None: torch's)
        self.timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
        self._pending: Future[Any] | None = None  # the save in flight
        # (the default group it was made in, the gloo group async saves use)
        self._group: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None

    def __repr__(self) -> str:
        return f"TrainingCheckpoints({self.root!r}, every={self.every}, asynchronous={self.asynchronous})"

    def steps(self) -> list[tuple[int, str, bool]]:
        """(step, directory, complete) of every checkpoint directory, oldest first."""
        found = []
        for name in os.listdir(self.root) if os.path.isdir(self.root) else []:
            match = _STEP_DIR.match(name)
            if match:
                path = os.path.join(self.root, name)
                found.append((int(match.group(1)), path, _complete(path)))
        return sorted(found)

    def latest(self) -> tuple[int, str] | None:
        """(step, directory) of the newest complete checkpoint, or None."""
        complete = [(step, path) for step, path, done in self.steps() if done]
        return complete[-1] if complete else None

    def due(self, step: int) -> bool:
        return step % self.every == 0

    # ---- saving

    def save(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, progress: dict) -> None:
        """Checkpoint at ``progress["step"]`` (every rank calls this at the same step)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()
        model_state, optim_state = get_state_dict(module, optimizer)
        rank = self._rank()
        state = {
            "model": model_state,
            "optim": optim_state,
            "progress": dict(progress),
            "rng": {f"rank{rank}": torch.get_rng_state()},
        }
        path = os.path.join(self.root, f"step-{progress['step']:08d}")
        os.makedirs(path, exist_ok=True)
        import torch.distributed.checkpoint as dcp

        if self.asynchronous and dist.is_initialized():
            world = dist.group.WORLD  # the default group (its public name), set: a group is initialised
            assert world is not None
            if self._group is None or self._group[0] is not world:  # none yet, or a new default group
                ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
                self._group = (
                    world,
                    dist.new_group(
                        ranks, backend="gloo", timeout=self.timeout, use_local_synchronization=ranks is not None
                    ),
                )
            pending = dcp.async_save(state, checkpoint_id=path, process_group=self._group[1])
            if not isinstance(pending, Future):  # a staged save's response comes only with an async_stager
                raise TypeError(f"dcp.async_save returned {type(pending).__name__}, not a Future")
            self._pending = pending
        else:
            with _one_process_quietly():
                dcp.save(state, checkpoint_id=path, process_group=self.group, no_dist=not dist.is_initialized())
            self._prune()

    def wait(self) -> None:
        """Finish the save in flight, if any (raising its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
            self._prune()

    def abandon(self) -> None:
        """Forget the save in flight (its group lost a rank: it never completes, and a
        checkpoint without ``.metadata`` is never loaded)."""
        self._pending = None

    def _prune(self) -> None:
        """On rank 0: remove all but the :data:`KEEP` newest complete checkpoints, and torn
        directories older than the newest complete one."""
        if self._rank() != 0:
            return
        steps = self.steps()
        complete = [step for step, _, done in steps if done]
        kept = set(complete[-KEEP:])
        for step, path, _done in steps:
            if step not in kept and complete and step < complete[-1]:
                shutil.rmtree(path, ignore_errors=True)

    def _rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_initialized() else 0

    # ---- loading

    def load(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Load the newest complete checkpoint into ``module`` and ``optimizer`` (resharded to
        this run's ranks), this rank's RNG state if it was saved; its ``progress``, or None
        when there is none. Torn directories are removed (by rank 0)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        found = self.latest()
        if found is None:
            return None
        step, path = found
        rank = self._rank()
        saved_keys = FileSystemReader(path).read_metadata().state_dict_metadata
        model_state, optim_state = get_state_dict(module, optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state, "progress": {"step": 0, "targets": 0}}
        rng_key = f"rank{rank}"
        if f"rng.{rng_key}" in saved_keys:  # a rank that did not exist then keeps its own
            state["rng"] = {rng_key: torch.get_rng_state()}
        with _one_process_quietly():
            dcp.load(state, checkpoint_id=path, process_group=self.group, no_dist=not dist.is_initialized())
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if "rng" in state:
            torch.set_rng_state(state["rng"][rng_key])
        if rank == 0:
            for later, torn, done in self.steps():
                if not done and later > step:
                    shutil.rmtree(torn, ignore_errors=True)
        return dict(state["progress"])

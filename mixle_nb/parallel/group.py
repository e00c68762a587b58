"""Joining (or adopting) the torch.distributed process group a handle runs in.

Both handles go through :func:`join_group`, so they agree on one rule: an existing group is
used as it is (the cluster's engines, a script that called ``init_process_group``); otherwise
the launcher's variables create one, which the handle then owns and destroys at ``close()``;
without those variables it is an error that says how to launch, unless the caller asked for a
one-process run with ``init_process_group=False``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Optional

import torch
import torch.distributed as dist

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# Which default-group ranks the running call was sent to, or None when unknown (torchrun: every
# rank runs the script). A MixleCluster's engines install one (mixle_nb/cluster/engine.py).
_call_ranks: Optional[Callable[[], Optional[Collection[int]]]] = None


@dataclass
class GroupMembership:
    """Where this process stands: its rank and world in ``group`` (``None``: the default group,
    or no group at all when ``world == 1`` and nothing was joined), the device its tensors
    live on, and whether it created the default group and so must destroy it."""

    rank: int
    world: int
    group: Any
    device: torch.device
    owned: bool

    @property
    def grouped(self) -> bool:
        """Whether a process group exists to run collectives in."""
        return dist.is_available() and dist.is_initialized()

    def global_rank(self, group_rank: int) -> int:
        """The default group's rank of ``group_rank`` in ``group``."""
        return dist.get_global_rank(self.group, group_rank) if self.group is not None else group_rank

    def release(self) -> None:
        """Destroy the default group if this membership created it; idempotent."""
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()
        self.owned = False


def _device_for(backend: str) -> torch.device:
    """The rank's CUDA device under nccl (``LOCAL_RANK`` when the launcher set it), else CPU."""
    if backend != "nccl":
        return torch.device("cpu")
    if "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return torch.device("cuda", torch.cuda.current_device())


def join_group(group: Any = None, *, init_process_group: bool = True,
               backend: Optional[str] = None) -> GroupMembership:
    """Adopt ``group`` or the existing default group, or create the default group from the
    launcher's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.

    ``init_process_group=False`` with no group asks for a one-process run (rank 0 of 1)."""
    if group is not None or (dist.is_available() and dist.is_initialized()):
        chosen = dist.get_backend(group)
        return GroupMembership(dist.get_rank(group), dist.get_world_size(group), group,
                               _device_for(chosen), owned=False)
    if not init_process_group:
        return GroupMembership(0, 1, None, torch.device("cpu"), owned=False)
    missing = [v for v in LAUNCHER_VARIABLES if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"no torch.distributed process group exists and the launcher variables {missing} are "
            "not set: run under `torchrun --nproc_per_node N script.py`, on a MixleCluster, or "
            "after torch.distributed.init_process_group(); pass init_process_group=False to run "
            "as one process")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = _device_for(backend)
    dist.init_process_group(backend=backend)
    return GroupMembership(dist.get_rank(), dist.get_world_size(), None, device, owned=True)


def set_call_ranks_source(source: Optional[Callable[[], Optional[Collection[int]]]]) -> None:
    """Install ``source()``: the default-group ranks the running call was sent to (``None``:
    not known). Without a source, every call counts as running on every rank."""
    global _call_ranks
    _call_ranks = source


def require_every_rank(membership: GroupMembership, operation: str) -> None:
    """Raise, before any collective, when the running call was sent to only some ranks of
    ``membership``'s group: those would wait in the first collective for ranks that never come,
    until the group timeout. Costs no communication; every rank sent the call raises alike."""
    if _call_ranks is None or membership.world == 1:
        return
    ranks = _call_ranks()
    if ranks is None:
        return
    members = [membership.global_rank(r) for r in range(membership.world)]
    if set(members) <= set(ranks):
        return
    running = sorted(set(members) & set(ranks))
    raise RuntimeError(f"{operation} needs every rank of the group; this call runs on ranks {running} "
                       f"of {members} (--targets / targets=): run it on every rank, without --targets")

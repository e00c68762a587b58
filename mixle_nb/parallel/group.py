"""Joining (or adopting) the torch.distributed process group a handle runs in.

Both handles go through :func:`join_group`, so they agree on one rule: an existing group is
used as it is (the cluster's engines, a script that called ``init_process_group``); otherwise
the launcher's variables create one, which the handle then owns and destroys at ``close()``;
without those variables it is an error that says how to launch, unless the caller asked for a
one-process run with ``init_process_group=False``.

A default group created here goes through :func:`~mixle_nb.parallel.severing.init_default_group`,
which remembers its connections so that they can be severed (``severing.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import validation
from . import severing, slurm_env
from .severing import init_default_group

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
GROUP_TIMEOUT_S = 300.0  # a group created here: how long the rendezvous waits for every rank, and a
# collective for a missing peer (torch's default is 30 minutes); a slow rank's step must fit in it

# Which default-group ranks the running call was sent to, or None when unknown (torchrun: every
# rank runs the script). A MixleCluster's engines install one (mixle_nb/cluster/engine.py).
_call_ranks: Callable[[], Collection[int] | None] | None = None
# ((MASTER_ADDR, MASTER_PORT, rank, world), store) opened by join_group, and the groups formed in it
_launcher_store: tuple[tuple, dist.Store] | None = None
_groups_formed = 0


@dataclass
class GroupMembership:
    """Where this process stands in the process group a handle runs in.

    Parameters
    ----------
    rank : int
        This process's rank in ``group``.
    world : int
        The number of ranks in ``group``.
    group : ProcessGroup or None
        The group (``None``: the default group, or no group at all when ``world == 1`` and
        nothing was joined).
    device : torch.device
        Where its tensors live.
    owned : bool
        Whether it created the default group, and so must destroy it (:meth:`release`).

    See Also
    --------
    join_group : What makes one.

    Examples
    --------
    >>> from mixle_nb.parallel import join_group
    >>> membership = join_group(init_process_group=False)
    >>> membership.rank, membership.world, membership.grouped, membership.global_rank(0)
    (0, 1, False, 0)
    """

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
        """The default group's rank of a rank of ``group``.

        Parameters
        ----------
        group_rank : int
            A rank in ``group``.

        Returns
        -------
        int
            Its rank in the default group.
        """
        return dist.get_global_rank(self.group, group_rank) if self.group is not None else group_rank

    def release(self) -> None:
        """Destroy the default group if this membership created it; idempotent."""
        if self.owned:
            leave_default_group()
        self.owned = False


def _device_for(backend: str) -> torch.device:
    """The rank's CUDA device under nccl (a Slurm task's own, or ``LOCAL_RANK`` when the
    launcher set it), else CPU."""
    if backend != "nccl":
        return torch.device("cpu")
    if slurm_env.in_slurm_step() and "TORCHELASTIC_RUN_ID" not in os.environ:  # srun, not torchrun
        torch.cuda.set_device(slurm_env.task_device())
    elif "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return torch.device("cuda", torch.cuda.current_device())


def join_group(
    group: Any = None, *, init_process_group: bool = True, backend: str | None = None, timeout: float = GROUP_TIMEOUT_S
) -> GroupMembership:
    """Adopt a process group or create the default one, as both handles do.

    ``group`` or the existing default group is used as it is (the cluster's engines, a script
    that called ``init_process_group``); otherwise the default group is created from the
    launcher's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (under ``srun``,
    derived from Slurm's variables), and the membership
    owns it.

    Parameters
    ----------
    group : ProcessGroup, optional
        The group to adopt (default: the default group, if one exists).
    init_process_group : bool, default True
        ``False`` with no group asks for a one-process run (rank 0 of 1).
    backend : str, optional
        The backend of a group created here (default: nccl with CUDA, else gloo).
    timeout : float, default 300
        Seconds a group created here waits for its rendezvous and in a collective (an adopted
        group keeps its own).

    Returns
    -------
    GroupMembership
        This process's rank, world, group and device.

    Raises
    ------
    ValueError
        ``timeout`` is not a positive number.
    RuntimeError
        No group exists and the launcher's variables are missing (the message says how to
        launch).

    Examples
    --------
    >>> from mixle_nb.parallel import join_group
    >>> join_group(init_process_group=False).world
    1
    >>> join_group(timeout=0, init_process_group=False)
    Traceback (most recent call last):
    ...
    ValueError: timeout must be > 0.0; got 0
    """
    wait = timedelta(seconds=validation.positive_real("timeout", timeout))
    if group is not None or (dist.is_available() and dist.is_initialized()):
        chosen = dist.get_backend(group)
        return GroupMembership(
            dist.get_rank(group), dist.get_world_size(group), group, _device_for(chosen), owned=False
        )
    if not init_process_group:
        return GroupMembership(0, 1, None, torch.device("cpu"), owned=False)
    os.environ.update(slurm_env.launcher_variables())
    missing = [v for v in LAUNCHER_VARIABLES if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"no torch.distributed process group exists and the launcher variables {missing} are "
            "not set: run under `torchrun --nproc_per_node N script.py` or `srun python script.py`, "
            "on a MixleCluster, or "
            "after torch.distributed.init_process_group(); pass init_process_group=False to run "
            "as one process"
        )
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = _device_for(backend)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_default_group(
        backend, store=_next_launcher_store(rank, world, wait), rank=rank, world_size=world, timeout=wait
    )
    return GroupMembership(dist.get_rank(), dist.get_world_size(), None, device, owned=True)


def _next_launcher_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """A fresh namespace in this process's one rendezvous store at ``MASTER_ADDR:MASTER_PORT``.

    torch's own ``env://`` rendezvous opens a new store per group on the same port, so a rank that
    leaves one handle's group and joins the next before rank 0 has left the first connects to the
    old store and waits forever (seen with two handles in a row). Here the store is opened once per
    process and address, held for its life, and every group formed through it gets the next
    prefix; every rank forms its groups in the same order (construction is collective), so the
    prefixes agree. Under torchrun every rank connects to the agent's store, as torch does. The
    store's ``timeout`` is that of the first group formed through it."""
    global _launcher_store, _groups_formed
    where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world)
    if _launcher_store is None or _launcher_store[0] != where:
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(
            where[0], where[1], world, is_master=rank == 0 and not agent_store, timeout=timeout, multi_tenant=True
        )
        _launcher_store, _groups_formed = (where, store), 0
    _groups_formed += 1
    return dist.PrefixStore(f"mixle_nb/group{_groups_formed}", _launcher_store[1])


def leave_default_group() -> None:
    """Destroy the default group, its connections shut down first. An interrupt can leave an
    operation in flight that a peer never joins, and ``destroy_process_group`` waits for it; the
    peer's own destroy does not always end it, because a request object kept alive there (by an
    exception's traceback) keeps gloo's connections open. Then the wait lasts the group timeout."""
    if dist.is_available() and dist.is_initialized():
        severing.sever_group()
        dist.destroy_process_group()
    severing.forget()


def set_call_ranks_source(source: Callable[[], Collection[int] | None] | None) -> None:
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
    raise RuntimeError(
        f"{operation} needs every rank of the group; this call runs on ranks {running} "
        f"of {members} (--targets / targets=): run it on every rank, without --targets"
    )

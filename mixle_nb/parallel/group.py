"""Joining (or adopting) the torch.distributed process group a handle runs in.

Both handles go through :func:`join_group`, so they agree on one rule: an existing group is
used as it is (the cluster's engines, a script that called ``init_process_group``); otherwise
the launcher's variables create one, which the handle then owns and destroys at ``close()``;
without those variables it is an error that says how to launch, unless the caller asked for a
one-process run with ``init_process_group=False``.

A default group created here (:func:`init_default_group`: by :func:`join_group`, or by a
MixleCluster's engines) has its connections remembered, so that :func:`sever_group` can shut
them down: a peer blocked in a collective with this process then fails at once ("Connection
closed by peer") instead of at the group timeout. The group is unusable afterwards.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Collection, Optional

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from . import slurm_env

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# Which default-group ranks the running call was sent to, or None when unknown (torchrun: every
# rank runs the script). A MixleCluster's engines install one (mixle_nb/cluster/engine.py).
_call_ranks: Optional[Callable[[], Optional[Collection[int]]]] = None
# (fd, "socket:[inode]") of the connections the default group opened, when it was created here
_group_sockets: dict[int, str] = {}
_severed = False
# ((MASTER_ADDR, MASTER_PORT, rank, world), store) opened by join_group, and the groups formed in it
_launcher_store: Optional[tuple[tuple, dist.Store]] = None
_groups_formed = 0


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


def join_group(group: Any = None, *, init_process_group: bool = True,
               backend: Optional[str] = None) -> GroupMembership:
    """Adopt ``group`` or the existing default group, or create the default group from the
    launcher's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (under ``srun``,
    derived from Slurm's variables: :mod:`~mixle_nb.parallel.slurm_env`).

    ``init_process_group=False`` with no group asks for a one-process run (rank 0 of 1)."""
    if group is not None or (dist.is_available() and dist.is_initialized()):
        chosen = dist.get_backend(group)
        return GroupMembership(dist.get_rank(group), dist.get_world_size(group), group,
                               _device_for(chosen), owned=False)
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
            "as one process")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = _device_for(backend)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_default_group(backend, store=_next_launcher_store(rank, world), rank=rank, world_size=world)
    return GroupMembership(dist.get_rank(), dist.get_world_size(), None, device, owned=True)


def _next_launcher_store(rank: int, world: int) -> dist.Store:
    """A fresh namespace in this process's one rendezvous store at ``MASTER_ADDR:MASTER_PORT``.

    torch's own ``env://`` rendezvous opens a new store per group on the same port, so a rank that
    leaves one handle's group and joins the next before rank 0 has left the first connects to the
    old store and waits forever (seen with two handles in a row). Here the store is opened once per
    process and address, held for its life, and every group formed through it gets the next
    prefix; every rank forms its groups in the same order (construction is collective), so the
    prefixes agree. Under torchrun every rank connects to the agent's store, as torch does."""
    global _launcher_store, _groups_formed
    where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world)
    if _launcher_store is None or _launcher_store[0] != where:
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(where[0], where[1], world, is_master=rank == 0 and not agent_store,
                              timeout=default_pg_timeout, multi_tenant=True)
        _launcher_store, _groups_formed = (where, store), 0
    _groups_formed += 1
    return dist.PrefixStore(f"mixle_nb/group{_groups_formed}", _launcher_store[1])


def _open_sockets() -> dict[int, str]:
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while listing
            continue
        if link.startswith("socket:["):
            found[int(fd)] = link
    return found


def _ports(fd: int) -> set[int]:
    """The local and remote TCP ports of the socket ``fd`` (empty for other sockets)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # closed since it was listed
        return set()
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return set()
        ports = {sock.getsockname()[1]}
        try:
            ports.add(sock.getpeername()[1])
        except OSError:  # not connected
            pass
        return ports
    except OSError:
        return set()
    finally:
        sock.detach()


def init_default_group(backend: str, **options: Any) -> None:
    """``torch.distributed.init_process_group(backend, **options)``, remembering the
    connections it opens for :func:`sever_group` — not those of a rendezvous store it opens
    itself at ``MASTER_PORT``, which the failure path still needs."""
    global _severed
    before = _open_sockets()
    dist.init_process_group(backend, **options)
    store_port = None if "store" in options else int(os.environ.get("MASTER_PORT", "0"))
    _group_sockets.clear()
    _group_sockets.update({fd: link for fd, link in _open_sockets().items()
                           if before.get(fd) != link and store_port not in _ports(fd)})
    _severed = False


def sever_group() -> int:
    """Shut down this process's connections to its peers in the default group (not the
    listening socket, whose loss gloo treats as fatal), so a peer waiting on this process in a
    collective raises now. Only a group made by :func:`init_default_group` is known here;
    returns how many connections were shut down (0: none known)."""
    global _severed
    still_open = _open_sockets()
    severed = 0
    for fd, link in _group_sockets.items():
        if still_open.get(fd) != link:  # gloo closed it, and the number may be reused
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # closed since it was listed
            continue
        try:
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)
                severed += 1
        except OSError:  # already disconnected
            pass
        finally:
            sock.detach()  # gloo still owns the descriptor
    _severed = _severed or severed > 0
    return severed


def group_severed() -> bool:
    """Whether :func:`sever_group` shut the default group's connections down (it must be
    formed again)."""
    return _severed


def leave_default_group() -> None:
    """Destroy the default group, its connections shut down first. An interrupt can leave an
    operation in flight that a peer never joins, and ``destroy_process_group`` waits for it; the
    peer's own destroy does not always end it, because a request object kept alive there (by an
    exception's traceback) keeps gloo's connections open. Then the wait lasts the group timeout."""
    global _severed
    if dist.is_available() and dist.is_initialized():
        sever_group()
        dist.destroy_process_group()
    _group_sockets.clear()
    _severed = False


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

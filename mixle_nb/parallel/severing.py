"""Severing a default group: shutting down this process's connections to its peers.

A default group created by :func:`init_default_group` (by ``group.join_group``, or by a
MixleCluster's engines) has its connections remembered, so that :func:`sever_group` can shut
them down: a peer blocked in a collective with this process then fails at once ("Connection
closed by peer") instead of at the group timeout. The group is unusable afterwards.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist

# (fd, "socket:[inode]") of the connections the default group opened, when it was created here
_group_sockets: dict[int, str] = {}
_severed = False


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
    _group_sockets.update(
        {fd: link for fd, link in _open_sockets().items() if before.get(fd) != link and store_port not in _ports(fd)}
    )
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


def forget() -> None:
    """The default group is gone: no connection of it is remembered, none severed."""
    global _severed
    _group_sockets.clear()
    _severed = False

"""What the cluster runs on its engines: describe the engine, join, leave and sever the group.

These functions are shipped to the engines by reference, so they live at module level and
import torch inside (the client never needs it). The group is formed through
:func:`mixle_nb.parallel.severing.init_default_group`, which remembers its connections, so that
:func:`sever_group` can shut them down: a peer blocked in a collective on this engine then fails
at once ("Connection closed by peer") instead of at the group timeout.

Every request the cluster sends carries the ranks it was sent to, as its ipyparallel label
(:func:`call_label`); :func:`call_ranks` reads it back on the engine, so a handle asked to
work on only some ranks raises at once instead of waiting for the others.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import timedelta

import psutil

from .ipyparallel_internals import engine_interface

_CALL_LABEL = "mixle_nb call on ranks "


def call_label(ranks: Sequence[int]) -> str:
    """The label of a request sent to ``ranks`` (carried in its metadata: no extra message)."""
    return _CALL_LABEL + ",".join(str(r) for r in ranks)


def call_ranks() -> list[int] | None:
    """The ranks the request running on this engine was sent to; ``None`` for a request that
    did not come from the cluster's calls (ipyparallel's own ``%px``, a view of one's own)."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    label = (kernel.get_parent("shell").get("metadata") or {}).get("label")
    if not isinstance(label, str) or not label.startswith(_CALL_LABEL):
        return None
    return [int(r) for r in label[len(_CALL_LABEL) :].split(",")]


def describe() -> dict:
    """Identity of this engine; importing torch here overlaps it with other engines' startup.

    Also starts the engine's watch of its controller, and switches it to plain tracebacks:
    IPython's default context mode parses every frame's source file, which for
    torch.distributed's frames delays a rank's first error by about a second.
    """
    import torch
    from IPython import get_ipython

    from . import controller_watch

    shell = get_ipython()
    if shell is not None:
        shell.InteractiveTB.set_mode("Plain")
    controller_watch.start()  # the engine ends when its controller does (owner dead, not detached)

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def loopback_interface() -> str:
    """Name of the interface that carries 127.0.0.1 (``lo`` on Linux)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
            return name
    raise RuntimeError("no network interface has 127.0.0.1; cannot pin gloo to loopback")


def controller_host() -> str:
    """The controller's address as this engine reached it: on the network every host shares."""
    return engine_interface().split("://")[-1]


def local_address_toward(peer_host: str) -> str:
    """The address of this host on the route to ``peer_host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect((peer_host, 9))  # UDP connect sends nothing; it only picks the route
        return udp.getsockname()[0]


def interface_toward(peer_host: str) -> str:
    """Name of the interface that carries this host's route to ``peer_host``."""
    address = local_address_toward(peer_host)
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    raise RuntimeError(f"no interface carries {address}, the route to {peer_host}")


def rendezvous_address() -> tuple[str, int]:
    """(this host's address on the route to the controller, which every engine reaches, and a
    free TCP port on it): where engine 0 offers the group's ``TCPStore``."""
    address = local_address_toward(controller_host())
    with socket.socket() as probe:
        probe.bind((address, 0))
        return address, probe.getsockname()[1]


def _listening_socket(host: str, port: int) -> int:
    """The file descriptor of a TCP socket listening on ``host:port`` only, for the store."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen()
    return listener.detach()


def form_group(
    rank: int,
    world: int,
    backend: str,
    timeout_s: float,
    threads: int,
    store_path: str | None = None,
    master: tuple[str, int] | None = None,
    device: int | None = None,
) -> dict:
    """Join the cluster's process group (leaving any earlier one): a ``FileStore`` at
    ``store_path`` on one host, else a ``TCPStore`` at ``master`` (engine 0 listens)."""
    import torch
    import torch.distributed as dist

    from ..parallel.group import set_call_ranks_source
    from ..parallel.severing import init_default_group

    leave_group()
    set_call_ranks_source(call_ranks)
    torch.set_num_threads(threads)
    timeout = timedelta(seconds=timeout_s)
    store: dist.Store
    if store_path is not None:
        # torch reads GLOO_SOCKET_IFNAME when it creates the gloo device, i.e. just below
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
        store = dist.FileStore(store_path, world)
    else:
        if master is None:
            raise ValueError("form_group needs store_path (one host) or master (engine 0's address)")
        host, port = master
        # gloo would otherwise bind to whatever this host's name resolves to (often nothing
        # the other hosts reach); a GLOO_SOCKET_IFNAME set on the host wins
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_toward(host))
        # engine 0 listens on that address only (torch's own bind would take every interface)
        listen_fd = _listening_socket(host, port) if rank == 0 else None
        store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, master_listen_fd=listen_fd)
    if device is not None:
        torch.cuda.set_device(device)
    init_default_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": backend}


def leave_group() -> None:
    """Leave the process group, if this engine is in one (its connections shut down first)."""
    from ..parallel.group import leave_default_group

    leave_default_group()


def sever_group() -> int:
    """Shut down this engine's group connections (see
    :func:`mixle_nb.parallel.severing.sever_group`); how many were shut down."""
    from ..parallel.severing import sever_group as sever

    return sever()


def group_state() -> tuple[bool, int]:
    """(in a usable group, collectives started in it): equal counts on every rank mean no rank
    was left inside a collective the others have finished or never entered. A group whose
    connections were shut down (by a handle's failure path or the cluster) is not usable."""
    import torch.distributed as dist

    from ..parallel.severing import group_severed
    from ..parallel.torch_internals import collectives_started

    if not dist.is_initialized() or group_severed():
        return False, -1
    return True, collectives_started()

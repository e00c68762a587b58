"""On each engine: exit when the cluster's controller is gone, on whatever host the engine runs.

The owner's lifeline (:mod:`mixle_nb.cluster.lifeline`) ends the controller when the owner
dies, but cannot reach engines that ssh, Slurm or MPI started on other hosts. So each engine
runs a thread that opens a connection to the controller's registration socket (TCP, or a Unix
socket when the whole cluster runs on one host) every
:data:`PROBE_S` (closed again at once; the controller's socket drops it) and ends the engine
when :data:`REFUSED` probes in a row are refused (the controller is gone, its host is up:
about 1.5 s) or :data:`MISSES` in a row fail either way, unanswered within :data:`PROBE_S`
(the host or the network is gone: at most about 8 s, after the controller itself, pinging every
0.1 s and giving up after 55 misses, 5.5 s, has dropped the engine). A thread, so an engine busy in a
long call or a collective exits all the same; its nanny, which watches the engine, follows it.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from .ipyparallel_internals import engine_registration_url

PROBE_S = 0.5
REFUSED = 3
MISSES = 8
_thread: threading.Thread | None = None


def controller_address() -> tuple[str, int] | str | None:
    """(host, port) of the controller's registration socket as this engine reached it, or the
    path of its Unix socket; None outside an ipyparallel engine."""
    url = engine_registration_url()  # tcp://host:port or ipc://path:port
    if url is None:
        return None
    transport, _, address = url.partition("://")
    if transport == "ipc":
        return address
    host, port = address.rsplit(":", 1)
    return host, int(port)


def probe(address: tuple[str, int] | str) -> str:
    """``"up"``, ``"refused"`` (nothing listens: the controller is gone) or ``"silent"``."""
    try:
        if isinstance(address, str):  # a Unix socket: gone with its file, or refused
            with socket.socket(socket.AF_UNIX) as unix:
                unix.settimeout(PROBE_S)
                unix.connect(address)
                return "up"
        with socket.create_connection(address, timeout=PROBE_S):
            return "up"
    except (ConnectionRefusedError, FileNotFoundError):
        return "refused"
    except OSError:
        return "silent"


def _watch(address: tuple[str, int] | str) -> None:
    refused = misses = 0
    while refused < REFUSED and misses < MISSES:
        answer = probe(address)
        refused = refused + 1 if answer == "refused" else 0
        misses = misses + 1 if answer != "up" else 0
        time.sleep(PROBE_S)
    os._exit(3)  # no cleanup to wait for: the cluster this engine served is gone


def start() -> bool:
    """Start the watch on this engine (once); False where there is no controller to watch."""
    global _thread
    if _thread is not None:
        return True
    address = controller_address()
    if address is None:
        return False
    _thread = threading.Thread(target=_watch, args=(address,), name="mixle-controller-watch", daemon=True)
    _thread.start()
    return True

"""The ipyparallel controller, listening on Unix sockets (ZeroMQ's ``ipc://`` transport).

Run as ``python -m mixle_nb.cluster.ipc_controller`` with ipyparallel's controller arguments.
ipyparallel 9 names an ``ipc://`` endpoint ``<path>-<port>`` when the controller binds it but
``<path>:<port>`` when the engines and the client connect to it, so they never meet; this entry
point makes the controller bind the names the others connect to, then runs ipyparallel's own
controller unchanged.
"""

from __future__ import annotations

from typing import Any


def _endpoint(controller: Any, kind: str, channel: str, index: int | None = None) -> str:
    """The ZeroMQ endpoint of ``channel``, named as the engines and the client name it."""
    info = {"engine": controller.engine_info, "client": controller.client_info, "internal": controller.internal_info}
    port = info[kind][channel] if index is None else info[kind][channel][index]
    return f"{info[kind]['interface']}:{port}"


def main() -> None:
    """Run ipyparallel's controller with the endpoint names of its engines and client."""
    from ipyparallel.controller.app import IPController
    from ipyparallel.controller.app import main as controller_main

    IPController.construct_url = _endpoint
    controller_main()


if __name__ == "__main__":
    main()

"""The ipyparallel controller, listening on Unix sockets (ZeroMQ's ``ipc://`` transport).

Run as ``python -m mixle_nb.cluster.ipc_controller`` with ipyparallel's controller arguments.
ipyparallel 9 names an ``ipc://`` endpoint ``<path>-<port>`` when the controller binds it but
``<path>:<port>`` when the engines and the client connect to it, so they never meet; this entry
point makes the controller bind the names the others connect to, then runs ipyparallel's own
controller unchanged (both through :mod:`mixle_nb.cluster.ipyparallel_internals`).
"""

from __future__ import annotations

from .ipyparallel_internals import bind_endpoints_as_connected, run_controller


def main() -> None:
    """Run ipyparallel's controller with the endpoint names of its engines and client."""
    bind_endpoints_as_connected()
    run_controller()


if __name__ == "__main__":
    main()

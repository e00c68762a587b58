"""Every use of ipyparallel's private APIs, in one place, with the ipyparallel versions it was checked against.

ipyparallel offers no public way to do these things, which the cluster needs:

- :func:`bind_endpoints_as_connected` and :func:`run_controller`: the controller binds its
  ``ipc://`` endpoints under the names its engines and client connect to (ipyparallel 9 binds
  ``<path>-<port>`` but connects to ``<path>:<port>``), by replacing
  ``IPController.construct_url``, then runs the controller of ``ipyparallel.controller.app``;
- :func:`run_engine`: runs the engine of ``ipyparallel.engine.app`` (what ``ipengine`` runs),
  after the rank's own imports (:mod:`mixle_nb.cluster.rank_engine`);
- :func:`receiving_streams` and :func:`replace_handler`: the client's ZeroMQ streams
  (``Client._<channel>_stream``) and the handler each was given (pyzmq's
  ``ZMQStream._recv_callback``), so that :class:`~mixle_nb.cluster.stray_messages.MessageGuard`
  screens every message before ipyparallel's handler sees it;
- :func:`expected_signature`: the HMAC signature the client's session (jupyter_client's
  ``Session.auth`` and ``Session.sign``) expects on a message;
- :func:`client_interface`: the controller's interface as the client's connection file gave it
  (``Client._config``), to find the folder of its Unix sockets;
- :func:`engine_registration_url` and :func:`engine_interface`: how this engine reached its
  controller (``ipyparallel.engine.app.IPEngine``, not exported by ipyparallel).

They were checked against the ipyparallel versions :data:`CHECKED_IPYPARALLEL` admits (the
``ipyparallel`` line of ``pyproject.toml`` pins the same range): the tests ran against 9.2.0;
9.1.0's source is identical to 9.2.0's in every module used here (it differs only in
``engine/datapub.py``). :func:`missing_private_apis` names any that an ipyparallel version lacks;
``tests/test_ipyparallel_internals.py`` fails with that list, so an upgrade that breaks one says
which and where. ``ipyparallel.datapub``, ``ipyparallel.error`` and
``ipyparallel.cluster.launcher`` are ipyparallel's documented modules and are used where needed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

CHECKED_IPYPARALLEL = (9, 1), (9, 3)  # [lowest, first unchecked) (major, minor); pyproject: ipyparallel>=9.1,<9.3
CLIENT_STREAMS = ("query", "control", "mux", "task", "iopub", "notification", "broadcast")


def _endpoint(controller: Any, kind: str, channel: str, index: int | None = None) -> str:
    """The ZeroMQ endpoint of ``channel``, named as the engines and the client name it
    (``IPController.construct_url``'s replacement)."""
    info = {"engine": controller.engine_info, "client": controller.client_info, "internal": controller.internal_info}
    port = info[kind][channel] if index is None else info[kind][channel][index]
    return f"{info[kind]['interface']}:{port}"


def bind_endpoints_as_connected() -> None:
    """Make every ``IPController`` of this process bind its endpoints under the names its engines
    and client connect to (``<interface>:<port>``, for ``ipc://`` as for ``tcp://``)."""
    from ipyparallel.controller.app import IPController

    IPController.construct_url = _endpoint


def run_controller() -> None:
    """Run ipyparallel's controller application with this process's arguments."""
    from ipyparallel.controller.app import main

    main()


def run_engine() -> None:
    """Run ipyparallel's engine application with this process's arguments."""
    from ipyparallel.engine.app import main

    main()


def receiving_streams(client: Any) -> dict[str, tuple[Any, Callable[[list[Any]], Any]]]:
    """The streams of ``client`` (an ``ipyparallel.Client``) that have a receive handler.

    Parameters
    ----------
    client : ipyparallel.Client
        A connected client.

    Returns
    -------
    dict
        Channel name (one of :data:`CLIENT_STREAMS`) to ``(stream, handler)``: the
        ``ZMQStream`` and the handler ipyparallel gave it.
    """
    found = {}
    for name in CLIENT_STREAMS:
        stream = getattr(client, f"_{name}_stream", None)
        if stream is not None and stream._recv_callback is not None:
            found[name] = stream, stream._recv_callback
    return found


def replace_handler(stream: Any, handler: Callable[[list[Any]], Any]) -> None:
    """Make ``handler`` receive ``stream``'s messages, as zmq frames (as ipyparallel's own do)."""
    stream.on_recv(handler, copy=False)


def expected_signature(session: Any, parts: list[bytes]) -> bytes | None:
    """The HMAC signature ``session`` expects on a message of these four parts (header, parent
    header, metadata, content), or None when the session signs nothing (no key)."""
    return None if session.auth is None else session.sign(parts)


def client_interface(client: Any) -> str:
    """The controller's interface (``tcp://<host>`` or ``ipc://<path>``) from ``client``'s
    connection file."""
    return client._config["interface"]


def engine_registration_url() -> str | None:
    """The controller's registration URL as this engine reached it (``tcp://<host>:<port>`` or
    ``ipc://<path>:<port>``), or None outside an ipyparallel engine."""
    try:
        from ipyparallel.engine.app import IPEngine
    except ImportError:
        return None
    if not IPEngine.initialized():
        return None
    return IPEngine.instance().registration_url


def engine_interface() -> str:
    """The controller's interface (``tcp://<host>`` or ``ipc://<path>``) as this engine reached it
    (call it on an engine)."""
    from ipyparallel.engine.app import IPEngine

    return IPEngine.instance().connection_info["interface"]


def _sets(owner: Any, attribute: str) -> bool:
    """Whether ``owner``'s source assigns ``self.<attribute>`` (for attributes that are no trait)."""
    return f"self.{attribute} =" in inspect.getsource(owner)


def missing_private_apis() -> list[str]:
    """The private names above that this ipyparallel (and its pyzmq, jupyter_client) lacks.

    Returns
    -------
    list of str
        Each missing name, dotted from its module; empty when every one is there.
    """
    from ipyparallel import Client
    from ipyparallel.controller import app as controller_app
    from ipyparallel.engine import app as engine_app
    from jupyter_client.session import Session
    from zmq.eventloop.zmqstream import ZMQStream

    controller = controller_app.IPController
    missing = []
    url_parameters = list(inspect.signature(controller.construct_url).parameters)
    if url_parameters != ["self", "kind", "channel", "index"]:
        missing.append("ipyparallel.controller.app.IPController.construct_url(self, kind, channel, index)")
    missing += [
        f"ipyparallel.controller.app.IPController.{name}"
        for name in ("engine_info", "client_info")
        if name not in controller.class_trait_names()
    ]
    if not _sets(controller, "internal_info"):
        missing.append("ipyparallel.controller.app.IPController.internal_info")
    if not callable(getattr(controller_app, "main", None)):
        missing.append("ipyparallel.controller.app.main")
    if not callable(getattr(engine_app, "main", None)):
        missing.append("ipyparallel.engine.app.main")
    setup = inspect.getsource(Client._setup_streams)
    missing += [
        f"ipyparallel.Client._{name}_stream"
        for name in CLIENT_STREAMS
        if f"self._{name}_stream = ZMQStream(" not in setup or f"self._{name}_stream.on_recv(" not in setup
    ]
    if "_config" not in Client.class_trait_names():
        missing.append("ipyparallel.Client._config")
    if "_recv_callback" not in ZMQStream.__annotations__:
        missing.append("zmq.eventloop.zmqstream.ZMQStream._recv_callback")
    if "auth" not in Session.class_trait_names() or not callable(getattr(Session, "sign", None)):
        missing.append("jupyter_client.session.Session.auth and .sign")
    IPEngine = engine_app.IPEngine
    if "registration_url" not in IPEngine.class_trait_names():
        missing.append("ipyparallel.engine.app.IPEngine.registration_url")
    if not _sets(IPEngine, "connection_info"):
        missing.append("ipyparallel.engine.app.IPEngine.connection_info")
    return missing


def ipyparallel_version() -> tuple[int, int]:
    """This ipyparallel's (major, minor)."""
    import ipyparallel

    major, minor = ipyparallel.version_info[:2]
    return int(major), int(minor)

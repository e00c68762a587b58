"""ipyparallel's private APIs the cluster uses (mixle_nb/cluster/ipyparallel_internals.py): on an
ipyparallel version where one is gone, this fails first and names it, rather than a shared-host
cluster failing obscurely in the field."""

import re
from pathlib import Path

import ipyparallel

from mixle_nb.cluster import ipyparallel_internals


def test_every_private_ipyparallel_api_used_is_there():
    missing = ipyparallel_internals.missing_private_apis()
    assert not missing, (
        f"ipyparallel {ipyparallel.__version__} lacks the private APIs {missing}, which "
        "mixle_nb/cluster/ipyparallel_internals.py uses (checked against ipyparallel "
        f"{ipyparallel_internals.CHECKED_IPYPARALLEL}): find their replacement there, check it, and widen the pin"
    )


def test_the_ipyparallel_in_use_is_one_the_private_apis_were_checked_against():
    low, high = ipyparallel_internals.CHECKED_IPYPARALLEL
    assert low <= ipyparallel_internals.ipyparallel_version() < high, (
        f"ipyparallel {ipyparallel.__version__} is outside {low} to {high} (exclusive), the versions whose "
        "private APIs mixle_nb/cluster/ipyparallel_internals.py was checked against: run this file's first "
        "test, then widen the pin"
    )


def test_the_pin_in_pyproject_is_the_checked_range():
    (low_major, low_minor), (high_major, high_minor) = ipyparallel_internals.CHECKED_IPYPARALLEL
    pin = f'"ipyparallel>={low_major}.{low_minor},<{high_major}.{high_minor}"'
    assert pin in (Path(__file__).parents[1] / "pyproject.toml").read_text()


def test_a_missing_private_api_is_named(monkeypatch):
    from ipyparallel.controller.app import IPController
    from zmq.eventloop.zmqstream import ZMQStream

    monkeypatch.setattr(IPController, "construct_url", lambda self, kind, channel: "")
    monkeypatch.delitem(ZMQStream.__annotations__, "_recv_callback")
    assert ipyparallel_internals.missing_private_apis() == [
        "ipyparallel.controller.app.IPController.construct_url(self, kind, channel, index)",
        "zmq.eventloop.zmqstream.ZMQStream._recv_callback",
    ]


def test_the_controller_binds_the_names_its_engines_connect_to(monkeypatch):
    """An engine connects to ``f"{interface}:{registration}"`` (ipyparallel's engine/app.py), for
    ipc:// as for tcp://; with the replacement, the controller binds exactly that."""
    from ipyparallel.controller.app import IPController

    monkeypatch.setattr(IPController, "construct_url", IPController.construct_url)  # restored after
    controller = IPController()
    controller.engine_info = {"interface": "ipc:///run/cluster/sockets", "registration": 5, "mux": (6, 7)}
    controller.client_info = {"interface": "tcp://127.0.0.1", "task": (8, 9)}
    controller.internal_info = {"interface": "tcp://127.0.0.1"}  # set by the controller's init_hub
    assert controller.engine_url("registration") == "ipc:///run/cluster/sockets-5"  # ipyparallel's own name
    ipyparallel_internals.bind_endpoints_as_connected()
    assert controller.engine_url("registration") == "ipc:///run/cluster/sockets:5"
    assert controller.engine_url("mux", 1) == "ipc:///run/cluster/sockets:7"
    assert controller.client_url("task", 0) == "tcp://127.0.0.1:8"


def test_the_streams_with_a_handler_are_found_and_their_handler_replaced():
    """Real ZeroMQ streams, laid out as ipyparallel's client lays them out."""
    import zmq
    from jupyter_client.session import Session
    from tornado.ioloop import IOLoop
    from zmq.eventloop.zmqstream import ZMQStream

    context = zmq.Context()
    loop = IOLoop(make_current=False)

    class Client:  # the attributes receiving_streams reads of ipyparallel's client
        pass

    def ipyparallel_handler(frames: list) -> None:
        pass

    def guard(frames: list) -> None:
        pass

    client = Client()
    client._iopub_stream = ZMQStream(context.socket(zmq.PAIR), loop)
    client._task_stream = ZMQStream(context.socket(zmq.PAIR), loop)  # no handler: left alone
    client._iopub_stream.on_recv(ipyparallel_handler, copy=False)
    try:
        assert ipyparallel_internals.receiving_streams(client) == {"iopub": (client._iopub_stream, ipyparallel_handler)}
        ipyparallel_internals.replace_handler(client._iopub_stream, guard)
        assert ipyparallel_internals.receiving_streams(client) == {"iopub": (client._iopub_stream, guard)}
    finally:
        client._iopub_stream.close()
        client._task_stream.close()
        loop.close()
        context.term()
    session = Session(key=b"cluster-key")
    assert ipyparallel_internals.expected_signature(session, [b"h", b"p", b"m", b"c"]) == session.sign(
        [b"h", b"p", b"m", b"c"]
    )
    assert ipyparallel_internals.expected_signature(Session(key=b""), [b"h", b"p", b"m", b"c"]) is None


def test_outside_an_engine_there_is_no_registration_url():
    assert ipyparallel_internals.engine_registration_url() is None


def test_only_ipyparallel_internals_reaches_into_ipyparallel_privately():
    root = Path(__file__).parents[1]
    private = re.compile(
        r"(from|import) ipyparallel\.(controller|engine)\b|\._[a-z]+_stream\b|_recv_callback|\._config\b"
        r"|construct_url|\.(engine|client|internal|connection)_info\b|\.registration_url\b|session\.(sign|auth)\b"
    )
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in (root / "mixle_nb").rglob("*.py")
        if path.name != "ipyparallel_internals.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert not offenders, f"ipyparallel private APIs outside mixle_nb/cluster/ipyparallel_internals.py: {offenders}"

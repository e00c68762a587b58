"""A shared host: another user can neither wedge, enter nor read a cluster (issue 40).

The other user is uid ``nobody`` (``setpriv``), on loopback only: it probes every TCP port the
cluster's processes listen on (``tests/shared_host_probe.py``: random bytes, truncated ZMTP
greetings, valid greetings then garbage frames, connection floods; 50 bounded rounds), tries
every Unix socket and reads the cluster's files, while the cluster fits Gaussian mixtures. Every
fit must come back within the call bound and equal the fit in this process.

Before this change a 2-engine cluster listened on 24 loopback TCP ports and the same probe hung
the next call in 2 of 3 runs (10 rounds each, ``docs/guide/network-exposure.md``).
"""

from __future__ import annotations

import glob
import json
import os
import stat
import threading
import time

import numpy as np
import pytest
from shared_host_probe import listening_ports, probe_while, unix_listeners, zmtp_mechanism
from sklearn_ranks import blobs, fit_quietly, settings
from strictness import unavailable

from mixle_nb.cluster import MixleCluster
from mixle_nb.cluster.stray_messages import malformed
from mixle_nb.mixture import GaussianMixture

ROUNDS = 50
CALL_BOUND_S = 30.0  # the cluster's 20 s collective timeout, and time to answer
FITS_AT_LEAST = 3


def fit_on_ranks(seed: int) -> tuple:
    """A 3-component full-covariance fit over the group (each rank keeps its shard)."""
    from mixle_nb.parallel import TorchRunEncodedData

    x = blobs(300, 2, 3, seed)
    estimator = GaussianMixture(**settings("full", x))
    with TorchRunEncodedData(x, estimator=estimator.mixture_estimator(2)) as handle:
        fit_quietly(estimator, handle)
    return estimator.weights_, estimator.means_, estimator.covariances_


def fit_here(seed: int) -> tuple:
    x = blobs(300, 2, 3, seed)
    estimator = fit_quietly(GaussianMixture(**settings("full", x)), x)
    return estimator.weights_, estimator.means_, estimator.covariances_


def require_root() -> None:
    if os.geteuid() != 0:
        unavailable("probing as another user needs root (setpriv to uid nobody)")


def cluster_files(cluster: MixleCluster) -> list[str]:
    """The cluster's connection files, its cluster file and its rendezvous folder."""
    record = cluster.detached_record()
    security = glob.glob(os.path.join(record.profile_dir, "security", f"*{record.cluster_id}*"))
    return [*security, *glob.glob(os.path.join(str(record.store_dir), "*"))]


def inventory(cluster: MixleCluster) -> dict:
    tcp = listening_ports(cluster.pids)
    return {"tcp": tcp, "unix": unix_listeners(cluster.pids)}


def probe_while_fitting(cluster: MixleCluster, tcp_ports: list[int], unix: list[str], files: list[str]) -> dict:
    """Run the probe as nobody while the cluster fits; every fit within the bound and equal to
    this process's. The probe's report, with the fits done."""
    require_root()
    expected = [fit_here(seed) for seed in range(FITS_AT_LEAST)]

    def fit(i: int) -> None:
        seed = i % FITS_AT_LEAST
        t0 = time.monotonic()
        got = cluster.run_async(fit_on_ranks, seed).result(timeout=CALL_BOUND_S)
        assert time.monotonic() - t0 < CALL_BOUND_S
        for rank_fit in got:
            for value, reference in zip(rank_fit, expected[seed]):
                np.testing.assert_allclose(value, reference, rtol=1e-9, atol=1e-12)

    arguments = [*map(str, tcp_ports), "--rounds", str(ROUNDS), "--unix", *unix, "--files", *files]
    report = probe_while(fit, arguments, FITS_AT_LEAST)
    report["fits"] = report.pop("calls")
    return report


@pytest.mark.cluster
def test_a_local_cluster_cannot_be_wedged_entered_or_read_by_another_user(cluster2):
    before = inventory(cluster2)
    engines = {row.pid for row in cluster2.status()}
    # over TCP only gloo's listeners (one per rank, on loopback): no controller, scheduler or nanny
    assert {pid for _, _, pid in before["tcp"]} <= engines
    assert len(before["tcp"]) <= cluster2.n and {addr for addr, _, _ in before["tcp"]} <= {"127.0.0.1"}
    folders = {os.path.dirname(path) for path in before["unix"]}
    assert before["unix"] and len(folders) == 1
    mode = os.stat(folders.pop()).st_mode
    assert stat.S_IMODE(mode) == 0o700
    files = cluster_files(cluster2)
    assert files

    report = probe_while_fitting(cluster2, [port for _, port, _ in before["tcp"]], before["unix"], files)
    print(f"inventory {before}; probe as nobody: {report}")
    assert report["uid"] != 0 and report["rounds"] == ROUNDS and report["fits"] >= FITS_AT_LEAST
    assert report["unix_connected"] == [] and report["files_read"] == []
    assert inventory(cluster2) == before  # nothing died, nothing new listens
    assert cluster2.status().dropped == {}


@pytest.mark.cluster
def test_a_cluster_on_tcp_refuses_peers_without_its_key_and_drops_stray_messages():
    """The controller on loopback TCP (as across hosts): every ipyparallel socket is CurveZMQ,
    so the probe is refused at the handshake; a stray message that does get through (sent here
    with the key) is dropped, counted in ``status()``, and the next call completes."""
    import zmq

    with MixleCluster(2, timeout=20.0, controller_ip="127.0.0.1") as cluster:
        before = inventory(cluster)
        assert before["unix"] == [] and {addr for addr, _, _ in before["tcp"]} == {"127.0.0.1"}
        report = probe_while_fitting(cluster, [port for _, port, _ in before["tcp"]], [], cluster_files(cluster))
        print(f"inventory {before}; probe as nobody: {report}")
        assert report["connected"] > 0 and report["files_read"] == [] and report["fits"] >= FITS_AT_LEAST
        assert cluster.status().dropped == {}  # refused at the handshake: nothing reached the client

        record = cluster.detached_record()
        engine_file = glob.glob(os.path.join(record.profile_dir, "security", f"*{record.cluster_id}-engine.json"))
        info = json.load(open(engine_file[0]))
        assert info["curve_serverkey"]
        stray = zmq.Context.instance().socket(zmq.PUB)
        stray.curve_publickey, stray.curve_secretkey = zmq.curve_keypair()
        stray.curve_serverkey = info["curve_serverkey"].encode()
        stray.linger = 0
        stray.connect(f"{info['interface']}:{info['iopub']}")
        try:
            deadline = time.monotonic() + 10.0
            while not cluster.status().dropped and time.monotonic() < deadline:
                stray.send_multipart([b"engine.0.stream", b"no delimiter here"])
                time.sleep(0.05)
        finally:
            stray.close()
        assert cluster.status().dropped.get("iopub: no delimiter", 0) > 0
        assert "stray messages dropped: iopub: no delimiter" in str(cluster.status())
        got = cluster.run_async(fit_on_ranks, 0).result(timeout=CALL_BOUND_S)
        np.testing.assert_allclose(got[0][1], fit_here(0)[1], rtol=1e-9, atol=1e-12)


def test_a_message_is_malformed_without_its_delimiter_frames_or_signature():
    import zmq
    from jupyter_client.session import Session

    session = Session(key=b"cluster-key")
    message = session.msg("execute_result", content={"x": 1})
    good = [zmq.Frame(part) for part in session.serialize(message, ident=[b"engine"])]
    assert malformed(session, good) is None
    assert malformed(session, [zmq.Frame(b"random bytes")]) == "no delimiter"
    assert malformed(session, [zmq.Frame(b"<IDS|MSG>"), zmq.Frame(b"sig")]) == "too few frames"
    forged = [good[0], good[1], zmq.Frame(b"0" * 64), *good[3:]]
    assert malformed(session, forged) == "bad signature"
    assert malformed(Session(key=b""), forged) is None  # CurveZMQ clusters sign nothing


def test_the_guard_keeps_a_stream_reading_after_a_failing_handler():
    """Real sockets: a PAIR sends three messages; the first fails ipyparallel's handler, the
    second is random bytes; the third still arrives."""
    import zmq
    from jupyter_client.session import Session
    from tornado.ioloop import IOLoop
    from zmq.eventloop.zmqstream import ZMQStream

    from mixle_nb.cluster.stray_messages import MessageGuard

    context = zmq.Context()
    receiver, sender = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    port = receiver.bind_to_random_port("tcp://127.0.0.1")
    sender.connect(f"tcp://127.0.0.1:{port}")
    session = Session(key=b"k")
    handled: list[int] = []
    done = threading.Event()
    loop = IOLoop(make_current=False)

    def handle(frames: list) -> None:
        number = session.deserialize(session.feed_identities(frames, copy=False)[1], copy=False)["content"]["n"]
        if number == 0:
            raise RuntimeError("a handler bug")
        handled.append(number)
        done.set()

    class Client:  # what MessageGuard reads of ipyparallel's client
        pass

    client = Client()
    client.session = session
    client._iopub_stream = ZMQStream(receiver, loop)
    client._iopub_stream.on_recv(handle, copy=False)
    guard = MessageGuard(client)
    thread = threading.Thread(target=loop.start, daemon=True)
    thread.start()
    try:
        session.send(sender, "stream", content={"n": 0})
        sender.send_multipart([b"random", b"bytes"])
        session.send(sender, "stream", content={"n": 1})
        assert done.wait(10.0)
        assert handled == [1]
        assert guard.counts() == {"iopub: handler failed": 1, "iopub: no delimiter": 1}
    finally:
        loop.add_callback(loop.stop)
        thread.join(10.0)
        client._iopub_stream.close()
        sender.close()
        context.term()


def test_a_port_is_asked_which_zeromq_mechanism_it_announces():
    """The inventory's authentication column (benchmarks/port_inventory.py): real sockets."""
    import socket

    import zmq

    context = zmq.Context()
    open_socket, curve_socket = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
    curve_socket.curve_publickey, curve_socket.curve_secretkey = zmq.curve_keypair()
    curve_socket.curve_server = True
    plain = socket.socket()
    try:
        ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in (open_socket, curve_socket)]
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        ports.append(plain.getsockname()[1])
        assert [zmtp_mechanism(("127.0.0.1", port), timeout=0.3) for port in ports] == ["NULL", "CURVE", None]
    finally:
        plain.close()
        open_socket.close(linger=0)
        curve_socket.close(linger=0)
        context.term()

"""Another user on the same host, probing a cluster: its port inventory, and bounded bursts of
bytes against every TCP port its processes listen on.

Run as a script (the tests run it as uid ``nobody`` through ``setpriv``), it probes the ports
it is given (``PORT`` on 127.0.0.1, or ``HOST:PORT`` for a simulated host's address), for a bounded number of rounds, each bounded in time and bytes,
and prints one JSON line of what it did. Each round sends, to each port, one of:

- ``random``: up to 4 KiB of random bytes;
- ``truncated``: the first bytes of a ZMTP greeting, then nothing;
- ``garbage``: a valid ZMTP 3.0 NULL greeting and READY (as a DEALER, PUB, ROUTER or SUB
  peer, in turn), then well-formed frames of random bytes: these reach the application;
- ``flood``: 20 connections opened and closed at once.

It also tries, once, to connect to each Unix socket and to read each file given with
``--unix`` and ``--files``, and counts those it could.

Imported, :func:`listening_ports` is the inventory: the TCP ports that given processes listen
on, read from ``/proc`` as another user would (``/proc/net/tcp`` is world-readable), and
:func:`probe_while` runs the probe as ``nobody`` while the caller's calls run.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

KINDS = ("random", "truncated", "garbage", "flood")
PEER_TYPES = (b"DEALER", b"PUB", b"ROUTER", b"SUB")
ROUND_BUDGET_S = 0.1  # each round's connections to one port give up after this
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of ``pid``'s sockets (empty once it has gone)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening_ports(pids: set[int]) -> list[tuple[str, int, int]]:
    """``(address, port, pid)`` of every TCP socket that one of ``pids`` listens on, sorted."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == _LISTEN and inode in owner:
                    host, port = local.split(":")
                    found.add((_address(host), int(port, 16), owner[inode]))
    return sorted(found)


def unix_listeners(pids: set[int]) -> list[str]:
    """The paths of the Unix sockets that one of ``pids`` listens on, sorted."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids)) if pids else set()
    paths = set()
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            # Num RefCount Protocol Flags Type St Inode [Path]; flag 0x10000: listening
            if len(fields) >= 8 and int(fields[3], 16) & 0x10000 and fields[6] in inodes:
                paths.add(fields[7])
    return sorted(paths)


def _greeting() -> bytes:
    """A ZMTP 3.0 greeting, NULL mechanism, as a client."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def _ready(peer_type: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(peer_type)) + peer_type
    return b"\x04" + bytes([len(body)]) + body


def zmtp_mechanism(address: tuple[str, int], timeout: float = 1.0) -> str | None:
    """The security mechanism a ZeroMQ socket at ``address`` announces in its ZMTP 3 greeting
    (``"CURVE"``: peers without the key are refused; ``"NULL"``: anyone is let in), or None
    where what listens does not answer a greeting as ZeroMQ does (gloo, torch's store)."""
    answer = b""
    try:
        with socket.create_connection(address, timeout=timeout) as s:
            s.sendall(_greeting()[:11])  # the signature and major version: the server's greeting follows
            while len(answer) < 32:
                chunk = s.recv(64 - len(answer))
                if not chunk:
                    break
                answer += chunk
    except OSError:
        pass
    if len(answer) < 32 or answer[0] != 0xFF or answer[9] != 0x7F:
        return None
    return answer[12:32].rstrip(b"\x00").decode("ascii", "replace")


def listening_here() -> list[tuple[str, int, str | None]]:
    """``(address, port, mechanism)`` of every TCP socket this process and its children (an
    engine's nanny) listen on, the :func:`zmtp_mechanism` asked from this host (run on an
    engine: its own loopback included)."""
    import psutil

    here = psutil.Process()
    connections = [c for proc in [here, *here.children(recursive=True)] for c in proc.net_connections("inet")]
    ports = sorted({(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN})
    local = {"0.0.0.0": "127.0.0.1", "::": "::1"}
    return [(ip, port, zmtp_mechanism((local.get(ip, ip), port))) for ip, port in ports]


def _frames(rng: random.Random) -> bytes:
    """One multipart message of 1-6 short frames of random bytes; sometimes shaped like an
    ipyparallel message (a delimiter, then a bad signature and header)."""
    parts = [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 7))]
    if rng.random() < 0.5:
        parts[rng.randrange(len(parts)) :] = [b"<IDS|MSG>", rng.randbytes(32), b"{", b"{}", b"{}", b"{}"]
    out = b""
    for i, part in enumerate(parts):
        more = 0x01 if i < len(parts) - 1 else 0x00
        out += bytes([more, len(part)]) + part
    return out


def _connect(address: tuple[str, int], deadline: float) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(max(0.005, deadline - time.monotonic()))
    try:
        s.connect(address)
    except OSError:
        s.close()
        return None
    return s


def _send(s: socket.socket, data: bytes, deadline: float) -> None:
    s.settimeout(max(0.005, deadline - time.monotonic()))
    try:
        s.sendall(data)
    except OSError:
        pass


def probe_port(address: tuple[str, int], kind: str, rng: random.Random) -> bool:
    """One bounded burst of ``kind`` at ``address``; whether a connection was made."""
    deadline = time.monotonic() + ROUND_BUDGET_S
    if kind == "flood":
        opened = [s for s in (_connect(address, deadline) for _ in range(20)) if s is not None]
        for s in opened:
            s.close()
        return bool(opened)
    s = _connect(address, deadline)
    if s is None:
        return False
    try:
        if kind == "random":
            _send(s, rng.randbytes(rng.randrange(1, 4096)), deadline)
        elif kind == "truncated":
            _send(s, _greeting()[: rng.randrange(1, 11)], deadline)
        else:
            _send(s, _greeting() + _ready(rng.choice(PEER_TYPES)), deadline)
            s.settimeout(max(0.005, deadline - time.monotonic()))
            try:
                s.recv(4096)  # the server's greeting (and READY)
            except OSError:
                pass
            _send(s, b"".join(_frames(rng) for _ in range(rng.randrange(1, 8))), deadline)
    finally:
        s.close()
    return True


def _reachable(path: str, unix: bool) -> bool:
    """Whether this user can connect to the Unix socket, or read the file, at ``path``."""
    try:
        if unix:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(ROUND_BUDGET_S)
                s.connect(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
    except OSError:
        return False
    return True


def probe_while(call: Callable[[int], None], arguments: list[str], at_least: int) -> dict:
    """Run this probe with ``arguments`` as uid ``nobody`` (needs root) while ``call(i)`` runs
    for i = 0, 1, ... until the probe has finished and ``call`` ran ``at_least`` times. The
    probe's report, with ``calls``: how many times ``call`` ran."""
    nobody = pwd.getpwnam("nobody")
    command = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    probe = subprocess.Popen(
        [*command, sys.executable, os.path.abspath(__file__), *arguments], stdout=subprocess.PIPE, text=True
    )
    calls = 0
    try:
        while probe.poll() is None or calls < at_least:
            call(calls)
            calls += 1
        report = json.loads(probe.communicate(timeout=60)[0])
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    report["calls"] = calls
    return report


def main(argv: list[str] | None = None) -> int:
    """Probe the ports on the command line for ``--rounds`` rounds; print what was done."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ports", nargs="*", help="PORT (on 127.0.0.1) or HOST:PORT")
    parser.add_argument("--unix", nargs="*", default=[])
    parser.add_argument("--files", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    addresses = [(host or "127.0.0.1", int(port)) for host, _, port in (p.rpartition(":") for p in args.ports)]
    connected = refused = 0
    t0 = time.monotonic()
    for r in range(args.rounds):
        for address in addresses:
            if probe_port(address, KINDS[(r + address[1]) % len(KINDS)], rng):
                connected += 1
            else:
                refused += 1
    report = {"uid": os.getuid(), "rounds": args.rounds, "ports": len(args.ports)}
    report.update(connected=connected, refused=refused, seconds=round(time.monotonic() - t0, 2))
    report["unix_connected"] = [path for path in args.unix if _reachable(path, unix=True)]
    report["files_read"] = [path for path in args.files if _reachable(path, unix=False)]
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

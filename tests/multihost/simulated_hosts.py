"""Simulated hosts on one machine: network namespaces on a bridge, each with its own hostname,
process space and OpenSSH server, for MixleCluster's multi-host paths (ssh launcher, TCPStore,
gloo over a network, interrupts through nannies, liveness from the controller's heartbeat).

Each host is a network namespace (own interfaces and ports) entered by a process that also
takes a UTS namespace (own hostname) and a PID namespace (pids there mean nothing here, as on
a real remote host). That process is the host's ``sshd``, PID 1 of its namespace: when it dies
the kernel kills everything left on the host. It dies with the harness process too (parent-
death signals along ``setpriv`` and ``unshare --kill-child``), so a crashed run leaves no
process behind; its named objects (namespaces, bridge) carry the owner's pid and the next run
removes those of dead owners.

The bridge's address in the root namespace is the controller's; the hosts take the next ones,
in a /24 of 198.18.0.0/15 (RFC 2544 benchmarking, never routed). Keys (host and client) are
made per harness in a private temporary directory. Nothing but loopback and these addresses is
ever contacted: the namespaces have no route anywhere else.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil

BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "setpriv", "ssh", "ssh-keygen")
PREFIX = "mh"  # every object this harness names starts with "mh<owner pid>"
_OWNED = re.compile(rf"^{PREFIX}(\d+)")
_KEY_DIR = re.compile(rf"^{PREFIX}\d+-[a-z0-9_]{{8}}$")  # tempfile.mkdtemp(prefix="mh<pid>-")
SSH_TIMEOUT_S = 10.0
SETTLE_S = 5.0  # how long a host may take to empty after its last process was told to stop
# The controller's engine-facing sockets (registration, control, mux, task, iopub, two
# heartbeat, one per broadcast leaf: 9 by default) take ports from this many; a real cluster
# opens this range to the engines' hosts.
ENGINE_PORTS = 16


def missing_privileges() -> str | None:
    """What this machine lacks to run the harness, in words; None if nothing."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network, UTS and PID namespaces, a bridge, sshd)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} (apt-get install openssh-server)")
    if missing:
        return f"multi-host tests need {', '.join(missing)}"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace (needs CAP_SYS_ADMIN, CAP_NET_ADMIN): {made.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _run(cmd, check=True, timeout=30.0, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _namespace_id(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:  # exited, or a kernel thread we may not inspect
        return None


@dataclass
class SimulatedHost:
    """One simulated machine: ``address`` on the bridge, ``hostname``, an sshd as its PID 1."""

    index: int
    netns: str
    hostname: str
    address: str
    veth: str  # the host's cable: the bridge-side end of its veth pair
    ssh_base: list[str]
    sshd: subprocess.Popen | None = None
    _listener: psutil.Process | None = None
    _pid_ns: str | None = None
    _net_ns: str | None = None

    @property
    def location(self) -> str:
        """``user@address``, as ipyparallel's ssh launcher takes it."""
        return f"root@{self.address}"

    def ssh(self, command: str, timeout: float = SSH_TIMEOUT_S) -> str:
        """Run ``command`` on this host through its sshd; its stdout (raises on failure)."""
        done = _run(self.ssh_base + [self.location, command], timeout=timeout)
        return done.stdout

    def processes(self) -> list[psutil.Process]:
        """Every process on this host (in its PID or network namespace) but its sshd listener."""
        found = []
        for proc in psutil.process_iter():
            if proc.pid in (self._listener.pid, self.sshd.pid):
                continue
            if _namespace_id(proc.pid, "pid") == self._pid_ns or _namespace_id(proc.pid, "net") == self._net_ns:
                found.append(proc)
        return found

    def wait_empty(self, timeout: float = SETTLE_S) -> list[psutil.Process]:
        """Wait until only the sshd listener runs here; returns what is left after ``timeout``.
        Call :meth:`disconnect` first, or the shared ssh connection's session counts."""
        deadline = time.monotonic() + timeout
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def disconnect(self) -> None:
        """Close the harness's shared ssh connection to this host (its sshd session ends)."""
        _run(self.ssh_base + ["-O", "exit", self.location], check=False)

    def set_link(self, up: bool) -> None:
        """Plug (``up``) or unplug this host's cable to the bridge."""
        _run(["ip", "link", "set", self.veth, "up" if up else "down"])

    def _start_sshd(self, config: str, log: str) -> None:
        # setpriv: the unshare process dies with the harness; --kill-child: sshd (PID 1 of the
        # new PID namespace, hence every process on the host) dies with unshare
        cmd = [
            "setpriv",
            "--pdeathsig",
            "KILL",
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--uts",
            "--pid",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            f'hostname "$0" && exec {SSHD} -D -e -f "$1"',
            self.hostname,
            config,
        ]
        with open(log, "w") as out:
            self.sshd = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        deadline = time.monotonic() + SSH_TIMEOUT_S
        while time.monotonic() < deadline and self.sshd.poll() is None:
            children = psutil.Process(self.sshd.pid).children()
            if children and "sshd" in children[0].name():
                self._listener = children[0]
                break
            time.sleep(0.05)
        if self._listener is None:
            raise RuntimeError(f"sshd on {self.hostname} did not start: {open(log).read()}")
        self._pid_ns = _namespace_id(self._listener.pid, "pid")
        self._net_ns = _namespace_id(self._listener.pid, "net")
        while time.monotonic() < deadline:  # listening once a login works
            if _run(self.ssh_base + [self.location, "true"], check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"cannot log in to {self.hostname} at {self.address}: {open(log).read()}")

    def _kill_sshd(self) -> list[psutil.Process]:
        """Kill the host's PID 1, after which the kernel kills the rest; returns what to wait for."""
        if self.sshd is None:
            return []
        try:
            self.sshd.kill()  # unshare: --kill-child passes the SIGKILL on to the host's PID 1
        except ProcessLookupError:
            pass
        self.sshd.wait(SSH_TIMEOUT_S)
        return [] if self._listener is None else [self._listener] + self.processes()


def _wait_gone(procs, timeout=SETTLE_S) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


@dataclass
class SimulatedNetwork:
    """``n_hosts`` simulated hosts on one bridge; the bridge address is the controller's.

    Use as a context manager; ``close()`` removes every namespace, link, process and file it
    made, and raises if anything survived.
    """

    n_hosts: int
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: list[SimulatedHost] = field(default_factory=list)

    def __post_init__(self):
        self.bridge = f"{self.tag}b"
        self.dir = tempfile.mkdtemp(prefix=f"{self.tag}-")  # mode 0700: keys live here
        self._made_links: list[str] = []
        self._made_netns: list[str] = []

    # ---- what the cluster needs

    @property
    def ssh_args(self) -> list[str]:
        """ssh options that trust only this network's host keys and log in with its client key."""
        return [
            "-F",
            "/dev/null",
            "-i",
            os.path.join(self.dir, "client_key"),
            "-o",
            f"UserKnownHostsFile={os.path.join(self.dir, 'known_hosts')}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
            # one connection per host, reused by the launcher's many short commands
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={os.path.join(self.dir, 'cm-%C')}",
            "-o",
            "ControlPersist=yes",
        ]

    def cluster_options(self, engines_per_host: int = 1) -> dict:
        """Keyword arguments that make ``MixleCluster(..., launcher="ssh", **them)`` start
        ``engines_per_host`` engines on every host, the controller on the bridge address."""
        from traitlets.config import Config

        config = Config()
        config.SSHLauncher.ssh_args = self.ssh_args
        config.SSHLauncher.scp_args = self.ssh_args
        config.SSHLauncher.remote_python = sys.executable  # the filesystem is shared
        # the engines' profile (their logs) in the harness's directory, removed with it
        config.SSHLauncher.remote_profile_dir = os.path.join(self.dir, "remote_profile")
        config.SSHEngineSetLauncher.engines = {h.location: engines_per_host for h in self.hosts}
        # the engines get the connection info in their environment (IPP_CONNECTION_INFO): no
        # connection files to copy, which saves several ssh round trips per engine
        config.SSHEngineLauncher.to_send = []
        lo, hi = self.engine_ports[0], self.engine_ports[-1]
        return {
            "config": config,
            "controller_ip": self.controller_ip,
            "controller_args": [f"--IPController.engine_ports={lo}-{hi}"],
        }

    # ---- building and removing

    def __enter__(self) -> SimulatedNetwork:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def open(self) -> None:
        remove_stale()
        subnet = _free_subnet(self.tag)
        addresses = list(subnet.hosts())
        self.controller_ip = str(addresses[0])
        self._add_link(self.bridge, ["type", "bridge"])
        _run(["ip", "addr", "add", f"{addresses[0]}/{subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        self.engine_ports = _free_ports(self.controller_ip, ENGINE_PORTS, self.tag)
        self._make_keys()
        for i in range(self.n_hosts):
            host = SimulatedHost(
                i,
                f"{self.tag}h{i}",
                f"{self.tag}-host{i}",
                str(addresses[i + 1]),
                f"{self.tag}v{i}",
                ["ssh"] + self.ssh_args,
            )
            self.hosts.append(host)
            self._plug(host, subnet.prefixlen)
        self._write_trust()
        for host in self.hosts:
            config = self._sshd_config(host)
            host._start_sshd(config, os.path.join(self.dir, f"sshd{host.index}.log"))

    def close(self) -> None:
        """Remove everything; raises RuntimeError naming any process that outlived its host."""
        for host in self.hosts:  # the shared ssh connections first (local processes)
            host.disconnect()
        dying = [proc for host in self.hosts for proc in host._kill_sshd()]
        survivors = _wait_gone(dying)
        for netns in self._made_netns:
            _run(["ip", "netns", "del", netns], check=False)
        for link in reversed(self._made_links):  # veths vanish with their namespace
            if os.path.exists(f"/sys/class/net/{link}"):
                _run(["ip", "link", "del", link], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        self._made_netns, self._made_links = [], []
        if survivors:
            raise RuntimeError(f"processes outlived their simulated host: {survivors}")

    def _add_link(self, name, spec) -> None:
        _run(["ip", "link", "add", name] + spec)
        self._made_links.append(name)

    def _plug(self, host: SimulatedHost, prefixlen: int) -> None:
        _run(["ip", "netns", "add", host.netns])
        self._made_netns.append(host.netns)
        self._add_link(host.veth, ["type", "veth", "peer", "name", "eth0", "netns", host.netns])
        _run(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        inside = ["ip", "-n", host.netns]
        _run(inside + ["addr", "add", f"{host.address}/{prefixlen}", "dev", "eth0"])
        _run(inside + ["link", "set", "eth0", "up"])
        _run(inside + ["link", "set", "lo", "up"])

    def _make_keys(self) -> None:
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        _run(keygen + ["-C", f"{self.tag}-client", "-f", os.path.join(self.dir, "client_key")])
        shutil.copy(os.path.join(self.dir, "client_key.pub"), os.path.join(self.dir, "authorized_keys"))

    def _write_trust(self) -> None:
        lines = []
        for host in self.hosts:
            key = os.path.join(self.dir, f"host{host.index}_key")
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.hostname, "-f", key])
            kind, blob = open(key + ".pub").read().split()[:2]
            lines.append(f"{host.address} {kind} {blob}\n")
        with open(os.path.join(self.dir, "known_hosts"), "w") as f:
            f.writelines(lines)

    def _sshd_config(self, host: SimulatedHost) -> str:
        """Key-only root login on the host's address; engines find the test modules through
        PYTHONPATH (functions run on ranks pickle by module and name), as an installed package
        would be found on a real host, and this checkout's mixle_nb before any installed one."""
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.path.join(self.dir, f"sshd{host.index}_config")
        with open(path, "w") as f:
            f.write(
                f"ListenAddress {host.address}\nPort 22\n"
                f"HostKey {os.path.join(self.dir, f'host{host.index}_key')}\n"
                f"AuthorizedKeysFile {os.path.join(self.dir, 'authorized_keys')}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
                "MaxStartups 100\nSubsystem sftp /usr/lib/openssh/sftp-server\n"
                f"SetEnv PYTHONPATH={os.path.dirname(tests)}:{tests}:{os.path.join(tests, 'multihost')}\n"
            )
        return path


def _free_subnet(tag: str) -> ipaddress.IPv4Network:
    """A /24 of the benchmarking range that no interface here uses (start chosen by our pid)."""
    used = set()
    for line in _run(["ip", "-4", "-o", "addr"]).stdout.splitlines():
        address = ipaddress.ip_interface(line.split()[3])
        used.add(address.network.supernet(new_prefix=24) if address.network.prefixlen >= 24 else address.network)
    subnets = list(BENCHMARK_NET.subnets(new_prefix=24))
    start = int(_OWNED.match(tag).group(1)) % len(subnets)
    for subnet in subnets[start:] + subnets[:start]:
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError("no free /24 left in 198.18.0.0/15")


def _free_ports(address: str, count: int, tag: str) -> range:
    """``count`` consecutive ports free on ``address``, below the ephemeral range (where no
    random port lands); the first block tried is chosen by our pid."""
    blocks = range(20000, 32768 - count, count)
    first = int(_OWNED.match(tag).group(1))
    for i in range(len(blocks)):
        ports = range(blocks[(first + i) % len(blocks)], blocks[(first + i) % len(blocks)] + count)
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind((address, port))
        except OSError:  # taken: next block
            continue
        return ports
    raise RuntimeError(f"no {count} free consecutive ports on {address}")


def remove_stale() -> None:
    """Remove the namespaces, links and key directories that earlier harness runs left behind
    (their owner died; its processes died with it)."""

    def stale(name):
        owner = _OWNED.match(name)
        return owner is not None and not psutil.pid_exists(int(owner.group(1)))

    temp = tempfile.gettempdir()
    for name in os.listdir(temp):
        if _KEY_DIR.match(name) and stale(name):
            shutil.rmtree(os.path.join(temp, name), ignore_errors=True)

    for line in _run(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if stale(name):
            _run(["ip", "netns", "del", name], check=False)
    for line in _run(["ip", "-o", "link"]).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if stale(name):
            _run(["ip", "link", "del", name], check=False)

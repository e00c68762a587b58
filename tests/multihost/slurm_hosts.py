"""A real Slurm on the simulated hosts: ``slurmctld`` beside the controller, one ``slurmd`` in
each host of a :class:`~simulated_hosts.SimulatedNetwork`, ``munged`` with a per-run key.

Debian's ``slurm-wlm`` packages (``make test`` installs them). The generated ``slurm.conf``
uses no cgroups and no accounting (``proctrack/linuxproc``, ``task/none``, ``select/cons_tres``)
and names every host by its hostname, with its bridge address as ``NodeAddr``. Each ``slurmd``
runs inside its host's network, UTS, PID and mount namespaces (entered with ``nsenter``), so
jobs run there as on a compute node, and the host's PID 1 takes them down with it.

Everything lives in a directory of the network's own (key, sockets, spool, state, logs) and
every daemon is started and stopped here by its pid. Clients (``sbatch``, ``squeue``,
``scancel``) find this Slurm through ``SLURM_CONF`` (:meth:`SlurmOnHosts.environment`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import psutil
from simulated_hosts import SimulatedNetwork, _run

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "nsenter")
CPUS_PER_HOST = 2
PARTITION = "mixle"
READY_S = 60.0  # slurmctld up and every node idle (a loaded machine is slow to start daemons)
STOP_S = 10.0


def missing_slurm() -> str | None:
    """What this machine lacks to run Slurm here, in words; None if nothing."""
    missing = [d for d in DAEMONS if not os.access(d, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return f"Slurm tests need {', '.join(missing)} (apt-get install slurm-wlm munge; `make test` does)"
    return None


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


class SlurmOnHosts:
    """Slurm daemons on ``network``'s hosts; a context manager that leaves nothing behind."""

    def __init__(self, network: SimulatedNetwork, cpus_per_host: int = CPUS_PER_HOST):
        self.network, self.cpus_per_host = network, cpus_per_host
        self.dir = os.path.join(network.dir, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.partition = PARTITION
        self._daemons: list[tuple[str, subprocess.Popen]] = []

    # ---- what clients need

    def environment(self) -> dict[str, str]:
        """Variables that point ``sbatch``, ``squeue`` and ``scancel`` at this Slurm."""
        return {"SLURM_CONF": self.conf}

    def squeue(self, *args: str) -> list[str]:
        """``squeue`` lines (no header) for this Slurm, with ``args``."""
        done = _run(["squeue", "-h", *args], env={**os.environ, **self.environment()})
        return [line for line in done.stdout.splitlines() if line.strip()]

    def daemon_pids(self) -> set[int]:
        """The pids of this harness's daemons (and the ``setpriv``/``nsenter`` they run under)."""
        pids = set()
        for _, proc in self._daemons:
            try:
                pids |= {proc.pid} | {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.Error:
                pass
        return pids

    def leftovers(self) -> dict[str, list[str]]:
        """Per host, the names of the processes there that are not the harness's (sshd, slurmd)."""
        ours = self.daemon_pids()
        return {h.hostname: [p.name() for p in h.processes() if p.pid not in ours] for h in self.network.hosts}

    def jobs(self) -> list[str]:
        """``id state`` of every job Slurm still runs or holds (pending, running, completing)."""
        return self.squeue("-o", "%i %T")

    # ---- building and removing

    def __enter__(self) -> SlurmOnHosts:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def open(self) -> None:
        os.makedirs(os.path.join(self.dir, "state"), mode=0o700)
        for host in self.network.hosts:
            os.makedirs(os.path.join(self.dir, f"spool-{host.hostname}"))
        key = os.path.join(self.dir, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(1024))  # this run's key: no other munge can talk to this Slurm
        self.munge_socket = os.path.join(self.dir, "munge.socket")
        self._start(
            "munged",
            [
                "/usr/sbin/munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.dir}/munged.pid",
                f"--seed-file={self.dir}/munge.seed",
                f"--log-file={self.dir}/munged.log",
            ],
        )
        self._wait(lambda: os.path.exists(self.munge_socket), "munged did not create its socket")
        self._write_conf()
        self._name_hosts()
        self._start("slurmctld", ["/usr/sbin/slurmctld", "-D", "-f", self.conf])
        for host in self.network.hosts:
            # into the host's namespaces: slurmd sees its hostname and address, its jobs die
            # with the host's PID 1
            self._start(
                f"slurmd {host.hostname}",
                [
                    "nsenter",
                    "-t",
                    str(host._listener.pid),
                    "-n",
                    "-u",
                    "-p",
                    "-m",
                    "/usr/sbin/slurmd",
                    "-D",
                    "-f",
                    self.conf,
                    "-N",
                    host.hostname,
                ],
            )
        names = {h.hostname for h in self.network.hosts}
        self._wait(lambda: self._idle_nodes() >= names, "the Slurm nodes did not come up idle")

    def _name_hosts(self) -> None:
        """Every host resolves the others' names (as DNS would on a real cluster): an
        ``/etc/hosts`` of the network, bound over the file in each host's own mount namespace."""
        hosts = os.path.join(self.dir, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{h.address} {h.hostname}\n" for h in self.network.hosts))
        for host in self.network.hosts:
            _run(["nsenter", "-t", str(host._listener.pid), "-m", "mount", "--bind", hosts, "/etc/hosts"])

    def _idle_nodes(self) -> set[str]:
        done = _run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, env={**os.environ, **self.environment()})
        return {
            line.split()[0] for line in done.stdout.splitlines() if len(line.split()) == 2 and line.split()[1] == "idle"
        }

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(os.path.join(self.dir, f"{name.replace(' ', '-')}.out"), "w")
        with log:
            proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", *cmd],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **self.environment()},
            )
        self._daemons.append((name, proc))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():
            dead = [(n, p.returncode) for n, p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what} (exited: {dead}); logs in {self.dir}:\n{self._logs()}")
            time.sleep(0.2)

    def _logs(self) -> str:
        tails = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    tails.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(tails)

    def close(self) -> None:
        """Stop every daemon by pid (slurmds first, munged last); raise if one survived."""
        survivors = []
        for _name, proc in reversed(self._daemons):
            procs = [psutil.Process(proc.pid)] if proc.poll() is None else []
            try:
                procs += psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                pass
            for p in procs[::-1]:  # the daemon itself (under setpriv/nsenter) first
                try:
                    p.terminate()
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=STOP_S)
            for p in alive:
                p.kill()
            survivors += psutil.wait_procs(alive, timeout=STOP_S)[1]
            proc.wait(STOP_S)
        self._daemons = []
        if survivors:
            raise RuntimeError(f"Slurm processes survived their stop: {survivors}")

    def _write_conf(self) -> None:
        net = self.network
        controller = socket.gethostname().split(".")[0]
        nodes = "".join(
            f"NodeName={h.hostname} NodeAddr={h.address} NodeHostname={h.hostname} "
            f"CPUs={self.cpus_per_host} RealMemory=1000 State=UNKNOWN\n"
            for h in net.hosts
        )
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(
                f"ClusterName={net.tag}\n"
                f"SlurmctldHost={controller}({net.controller_ip})\n"
                f"SlurmctldPort={_free_port(net.controller_ip)}\nSlurmdPort=6818\n"
                f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={self.munge_socket}\n"
                "SlurmUser=root\nSlurmdUser=root\n"
                f"StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool-%n\n"
                f"SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n"
                f"SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n"
                "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
                "JobCompType=jobcomp/none\nMpiDefault=none\nSchedulerType=sched/builtin\n"
                # the configured CPUs, not the machine's; nodes come back by themselves
                "SlurmdParameters=config_overrides\nReturnToService=2\n"
                # scancel: SIGKILL 2 s after SIGTERM (default 30); cancelled jobs stay listed
                "KillWait=2\nMinJobAge=300\nInactiveLimit=0\nMessageTimeout=20\n"
                "SlurmdTimeout=30\nSlurmctldTimeout=30\n"
                f"{nodes}PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
            )
        # slurmd 22.05 loads a cgroup plugin even when no plugin uses one; named here, it only
        # reads the hierarchy (nothing constrained, nothing created)
        with open(os.path.join(self.dir, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nCgroupMountpoint=/sys/fs/cgroup\n")

"""The processes behind a cluster's ranks: ipyparallel's controller and engines, the Slurm job,
and the lifeline that ends them with the process that started them.

:class:`EngineProcesses` starts them (:meth:`~EngineProcesses.launch`) or takes over a detached
cluster's (:meth:`~EngineProcesses.reconnect`), knows each rank's engine (pid, host, GPUs) and
ends them all (:meth:`~EngineProcesses.stop`), waiting until every local process has exited.
:class:`~mixle_nb.cluster.MixleCluster` holds one; the group on the engines is the cluster's.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from . import engine
from .calls import POLL_S
from .detached import DetachedRecord
from .ipyparallel_internals import client_interface
from .launch import LaunchSpec
from .lifeline import TERM_GRACE_S, Lifeline
from .processes import OwnedProcesses, RankProcess
from .slurm import SlurmJob
from .stray_messages import MessageGuard


class EngineProcesses:
    """A cluster's controller and engines, its Slurm job and its lifeline, once launched.

    Attributes
    ----------
    ipp : ipyparallel.Cluster or None
        The ipyparallel cluster, while there is one.
    client : ipyparallel.Client or None
        Connected to its controller.
    ranks : dict of int to RankProcess
        The engine behind each rank (rank r is engine r when launched).
    owned : OwnedProcesses
        Every local process launched (controller, schedulers, engines, nannies).
    lifeline : Lifeline or None
        Ends them all if this process dies (None once detached).
    job : SlurmJob or None
        The engines' batch job under ``launcher="slurm"``.
    guard : MessageGuard or None
        Drops and counts the stray messages that reach the client.
    """

    def __init__(self, here: str) -> None:
        self.here = here  # this host's name: engines elsewhere have pids that mean nothing here
        self.ipp: Any = None
        self.client: Any = None
        self.ranks: dict[int, RankProcess] = {}
        self.owned = OwnedProcesses()
        self.lifeline: Lifeline | None = None
        self.job: SlurmJob | None = None
        self.guard: MessageGuard | None = None
        self._batch_dir: str | None = None  # the job's batch script
        self._socket_dir: str | None = None  # the controller's Unix sockets (all on this host)

    def launch(self, spec: LaunchSpec, n: int, threads: int, report: Callable[[str], None]) -> None:
        """Start the controller and ``n`` engines of ``threads`` threads each as ``spec`` says,
        and wait until every engine registered as engine 0..n-1 and described itself."""
        import ipyparallel as ipp

        if spec.slurm is not None:  # the batch script's private folder
            self._batch_dir = tempfile.mkdtemp(prefix="mixle-slurm-")
        if spec.on_this_host and os.name == "posix":  # private (0700): no other user can connect there
            self._socket_dir = tempfile.mkdtemp(prefix="mixle-ipc-")
        self.ipp = ipp.Cluster(**spec.cluster_arguments(n, self._batch_dir, self._socket_dir))
        lifeline = self._start_lifeline()
        for folder in (self._batch_dir, self._socket_dir):
            if folder:
                lifeline.remove(folder)
        self.ipp.start_controller_sync()
        self.owned.own(self.ipp.controller.pid)
        report("controller started")
        thread_env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        self.ipp.start_engines_sync(n, environment=thread_env)
        if spec.slurm is not None:
            self.job = SlurmJob(self.ipp.engine_set.job_id)
            lifeline.run(["scancel", self.job.job_id])  # the job ends with this process too
            self.job.wait_running(spec.slurm.pending_timeout, report)
        from ipyparallel.cluster.launcher import SSHLauncher

        for launcher in getattr(self.ipp.engine_set, "launchers", {}).values():
            if not isinstance(launcher, SSHLauncher):  # an ssh launcher's pid is on its host
                self.owned.own(launcher.pid)
        self.client = self.ipp.connect_client_sync()
        self.guard = MessageGuard(self.client)
        self._await_engines(n, report)

    def _start_lifeline(self) -> Lifeline:
        """Every process and file of this cluster ends with this process, by any signal."""
        lifeline = self.lifeline = self.owned.lifeline = Lifeline()
        profile, cluster_id = self.ipp.profile_dir, self.ipp.cluster_id
        lifeline.remove(self.ipp.cluster_file)
        lifeline.remove(os.path.join(profile, "security", f"ipcontroller-{cluster_id}-*.json"))
        lifeline.remove(os.path.join(profile, "log", f"*-{cluster_id}-*.log"))
        return lifeline

    def _await_engines(self, n: int, report: Callable[[str], None]) -> None:
        """Wait for all engines, asking each to describe itself as soon as it registers."""
        deadline = time.monotonic() + self.ipp.engine_timeout
        asked: dict[int, Any] = {}
        while len(asked) < n:
            for eid in sorted(set(self.client.ids) - set(asked)):
                asked[eid] = self.client[eid].apply_async(engine.describe)
                report(f"{len(asked)}/{n} engines registered")
            self._raise_if_engines_exited()
            self._raise_if_controller_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(asked)} of {n} engines registered within "
                    f"{self.ipp.engine_timeout} s; see the engine logs in "
                    f"{self.ipp.profile_dir}/log"
                )
            time.sleep(POLL_S)
        if sorted(asked) != list(range(n)):
            raise RuntimeError(
                f"engine ids {sorted(asked)} are not 0..{n - 1}; "
                "the controller must be fresh (do not reuse its profile's engines)"
            )
        described = [asked[eid].get(self.ipp.engine_timeout) for eid in range(n)]
        self._adopt_ranks(RankProcess(info["pid"], info["host"], info["gpus"]) for info in described)
        self.owned.own_children()  # schedulers and nannies, so stop() waits for them too

    def _raise_if_controller_exited(self) -> None:
        """Local engines start beside the controller, not once it is up (:mod:`.rank_engine`),
        so a controller that exits at start is noticed here rather than after ``engine_timeout``."""
        process = self.owned.get(self.ipp.controller.pid)
        try:
            running = process is not None and process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            running = False
        if not running:
            raise RuntimeError(f"the controller exited during start:\n{self.ipp.controller.get_output()}")

    def _raise_if_engines_exited(self) -> None:
        stopped = getattr(self.ipp.engine_set, "stop_data", None) or {}
        if stopped.get("engines"):
            output = self.ipp.engine_set.get_output()
            raise RuntimeError(f"engines exited during start: {stopped['engines']}\n{output}")

    def reconnect(self, record: DetachedRecord) -> None:
        """Take over the detached cluster of ``record``: its ipyparallel cluster and client, its
        ranks (checked to be the engines detached) and its local processes.

        Raises
        ------
        RuntimeError
            An engine is not the one detached (the cluster was changed since).
        """
        import ipyparallel as ipp

        self.ipp = ipp.Cluster.from_file(
            cluster_id=record.cluster_id,
            profile_dir=record.profile_dir,
            log_level=logging.WARNING,
            shutdown_atexit=False,
        )
        self.client = self.ipp.connect_client_sync()
        self.guard = MessageGuard(self.client)
        self._socket_dir = _socket_dir(self.client)
        self.client.wait_for_engines(record.n, timeout=self.ipp.engine_timeout)
        described = self.client[list(range(record.n))].apply_sync(engine.describe)
        for r, (rank, info) in enumerate(zip(record.ranks, described)):
            if (rank.pid, rank.host) != (info["pid"], info["host"]):
                raise RuntimeError(
                    f"engine {r} is pid {info['pid']} on {info['host']}, not the rank "
                    f"detached ({rank.pid} on {rank.host}): the cluster was changed since"
                )
        self._adopt_ranks(RankProcess(rank.pid, rank.host, rank.gpus) for rank in record.ranks)
        self.owned.own(record.controller_pid)
        self.owned.own_children()

    def _adopt_ranks(self, ranks: Iterable[RankProcess]) -> None:
        """Rank r is the r-th of ``ranks``; those on this host become processes owned."""
        self.ranks = {}
        for r, rank in enumerate(ranks):
            if rank.host == self.here:  # a pid from another host means nothing here
                self.owned.own(rank.pid)
                rank.process = self.owned.get(rank.pid)
            self.ranks[r] = rank

    def keep_ranks(self, survivors: list[int]) -> None:
        """Go on with the engines of ranks ``survivors`` only: rank i is the engine of rank
        ``survivors[i]``."""
        self.ranks = {i: self.ranks[r] for i, r in enumerate(survivors)}

    def on_one_host(self) -> bool:
        """Whether every engine runs on this host."""
        return all(info.host == self.here for info in self.ranks.values())

    def backend_for(self, requested: str) -> str:
        """The group's backend for ``requested`` ("auto": nccl when every engine has a GPU).

        Raises
        ------
        ValueError
            nccl requested, and an engine has no GPU.
        """
        no_gpu = [r for r, info in self.ranks.items() if info.gpus == 0]
        if requested == "nccl" and no_gpu:
            raise ValueError(
                f"backend='nccl' needs a GPU on every engine; ranks {no_gpu} have none: use backend='gloo' or 'auto'"
            )
        if requested == "auto":
            return "gloo" if no_gpu else "nccl"
        return requested

    def devices_by_host(self) -> dict[int, int]:
        """One GPU per rank: the i-th rank on a host gets that host's device i.

        Raises
        ------
        ValueError
            A host runs more ranks than it has GPUs.
        """
        devices: dict[int, int] = {}
        seen: dict[str, int] = {}
        for r, info in sorted(self.ranks.items()):
            devices[r] = local = seen.get(info.host, 0)
            seen[info.host] = local + 1
            if local >= info.gpus:
                raise ValueError(
                    f"host {info.host} runs {local + 1}+ ranks but has {info.gpus} "
                    "GPUs; nccl needs one GPU per rank: start fewer engines there"
                )
        return devices

    def remove_at_death(self, path: str) -> None:
        """Have the lifeline remove ``path`` if this process dies (nothing once detached)."""
        if self.lifeline is not None:
            self.lifeline.remove(path)

    def release(self) -> None:
        """Let the processes outlive this process (detach): the lifeline lets go of them."""
        if self.lifeline is not None:
            self.lifeline.release()
        self.owned.lifeline = self.lifeline = None

    def cut(self) -> bool:
        """End every process at once through the lifeline, as this process's death would;
        whether there was a lifeline to cut (a detached cluster has none)."""
        lifeline = self.lifeline
        if lifeline is None:
            return False
        lifeline.cut(wait_s=2 * TERM_GRACE_S + 1.0)
        self.owned.lifeline = self.lifeline = None
        return True

    def stop(self, goodbye: Callable[[], None] | None) -> None:
        """End every process and wait until the local ones have exited: ``goodbye()`` first
        (the ranks leave their group) when given, the engines killed when it fails or is not
        given; then the controller, the Slurm job (``scancel``, waiting until it has left the
        queue) and whatever else was owned; the lifeline's files go too."""
        try:
            if self.ipp is not None:
                self._stop_ipyparallel(goodbye)
        finally:
            if self.job is not None:  # scancel, and wait until the job has left the queue
                job, self.job = self.job, None
                job.cancel()
            self.owned.reap()  # whatever went wrong above, no process of ours outlives stop()
            for folder in (self._batch_dir, self._socket_dir):
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)
            self._batch_dir = self._socket_dir = None
            if self.lifeline is not None:
                self.lifeline.close()
            self.owned.lifeline = self.lifeline = None
            self.client = self.ipp = self.guard = None
            self.ranks = {}

    def _stop_ipyparallel(self, goodbye: Callable[[], None] | None) -> None:
        self.owned.own_children()
        try:
            if goodbye is None:
                self.kill_engines()
            else:
                goodbye()
        except Exception:  # a failed goodbye must not keep processes alive
            self.kill_engines()
        if self.client is not None:
            self.client.close()
        # ipyparallel 9 engines exit with status 1 when stopped, and Cluster then logs every
        # engine's whole output at WARNING into the notebook; that is noise at a normal stop.
        self.ipp.log.setLevel(logging.ERROR)
        self.ipp.stop_cluster_sync()

    def kill_engines(self) -> None:
        """SIGKILL every engine: a rank blocked in a collective ignores SIGTERM until it times out."""
        for engine_set in self.ipp.engines.values():
            for launcher in list(getattr(engine_set, "launchers", {}).values()) or [engine_set]:
                try:
                    launcher.signal(signal.SIGKILL)
                except Exception:  # already gone
                    pass


def _socket_dir(client: Any) -> str | None:
    """The folder of the controller's Unix sockets that ``client`` connected to (None over TCP)."""
    transport, _, path = client_interface(client).partition("://")
    return os.path.dirname(path) if transport == "ipc" else None

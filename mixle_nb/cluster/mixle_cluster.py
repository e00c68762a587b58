"""MixleCluster: ipyparallel engines that form one torch.distributed group, and never hang.

A plain Python API (no IPython, no widgets). Lifecycle, as in ``ipyparallel.Cluster``:
``start()`` -> running -> ``stop()``; ``restart()`` replaces every process; a dead rank, or a
rank that an interrupt could not stop, marks the cluster *broken* until ``restart()``.

Rank r is engine r. On one host the rendezvous is a ``FileStore`` in a private temporary
directory and gloo is pinned to the loopback interface, so the group opens no socket to the
network. Engines on other hosts rendezvous through a ``TCPStore`` at engine 0's address
(:meth:`MixleCluster._rendezvous`).

Interrupts and failures never leave a rank waiting: the ranks still running a call are sent
SIGINT; those that do not return promptly are inside a collective, so the other ranks shut down
their group connections, which makes it fail at once; then the group is formed again on the
same engines if any rank may have left it mid-collective.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .. import validation
from . import detached as detached_records
from . import engine
from .calls import POLL_S, RankCall, RankDiedError, collective_broken
from .launch import LaunchSpec
from .lifeline import TERM_GRACE_S, Lifeline
from .processes import OwnedProcesses, RankProcess
from .slurm import SlurmJob
from .state import ClusterState
from .status import ClusterStatus, RankStatus

MAX_ENGINES = 256
BACKENDS = ("auto", "gloo", "nccl")
INTERRUPT_SETTLE_S = 0.5  # after SIGINT, a rank still running is taken to sit in a collective
_live: weakref.WeakSet = weakref.WeakSet()


def _registry():
    # the package holds the current-cluster registry (tests and tools patch it there)
    from .. import cluster

    return cluster


class MixleCluster:
    """``n`` ipyparallel engines forming one torch.distributed group (rank = engine id).

    Its processes end with the process that started it, by any signal (see
    :mod:`~mixle_nb.cluster.lifeline`), unless it is ``detached`` (or :meth:`detach` is
    called): then it runs on until :meth:`stop`, and a new process attaches to it with
    :meth:`attach` (:meth:`list_detached` lists this user's). ``%px`` is not activated here:
    the magics call ``cluster.view.activate()``. Nothing starts before :meth:`start`; every
    argument is checked here.

    Parameters
    ----------
    n : int
        Engines, one rank each (at most :data:`MAX_ENGINES`).
    backend : {"auto", "gloo", "nccl"}
        The torch.distributed backend; "auto" is nccl when every engine has a GPU, else gloo.
    timeout : float
        Seconds a collective, or the group's rendezvous, may take.
    launcher : str
        The ipyparallel engine launcher: "local", "mpi", "ssh", "slurm", ...
    threads : int
        ``OMP_NUM_THREADS`` (and torch's threads) on each engine.
    detached : bool
        Start detached (see :meth:`detach`).
    controller_ip : str, optional
        The interface the controller listens on (``"*"``: every one); engines on other hosts
        reach it there.
    controller_args : sequence of str
        Extra controller arguments, e.g. ``["--IPController.engine_ports=10101-10116"]``.
    config : traitlets.config.Config, optional
        ipyparallel's launcher configuration (``SSHEngineSetLauncher.engines``, ...).
    partition, account, time : str, optional
        ``launcher="slurm"``: ``sbatch``'s ``--partition``, ``--account``, ``--time``.
    nodes, ntasks_per_node, gpus_per_task : int, optional
        ``launcher="slurm"``: ``sbatch``'s ``--nodes``, ``--ntasks-per-node``, ``--gpus-per-task``.
    extra_sbatch : sequence of str, optional
        ``launcher="slurm"``: more ``sbatch`` options, e.g. ``["--qos=debug"]``.
    pending_timeout : float, optional
        ``launcher="slurm"``: seconds :meth:`start` waits for the job to run (300 by default).
    mpiexec_args : sequence of str, optional
        ``launcher="mpi"``: ``mpiexec`` options, e.g. ``["--hostfile", "hosts"]``.
    **ipyparallel_options
        Any other ``ipyparallel.Cluster`` option by its trait name (``profile_dir``,
        ``controller_location``, ``engine_timeout``, ``log_level``, ...).

    Raises
    ------
    TypeError
        A keyword that is neither one of these nor an ``ipyparallel.Cluster`` option (a typo:
        the message names it and the valid ones).
    ValueError
        A value out of range, or a launcher's option given to another launcher (a Slurm option
        with ``launcher="local"``).

    Examples
    --------
    ::

        with MixleCluster(2) as c:
            c.run(lambda: torch.distributed.get_rank())   # [0, 1]

        MixleCluster(8, launcher="slurm", partition="gpu", time="00:30:00", gpus_per_task=1)
        MixleCluster(4, launcher="mpi", mpiexec_args=["--hostfile", "hosts"])
    """

    def __init__(
        self,
        n: int,
        *,
        backend: str = "auto",
        timeout: float = 60.0,
        launcher: str = "local",
        threads: int = 1,
        detached: bool = False,
        controller_ip: str | None = None,
        controller_args: Sequence[str] = (),
        config: Any = None,
        partition: str | None = None,
        account: str | None = None,
        time: str | None = None,
        nodes: int | None = None,
        ntasks_per_node: int | None = None,
        gpus_per_task: int | None = None,
        extra_sbatch: Sequence[str] | None = None,
        pending_timeout: float | None = None,
        mpiexec_args: Sequence[str] | None = None,
        **ipyparallel_options: Any,
    ) -> None:
        n = validation.positive_int("n", n)
        if n > MAX_ENGINES:
            raise ValueError(f"n must be at most {MAX_ENGINES} engines; got {n}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        timeout = validation.positive_real("timeout", timeout)
        threads = validation.positive_int("threads", threads)
        self.launch_spec = LaunchSpec.build(
            launcher,
            slurm_options={
                "partition": partition,
                "account": account,
                "time": time,
                "nodes": nodes,
                "ntasks_per_node": ntasks_per_node,
                "gpus_per_task": gpus_per_task,
                "extra_sbatch": extra_sbatch,
                "pending_timeout": pending_timeout,
            },
            mpiexec_args=mpiexec_args,
            controller_ip=controller_ip,
            controller_args=controller_args,
            config=config,
            ipyparallel_options=ipyparallel_options,
            own=_KEYWORDS,
        )
        if backend == "nccl" and launcher == "local":
            import torch  # only this check needs torch in the client

            if not torch.cuda.is_available():
                raise ValueError("backend='nccl' needs GPUs, and this host has none; use backend='gloo' or 'auto'")
        self.n, self.backend, self.timeout, self.threads = n, backend, timeout, threads
        self._started_n = n  # n is the ranks in the group now: fewer after drop_ranks
        self._engine_ids: list[int] = list(range(n))  # the engine behind each rank
        self.launcher = launcher
        self.detached = bool(detached)
        self._record: str | None = None  # a detached cluster's record (mixle_nb/cluster/detached.py)
        self._slurm = self.launch_spec.slurm
        self._job: SlurmJob | None = None
        self._batch_dir: str | None = None  # the job's batch script
        self.state = ClusterState.NEW
        self.broken_reason = ""
        self.client = self.view = None
        self._ipp = self._store_dir = self._lifeline = None
        self._ranks: dict[int, RankProcess] = {}
        self._processes = OwnedProcesses()
        self._views: dict[tuple[int, ...], Any] = {}
        self._last_call: dict[int, RankCall] = {}
        self._here = socket.gethostname()
        self._group_generation = 0
        self._forming_group = False
        self._stopping = threading.Lock()  # a panel's worker and the main thread may both stop a call
        self.group_backend: str | None = None
        _live.add(self)

    def __repr__(self) -> str:
        return f"<MixleCluster n={self.n} {self.state} backend={self.group_backend or self.backend}>"

    # ---- lifecycle

    def start(self, progress: Callable[[str], None] | None = None) -> MixleCluster:
        """Launch controller and engines, then form the group; ``progress`` gets short messages."""
        if self.state.has_processes:
            raise RuntimeError(f"cluster is already {self.state}; call stop() or restart()")
        report = progress or (lambda message: None)
        self.state, self.broken_reason = ClusterState.STARTING, ""
        try:
            self._launch(report)
            self._form_group(report)
        except BaseException:
            self._teardown()
            self.state = ClusterState.STOPPED
            raise
        self.view = self.client[:]
        self.view.block = True
        self.state = ClusterState.RUNNING
        _registry().set_current(self)
        if self.detached:
            self.detach()
        return self

    def detach(self) -> None:
        """Let the cluster outlive this process: it runs on, with everything on its ranks, until
        :meth:`stop`, here or in a process that attached to it (:meth:`attach`)."""
        if self.state != ClusterState.RUNNING:
            raise RuntimeError(f"only a running cluster can be detached; this one is {self.state}")
        if self._lifeline is not None:
            self._lifeline.release()
        self._processes.lifeline = self._lifeline = None
        self._record = detached_records.write_record(self)
        self.detached = True

    @classmethod
    def attach(cls, cluster_id: str | None = None, *, profile_dir: str | None = None) -> MixleCluster:
        """The detached cluster ``cluster_id`` (or the only one), running, with its group and
        everything on its ranks as it was; it stays detached. It becomes the current cluster."""
        record = detached_records.choose(detached_records.detached_clusters(profile_dir), cluster_id)
        cluster = cls(
            record["n"],
            backend=record["backend"],
            timeout=record["timeout"],
            launcher=record["launcher"],
            threads=record["threads"],
            detached=True,
        )
        detached_records.reconnect(cluster, record)
        cluster.view = cluster.client[:]
        cluster.view.block = True
        cluster.state = ClusterState.RUNNING
        _registry().set_current(cluster)
        return cluster

    @staticmethod
    def list_detached(profile_dir: str | None = None) -> list[dict]:
        """This user's detached clusters that still run: ``cluster_id``, ``n``, ``launcher``,
        ``detached_at`` (epoch seconds), ``detached_by`` (pid) and more, oldest first."""
        return detached_records.detached_clusters(profile_dir)

    def end_at_exit(self) -> None:
        """End the cluster at once through its lifeline, as this process's death would (for
        exit handlers: no goodbye to the ranks that could outlast a kernel's shutdown grace);
        a detached cluster is left running."""
        lifeline = self._lifeline
        if lifeline is not None:
            lifeline.cut(wait_s=2 * TERM_GRACE_S + 1.0)
            self._processes.lifeline = self._lifeline = None
            self.state = ClusterState.STOPPED

    def stop(self) -> None:
        """Destroy the group, stop engines and controller, and wait until their processes exit."""
        if self.state in (ClusterState.NEW, ClusterState.STOPPED):
            return
        self._teardown()
        self.state = ClusterState.STOPPED

    def restart(self, progress: Callable[[str], None] | None = None) -> MixleCluster:
        """Stop every process and start a fresh cluster with the same settings."""
        self.stop()
        return self.start(progress)

    def drop_ranks(self, dead: Sequence[int]) -> None:
        """Go on without the ranks ``dead``: the survivors, renumbered 0..n-1 in their old order,
        form a new group of their own (elastic recovery, mixle_nb/cluster/elastic.py). Every
        survivor must be idle; a rank that dies meanwhile raises :class:`RankDiedError` naming it
        in the new numbering."""
        survivors = [r for r in range(self.n) if r not in set(dead)]
        if not survivors:
            raise RankDiedError(sorted(dead), "; no rank is left to go on")
        self._engine_ids = [self._engine_ids[r] for r in survivors]
        self._ranks = {i: self._ranks[r] for i, r in enumerate(survivors)}
        self.n, self._views, self._last_call = len(survivors), {}, {}
        self.view = self.client[list(self._engine_ids)]
        self.view.block = True
        self.state, self.broken_reason = ClusterState.RUNNING, ""
        self._form_group()

    def __enter__(self) -> MixleCluster:
        return self.start() if self.state in (ClusterState.NEW, ClusterState.STOPPED) else self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __del__(self):
        try:
            if not self.detached:
                self.stop()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    def _launch(self, report) -> None:
        import ipyparallel as ipp

        if self._slurm is not None:  # the batch script's private folder
            self._batch_dir = tempfile.mkdtemp(prefix="mixle-slurm-")
        self._ipp = ipp.Cluster(**self.launch_spec.cluster_arguments(self.n, self._batch_dir))
        self._start_lifeline()
        if self._batch_dir:
            self._lifeline.remove(self._batch_dir)
        self._ipp.start_controller_sync()
        self._processes.own(self._ipp.controller.pid)
        report("controller started")
        thread_env = {k: str(self.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        self._ipp.start_engines_sync(self.n, environment=thread_env)
        if self._slurm is not None:
            self._job = SlurmJob(self._ipp.engine_set.job_id)
            self._lifeline.run(["scancel", self._job.job_id])  # the job ends with this process too
            self._job.wait_running(self._slurm.pending_timeout, report)
        from ipyparallel.cluster.launcher import SSHLauncher

        for launcher in getattr(self._ipp.engine_set, "launchers", {}).values():
            if not isinstance(launcher, SSHLauncher):  # an ssh launcher's pid is on its host
                self._processes.own(launcher.pid)
        self.client = self._ipp.connect_client_sync()
        self._await_engines(report)

    def _start_lifeline(self) -> None:
        """Every process and file of this cluster ends with this process, by any signal."""
        self._lifeline = self._processes.lifeline = Lifeline()
        profile, cluster_id = self._ipp.profile_dir, self._ipp.cluster_id
        self._lifeline.remove(self._ipp.cluster_file)
        self._lifeline.remove(os.path.join(profile, "security", f"ipcontroller-{cluster_id}-*.json"))
        self._lifeline.remove(os.path.join(profile, "log", f"*-{cluster_id}-*.log"))

    def _await_engines(self, report) -> None:
        """Wait for all engines, asking each to describe itself as soon as it registers."""
        deadline = time.monotonic() + self._ipp.engine_timeout
        asked: dict[int, Any] = {}
        while len(asked) < self.n:
            for eid in sorted(set(self.client.ids) - set(asked)):
                asked[eid] = self.client[eid].apply_async(engine.describe)
                report(f"{len(asked)}/{self.n} engines registered")
            self._raise_if_engines_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(asked)} of {self.n} engines registered within "
                    f"{self._ipp.engine_timeout} s; see the engine logs in "
                    f"{self._ipp.profile_dir}/log"
                )
            time.sleep(POLL_S)
        self._engine_ids = list(range(self.n))
        if sorted(asked) != list(range(self.n)):
            raise RuntimeError(
                f"engine ids {sorted(asked)} are not 0..{self.n - 1}; "
                "the controller must be fresh (do not reuse its profile's engines)"
            )
        for eid, ar in asked.items():
            info = ar.get(self._ipp.engine_timeout)
            rank = RankProcess(info["pid"], info["host"], info["gpus"])
            if rank.host == self._here:  # a pid from another host means nothing here
                self._processes.own(rank.pid)
                rank.process = self._processes.get(rank.pid)
            self._ranks[eid] = rank
        self._processes.own_children()  # schedulers and nannies, so stop() waits for them too

    def _raise_if_engines_exited(self) -> None:
        stopped = getattr(self._ipp.engine_set, "stop_data", None) or {}
        if stopped.get("engines"):
            output = self._ipp.engine_set.get_output()
            raise RuntimeError(f"engines exited during start: {stopped['engines']}\n{output}")

    # ---- the process group

    def _form_group(self, report=lambda message: None) -> None:
        """Form the group on every engine (again: each leaves the one it was in)."""
        backend = self.group_backend or self._choose_backend()
        devices = self._local_devices() if backend == "nccl" else {}
        self._group_generation += 1
        setup = {
            "world": self.n,
            "backend": backend,
            "timeout_s": self.timeout,
            "threads": self.threads,
            **self._rendezvous(),
        }
        self._forming_group = True
        try:
            calls = [
                self._start_call(
                    [r],
                    lambda view, r=r: view.apply_async(engine.form_group, rank=r, device=devices.get(r), **setup),
                    check=False,
                )
                for r in range(self.n)
            ]
            for call in calls:
                call.result(timeout=self.timeout + 30)  # + time for engines to finish importing torch
        finally:
            self._forming_group = False
        self._stopping = threading.Lock()  # a panel's worker and the main thread may both stop a call
        self.group_backend = backend
        report(f"torch.distributed group formed ({backend}, world {self.n})")

    def _rendezvous(self) -> dict:
        """Where the ranks meet: a fresh ``FileStore`` path when every engine runs here, else a
        ``TCPStore`` address on engine 0 that the other hosts can reach (multi-host launchers)."""
        if self._single_host():
            if self._store_dir is None:
                self._store_dir = tempfile.mkdtemp(prefix="mixle-rendezvous-")  # mode 0700
                self._lifeline.remove(self._store_dir)
            return {"store_path": os.path.join(self._store_dir, f"store-{self._group_generation}")}
        # engine 0 listens on its address toward the controller, which every host reaches
        return {"master": self._view_on([0]).apply_sync(engine.rendezvous_address)[0]}

    def _single_host(self) -> bool:
        return all(info.host == self._here for info in self._ranks.values())

    def _choose_backend(self) -> str:
        no_gpu = [r for r, info in self._ranks.items() if info.gpus == 0]
        if self.backend == "nccl" and no_gpu:
            raise ValueError(
                f"backend='nccl' needs a GPU on every engine; ranks {no_gpu} have none: use backend='gloo' or 'auto'"
            )
        if self.backend == "auto":
            return "gloo" if no_gpu else "nccl"
        return self.backend

    def _local_devices(self) -> dict[int, int]:
        """One GPU per local rank: the i-th rank on a host gets that host's device i (under
        Slurm, each task chooses from its own SLURM_LOCALID and CUDA_VISIBLE_DEVICES)."""
        if self._slurm is not None:
            from ..parallel.slurm_env import task_device

            return dict(enumerate(self._view_on(list(range(self.n))).apply_sync(task_device)))
        devices, seen = {}, {}
        for r in sorted(self._ranks):
            info = self._ranks[r]
            devices[r] = local = seen.get(info.host, 0)
            seen[info.host] = local + 1
            if local >= info.gpus:
                raise ValueError(
                    f"host {info.host} runs {local + 1}+ ranks but has {info.gpus} "
                    "GPUs; nccl needs one GPU per rank: start fewer engines there"
                )
        return devices

    # ---- stopping

    def _teardown(self) -> None:
        registry = _registry()
        if registry.current() is self:
            registry.set_current(None)
        try:
            if self._ipp is not None:
                self._stop_ipyparallel()
        finally:
            if self._job is not None:  # scancel, and wait until the job has left the queue
                self._job, job = None, self._job
                job.cancel()
            self._processes.reap()  # whatever went wrong above, no process of ours outlives stop()
            for folder in (self._store_dir, self._batch_dir):
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)
            self._batch_dir = None
            if self._lifeline is not None:
                self._lifeline.close()
            self._processes.lifeline = self._lifeline = None
            if self._record is not None and os.path.exists(self._record):
                os.remove(self._record)
            self._record = None
            self.client = self.view = self._ipp = self._store_dir = None
            self._ranks, self._views, self._last_call = {}, {}, {}
            self.group_backend = None
            self.n = self._started_n

    def _stop_ipyparallel(self) -> None:
        self._processes.own_children()
        if self.state == ClusterState.RUNNING and self.view is not None:
            self._leave_group()
        else:
            self._kill_engines()
        if self.client is not None:
            self.client.close()
        # ipyparallel 9 engines exit with status 1 when stopped, and Cluster then logs every
        # engine's whole output at WARNING into the notebook; that is noise at a normal stop.
        self._ipp.log.setLevel(logging.ERROR)
        self._ipp.stop_cluster_sync()

    def _leave_group(self) -> None:
        try:
            self.view.apply_async(engine.leave_group).get(min(self.timeout, 10.0))
        except Exception:  # a failed goodbye must not keep processes alive
            self._kill_engines()

    def _kill_engines(self) -> None:
        """SIGKILL every engine: a rank blocked in a collective ignores SIGTERM until it times out."""
        import signal

        for engine_set in self._ipp.engines.values():
            for launcher in list(getattr(engine_set, "launchers", {}).values()) or [engine_set]:
                try:
                    launcher.signal(signal.SIGKILL)
                except Exception:  # already gone
                    pass

    # ---- liveness and supervision (what a RankCall may ask of its cluster)

    def dead_ranks(self, ranks) -> list[int]:
        """Those of ``ranks`` whose engine has died or left the controller (every rank once
        the Slurm job has ended)."""
        if self._job is not None and self._job.ended():  # scancel, time limit, node down
            return list(ranks)
        registered = set(self.client.ids)
        return [r for r in ranks if self._engine_ids[r] not in registered or not self._ranks[r].alive()]

    def check_alive(self, ranks: Sequence[int]) -> None:
        """Raise :class:`RankDiedError` (marking the cluster broken) if any of ``ranks`` died."""
        dead = self.dead_ranks(ranks)
        if dead:
            raise self.ranks_died(dead)

    def ranks_died(self, ranks: Sequence[int]) -> RankDiedError:
        """Mark the cluster broken by the death of ``ranks``; returns the error to raise."""
        self.mark_broken(f"ranks {sorted(ranks)} died")
        # seen from here, a killed remote engine and one whose host dropped off the network
        # are the same: the controller stopped hearing from it
        remote = any(r in self._ranks and not self._ranks[r].local for r in ranks)
        detail = " or lost contact (no heartbeat from its host)" if remote else ""
        if self._job is not None:
            detail += f"; slurm job {self._job.job_id} is {self._job.final_state()}"
        return RankDiedError(ranks, detail)

    def mark_broken(self, reason: str) -> None:
        """The group cannot be trusted until ``restart()``; ``reason`` says why."""
        self.state, self.broken_reason = ClusterState.BROKEN, reason

    def call_finished(self, call: RankCall) -> None:
        """Remember the call for the status table. After a failure, form the group again if a
        rank's collective failed (timed out, lost its peer) or the ranks disagree on how many
        collectives they started: a rank that raised may have left one in flight."""
        for r in call.ranks:
            self._last_call[r] = call
        if self._forming_group or call.stopped() or self.state != ClusterState.RUNNING or not call.failed_ranks():
            return  # a success, or stop_call has settled the group already
        errors = [e for e in call.outcomes() if hasattr(e, "ename")]
        broken = any(collective_broken(e.evalue) for e in errors)
        # a call on some ranks starts no collective that counts (the handles refuse it), and the
        # other ranks may be busy: asking them would wait behind their work
        if broken or len(call.ranks) == self.n:
            self._repair_group(severed=broken)

    def interrupt(self, ranks: Sequence[int]) -> None:
        """SIGINT to ``ranks`` (KeyboardInterrupt in their running task; an idle engine ignores
        it): by pid on this host, through the engines' nannies elsewhere."""
        remote = [r for r in ranks if not self._ranks[r].local]
        for r in ranks:
            if self._ranks[r].local:
                self._ranks[r].interrupt()
        if remote:
            self.client.send_signal("SIGINT", targets=[self._engine_ids[r] for r in remote], block=False)

    def stop_call(self, call: RankCall, queued: Sequence[RankCall] = ()) -> None:
        """Stop every rank still running ``call`` or one of the calls ``queued`` behind it,
        within about one step, keeping the engines.

        SIGINT first. A rank still running :data:`INTERRUPT_SETTLE_S` later sits in a
        collective (or long C code), so every rank that has answered every call severs its
        group connections, which fails the collectives waiting on it at once. Then the group is
        formed again if it may be inconsistent. A rank that does not stop within the grace
        period marks the cluster broken.

        The queued calls are stopped with ``call``: an interrupt landing on one rank after the
        last collective of ``call`` leaves it finished on the others only, so they run the next
        call's steps alone and wait in its first collective.
        """
        with self._stopping:
            self._stop_calls([call, *queued])

    def _stop_calls(self, calls: list[RankCall]) -> None:
        if self.state != ClusterState.RUNNING:  # broken already: only restart() helps
            return

        def pending() -> list[int]:
            return sorted(set().union(*(c.pending() for c in calls)))

        grace = min(self.timeout, 10.0)
        deadline = time.monotonic() + grace
        settled_at = time.monotonic() + INTERRUPT_SETTLE_S
        severed: set[int] = set()
        try:
            self.interrupt(pending())
            # no second SIGINT: one landing while a rank sends its reply would lose the reply
            while not all(c.wait(POLL_S / len(calls)) for c in calls):
                if time.monotonic() > deadline:
                    self.mark_broken(
                        f"ranks {pending()} did not stop within {grace:g} s of the interrupt; call restart()"
                    )
                    return
                if time.monotonic() >= settled_at:
                    answered = set(range(self.n)) - set(pending()) - severed
                    self.sever_group(sorted(answered), grace)
                    severed |= answered
            for c in calls:
                for r in c.ranks:
                    self._last_call[r] = c
            self._repair_group(severed=bool(severed))
        except KeyboardInterrupt:
            self.mark_broken("interrupted again while stopping the ranks; call restart()")
            raise

    def sever_group(self, ranks: Sequence[int], grace: float) -> None:
        """``ranks`` (idle, alive) shut their group connections, failing at once any collective
        another rank waits in with them."""
        if ranks:
            self._view_on(list(ranks)).apply_async(engine.sever_group).get(grace)

    def _repair_group(self, severed: bool = False) -> None:
        """Form the group again unless every rank is in it having started the same number of
        collectives (so none was left inside one)."""
        try:
            states = self._view_on(list(range(self.n))).apply_async(engine.group_state).get(self.timeout)
            if severed or len(set(states)) > 1 or not all(in_group for in_group, _ in states):
                self._form_group()
        except Exception as exc:
            self.mark_broken(f"the group could not be formed again after a failure ({exc}); call restart()")

    def _require_usable(self, ranks) -> None:
        if self.state == ClusterState.BROKEN:
            dead = self.dead_ranks(range(self.n))
            if dead:
                raise RankDiedError(dead)
            raise RuntimeError(f"cluster needs restart(): {self.broken_reason}")
        if self.state != ClusterState.RUNNING:
            raise RuntimeError(f"cluster is {self.state}; call start() first")
        self.check_alive(ranks)

    # ---- working with ranks

    def _targets(self, targets) -> list[int]:
        if targets is None:
            return list(range(self.n))
        ranks = [targets] if not isinstance(targets, (list, tuple, range)) else list(targets)
        if not ranks:
            raise ValueError(f"targets must be ranks in 0..{self.n - 1}, got {targets!r}")
        checked = [validation.integer("targets", r, minimum=0) for r in ranks]
        bad = [r for r in checked if r >= self.n]
        if bad:
            raise ValueError(f"targets must be ranks in 0..{self.n - 1}, got {targets!r}")
        return checked

    def _view_on(self, ranks: list[int]):
        key = tuple(ranks)
        if key not in self._views:
            view = self._views[key] = self.client[[self._engine_ids[r] for r in ranks]]
            view.label = engine.call_label(ranks)  # tells the ranks who else runs the call
        return self._views[key]

    def _start_call(self, targets, launch: Callable[[Any], Any], check: bool = True) -> RankCall:
        """The prologue of every call: resolve ``targets``, check the cluster can take the call,
        then ``launch(view)`` (a non-blocking ipyparallel request) as a :class:`RankCall`."""
        ranks = self._targets(targets)
        if check:
            self._require_usable(ranks)
        return RankCall(self, ranks, launch(self._view_on(ranks)))

    def run_async(self, fn: Callable, *args, targets=None, **kwargs) -> RankCall:
        """Start ``fn(*args, **kwargs)`` on every rank (or on ``targets``); returns a RankCall."""
        return self._start_call(targets, lambda view: view.apply_async(fn, *args, **kwargs))

    def execute_async(self, code: str, targets=None) -> RankCall:
        """Start running ``code`` in every rank's namespace (or ``targets``'); its output is in
        ``RankCall.stdout`` while it runs."""
        return self._start_call(targets, lambda view: view.execute(code, silent=False, block=False))

    def run(self, fn: Callable, *args, targets=None, **kwargs) -> list:
        """``fn(*args, **kwargs)`` on every rank (or on ``targets``); per-rank results."""
        return self.run_async(fn, *args, targets=targets, **kwargs).result()

    def handle(self, name: str):
        """A reference to the handle bound to ``name`` on every rank (cluster/handle_reference.py)."""
        from .handle_reference import HandleReference

        return HandleReference(self, name)

    def push(self, targets=None, **values) -> None:
        """Bind ``values`` as globals on every rank (or on ``targets``)."""
        self._start_call(targets, lambda view: view.push(values, block=False)).result()

    def pull(self, name: str, rank: int | str = 0):
        """The global ``name`` from ``rank``, or a per-rank list for ``rank="all"``."""
        targets = None if rank == "all" else rank
        values = self._start_call(targets, lambda view: view.pull(name, block=False)).result()
        return values if rank == "all" else values[0]

    def scatter(self, name: str, sequence: Sequence) -> None:
        """Bind ``name`` on rank r to ``sequence[r::n]``."""
        calls = [
            self._start_call(r, lambda view, r=r: view.push({name: sequence[r :: self.n]}, block=False))
            for r in range(self.n)
        ]
        for call in calls:
            call.result()

    # ---- status

    def status(self) -> ClusterStatus:
        """One row per rank: pid, host, liveness, group membership, memory, last call time."""
        rows = ClusterStatus()
        if self._job is not None:
            rows.job = self._job.describe()
        if not self._ranks:
            return rows
        dead = set(self.dead_ranks(range(self.n)))
        for r, info in sorted(self._ranks.items()):
            rss = None
            if info.local and r not in dead:
                try:
                    rss = info.process.memory_info().rss
                except Exception:  # exited since the liveness check
                    pass
            last = self._last_call.get(r)
            rows.append(
                RankStatus(
                    self._engine_ids[r],
                    r,
                    info.pid,
                    info.host,
                    r not in dead,
                    self.state == ClusterState.RUNNING and r not in dead,
                    rss,
                    None if last is None else last.rank_seconds(r),
                )
            )
        return rows

    @property
    def pids(self) -> set[int]:
        """Local pids of every process this cluster launched (controller, schedulers, engines)."""
        return self._processes.pids


# MixleCluster's own keyword arguments (named in the message for a misspelt one)
_KEYWORDS = tuple(
    name for name in inspect.signature(MixleCluster).parameters if name not in ("n", "ipyparallel_options")
)


@atexit.register
def _end_all_at_exit() -> None:
    """At interpreter exit, end every cluster this process owns through its lifeline: at once,
    without the polite goodbye to the ranks (which waits on a client that ipyparallel's own
    exit handlers may have closed, and could outlast a kernel's shutdown grace)."""
    for cluster in list(_live):
        cluster.end_at_exit()

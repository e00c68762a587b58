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
import os
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import validation
from . import detached as detached_records
from . import engine
from .calls import RankDiedError
from .detached import DetachedRecord, RankRecord
from .engine_processes import EngineProcesses
from .launch import LaunchSpec
from .rank_calls import RankCalls, apply_call
from .state import ClusterState
from .status import ClusterStatus, RankStatus
from .supervision import STOP_GRACE_S, quiet

if TYPE_CHECKING:
    from traitlets.config import Config

#: The most engines (ranks) a :class:`MixleCluster` may have.
MAX_ENGINES: int = 256
#: The ``backend`` values :class:`MixleCluster` takes: "auto" (nccl when every engine has a
#: GPU, else gloo), "gloo" or "nccl".
BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl")
_live: weakref.WeakSet[MixleCluster] = weakref.WeakSet()


def _registry() -> ModuleType:
    # the package holds the current-cluster registry (tests and tools patch it there)
    from .. import cluster

    return cluster


class MixleCluster(RankCalls):
    """``n`` ipyparallel engines forming one torch.distributed group (rank = engine id).

    Its processes end with the process that started it, by any signal (see
    ``mixle_nb.cluster.lifeline``), unless it is ``detached`` (or :meth:`detach` is
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
        Extra controller arguments, e.g. ``["--IPController.engine_ports=10101-10116"]``. A
        setting given here replaces the cluster's own (its heartbeat, CurveZMQ, its address);
        each setting may be given once.
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
        A value out of range, a launcher's option given to another launcher (a Slurm option
        with ``launcher="local"``), or a controller setting given twice.

    See Also
    --------
    mixle_nb.widgets.ClusterPanel : Its status table in a notebook.
    mixle_nb.parallel.TorchRunEncodedData : The EM handle its ranks build.

    Examples
    --------
    Building a cluster checks its arguments and starts nothing:

    >>> from mixle_nb.cluster import MixleCluster
    >>> MixleCluster(4, threads=2)
    <MixleCluster n=4 new backend=auto>
    >>> MixleCluster(8, launcher="slurm", partition="gpu", time="00:30:00", gpus_per_task=1)
    <MixleCluster n=8 new backend=auto>
    >>> MixleCluster(2, partition="gpu")
    Traceback (most recent call last):
    ...
    ValueError: partition= need launcher='slurm' (launcher is 'local')

    Starting engines is skipped here; as a context manager the cluster stops on leaving:

    >>> import torch.distributed as dist
    >>> with MixleCluster(2) as c:  # doctest: +SKIP
    ...     c.run(dist.get_rank)
    [0, 1]
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
        config: Config | None = None,
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
        self._init_supervision()
        self._processes = EngineProcesses(socket.gethostname())
        self.view: Any = None  # ipyparallel.DirectView on every rank, blocking, while it runs
        self._store_dir: str | None = None  # the FileStore rendezvous' private folder
        self._views: dict[tuple[int, ...], Any] = {}
        self._group_generation = 0
        self.group_backend: str | None = None
        _live.add(self)

    @property
    def client(self) -> Any:
        """The ``ipyparallel.Client`` connected to the controller, while the cluster has processes."""
        return self._processes.client

    def __repr__(self) -> str:
        return f"<MixleCluster n={self.n} {self.state} backend={self.group_backend or self.backend}>"

    # ---- lifecycle

    def start(self, progress: Callable[[str], None] | None = None) -> MixleCluster:
        """Launch the controller and engines, then form the group; it becomes the current cluster.

        Parameters
        ----------
        progress : callable, optional
            Called with short messages as it goes ("controller started", "2/4 engines
            registered", a Slurm job's pending reason).

        Returns
        -------
        MixleCluster
            This cluster, running.

        Raises
        ------
        RuntimeError
            It already runs (or is broken: ``restart()`` it); or engines exited during start.
        TimeoutError
            Not every engine registered within ipyparallel's ``engine_timeout``, or a Slurm job
            pended longer than ``pending_timeout``.
        ValueError
            ``backend="nccl"`` and an engine has no GPU of its own.

        Whatever it raises, nothing it started is left running.
        """
        if self.state.has_processes:
            raise RuntimeError(f"cluster is already {self.state}; call stop() or restart()")
        report = progress or (lambda message: None)
        self.state, self.broken_reason = ClusterState.STARTING, ""
        try:
            self._processes.launch(self.launch_spec, self.n, self.threads, report)
            self._engine_ids = list(range(self.n))
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
        """Let the cluster outlive this process.

        It runs on, with everything on its ranks, until :meth:`stop`, here or in a process that
        attached to it (:meth:`attach`); its record is written beside its connection files.

        Raises
        ------
        RuntimeError
            The cluster is not running.
        """
        if self.state != ClusterState.RUNNING:
            raise RuntimeError(f"only a running cluster can be detached; this one is {self.state}")
        self._processes.release()
        self._record = self.detached_record().write()
        self.detached = True

    def detached_record(self) -> DetachedRecord:
        """What a new process needs to attach to this running cluster (:meth:`attach`).

        Returns
        -------
        DetachedRecord
            The record of its settings, controller, ranks and group, stamped with this process and
            the time.
        """
        ipp = self._processes.ipp
        return DetachedRecord(
            cluster_id=ipp.cluster_id,
            profile_dir=ipp.profile_dir,
            n=self.n,
            backend=self.backend,
            timeout=self.timeout,
            threads=self.threads,
            launcher=self.launcher,
            group_backend=self.group_backend,
            store_dir=self._store_dir,
            group_generation=self._group_generation,
            controller_pid=ipp.controller.pid,
            host=self._processes.here,
            ranks=tuple(RankRecord(r.pid, r.host, r.gpus) for _, r in sorted(self._processes.ranks.items())),
            detached_at=time.time(),
            detached_by=os.getpid(),
        )

    @classmethod
    def attach(cls, cluster_id: str | None = None, *, profile_dir: str | None = None) -> MixleCluster:
        """Attach to a detached cluster; it becomes the current cluster and stays detached.

        Parameters
        ----------
        cluster_id : str, optional
            Which detached cluster (see :meth:`list_detached`); the only one if not given.
        profile_dir : str, optional
            The ipyparallel profile it was started in (the default profile if not given).

        Returns
        -------
        MixleCluster
            Running, with its group and everything on its ranks as it was.

        Raises
        ------
        LookupError
            No detached cluster has ``cluster_id``; or, without one, none or several run.
        RuntimeError
            Its engines are not the ones detached (the cluster was changed since).
        """
        record = detached_records.choose(detached_records.detached_clusters(profile_dir), cluster_id)
        cluster = cls(
            record.n,
            backend=record.backend,
            timeout=record.timeout,
            launcher=record.launcher,
            threads=record.threads,
            detached=True,
        )
        cluster._processes.reconnect(record)
        cluster._store_dir, cluster.group_backend = record.store_dir, record.group_backend
        cluster._group_generation = record.group_generation
        cluster._record = record.path
        cluster.view = cluster.client[:]
        cluster.view.block = True
        cluster.state = ClusterState.RUNNING
        _registry().set_current(cluster)
        return cluster

    @staticmethod
    def list_detached(profile_dir: str | None = None) -> list[dict[str, Any]]:
        """This user's detached clusters that still run, oldest first.

        Parameters
        ----------
        profile_dir : str, optional
            The ipyparallel profile (the default profile if not given).

        Returns
        -------
        list of dict
            Each a :class:`~mixle_nb.cluster.detached.DetachedRecord` as a dict: ``cluster_id``,
            ``n``, ``launcher``, ``detached_at`` (epoch seconds), ``detached_by`` (pid) and more.
        """
        return [record.as_dict() for record in detached_records.detached_clusters(profile_dir)]

    def end_at_exit(self) -> None:
        """End the cluster at once through its lifeline, as this process's death would.

        For exit handlers: no goodbye to the ranks that could outlast a kernel's shutdown
        grace. A detached cluster is left running.
        """
        if self._processes.cut():
            self.state = ClusterState.STOPPED

    def stop(self) -> None:
        """Destroy the group, stop the engines and the controller (and cancel a Slurm job), and
        wait until their processes exit. Stopping a cluster that is not running does nothing;
        stopping a detached one ends it for good."""
        if self.state in (ClusterState.NEW, ClusterState.STOPPED):
            return
        self._teardown()
        self.state = ClusterState.STOPPED

    def restart(self, progress: Callable[[str], None] | None = None) -> MixleCluster:
        """Stop every process and start a fresh cluster with the same settings.

        Names defined on the ranks are gone; rebuild handles and push values again.

        Parameters
        ----------
        progress : callable, optional
            As for :meth:`start`.

        Returns
        -------
        MixleCluster
            This cluster, running.

        Raises
        ------
        RuntimeError, TimeoutError, ValueError
            As :meth:`start`.
        """
        self.stop()
        return self.start(progress)

    def drop_ranks(self, dead: Sequence[int]) -> None:
        """Go on without the ranks ``dead`` (elastic recovery, ``mixle_nb.cluster.elastic``).

        The survivors, renumbered 0..n-1 in their old order, form a new group of their own.
        Every survivor must be idle.

        Parameters
        ----------
        dead : sequence of int
            The ranks to leave out, in the current numbering.

        Raises
        ------
        RankDiedError
            No rank is left, or a survivor died meanwhile (named in the new numbering).
        """
        survivors = [r for r in range(self.n) if r not in set(dead)]
        if not survivors:
            raise RankDiedError(sorted(dead), "; no rank is left to go on")
        self._engine_ids = [self._engine_ids[r] for r in survivors]
        self._processes.keep_ranks(survivors)
        self.n, self._views, self._last_call = len(survivors), {}, {}
        self.view = self.client[list(self._engine_ids)]
        self.view.block = True
        self.state, self.broken_reason = ClusterState.RUNNING, ""
        self._form_group()

    def __enter__(self) -> MixleCluster:
        return self.start() if self.state in (ClusterState.NEW, ClusterState.STOPPED) else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            if not self.detached:
                self.stop()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    # ---- the process group

    def _form_group(self, report: Callable[[str], None] = quiet) -> None:
        """Form the group on every engine (again: each leaves the one it was in)."""
        backend = self.group_backend or self._processes.backend_for(self.backend)
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
                    [r], apply_call(engine.form_group, rank=r, device=devices.get(r), **setup), check=False
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
        if self._processes.on_one_host():
            if self._store_dir is None:
                self._store_dir = tempfile.mkdtemp(prefix="mixle-rendezvous-")  # mode 0700
                self._processes.remove_at_death(self._store_dir)
            return {"store_path": os.path.join(self._store_dir, f"store-{self._group_generation}")}
        # engine 0 listens on its address toward the controller, which every host reaches
        return {"master": self._view_on([0]).apply_sync(engine.rendezvous_address)[0]}

    def _local_devices(self) -> dict[int, int]:
        """One GPU per local rank (under Slurm, each task chooses from its own SLURM_LOCALID
        and CUDA_VISIBLE_DEVICES)."""
        if self.launch_spec.slurm is None:
            return self._processes.devices_by_host()
        from ..parallel.slurm_env import task_device

        return dict(enumerate(self._view_on(list(range(self.n))).apply_sync(task_device)))

    # ---- stopping

    def _teardown(self) -> None:
        registry = _registry()
        if registry.current() is self:
            registry.set_current(None)
        running = self.state == ClusterState.RUNNING and self.view is not None
        try:
            self._processes.stop(self._leave_group if running else None)
        finally:
            if self._store_dir:
                shutil.rmtree(self._store_dir, ignore_errors=True)
            if self._record is not None and os.path.exists(self._record):
                os.remove(self._record)
            self._record = None
            self.view = self._store_dir = None
            self._views, self._last_call = {}, {}
            self.group_backend = None
            self.n = self._started_n

    def _leave_group(self) -> None:
        """Every rank leaves the group (the polite goodbye before its engine stops)."""
        self.view.apply_async(engine.leave_group).get(min(self.timeout, STOP_GRACE_S))

    # ---- status

    def status(self) -> ClusterStatus:
        """The status table: one row per rank.

        Returns
        -------
        ClusterStatus
            A list of :class:`RankStatus` (pid, host, liveness, group membership, memory, the
            last call's time on that rank), with a line about the Slurm job if there is one,
            and one counting the stray messages the client dropped (``dropped``, by stream and
            reason) if there were any; empty before :meth:`start`.
        """
        rows = ClusterStatus()
        if self._processes.job is not None:
            rows.job = self._processes.job.describe()
        if self._processes.guard is not None:
            rows.dropped = self._processes.guard.counts()
        if not self._processes.ranks:
            return rows
        dead = set(self.dead_ranks(range(self.n)))
        for r, info in sorted(self._processes.ranks.items()):
            last = self._last_call.get(r)
            rows.append(
                RankStatus(
                    self._engine_ids[r],
                    r,
                    info.pid,
                    info.host,
                    r not in dead,
                    self.state == ClusterState.RUNNING and r not in dead,
                    None if r in dead else info.rss_bytes(),
                    None if last is None else last.rank_seconds(r),
                )
            )
        return rows

    @property
    def pids(self) -> set[int]:
        """Local pids of every process this cluster launched (controller, schedulers, engines)."""
        return self._processes.owned.pids


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

"""MixleCluster: ipyparallel engines that form one torch.distributed group, and never hang.

A plain Python API (no IPython, no widgets). Lifecycle, as in ``ipyparallel.Cluster``:
``start()`` -> running -> ``stop()``; ``restart()`` replaces every process; a dead rank or a
half-finished interrupt marks the cluster *broken* until ``restart()``.

Rank r is engine r. On one host the rendezvous is a ``FileStore`` in a private temporary
directory and gloo is pinned to the loopback interface, so the group opens no socket to the
network. Engines on other hosts rendezvous through a ``TCPStore`` at engine 0's address.

The client never blocks on a collective: it waits on results in short slices and checks rank
liveness between them, so a rank killed mid-call surfaces as :class:`RankDiedError`.
"""
from __future__ import annotations

import asyncio
import atexit
import html
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from numbers import Integral, Real
from typing import Any, Callable, Sequence

import psutil

MAX_ENGINES = 256
BACKENDS = ("auto", "gloo", "nccl")
_POLL_S = 0.05  # client wait slice: bounds how late a dead rank is noticed
_HEARTBEAT_MS = 500  # ipyparallel's default 3000 ms makes every engine registration wait ~3-6 s
_STOP_GRACE_S = 5.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_current: MixleCluster | None = None
_live: weakref.WeakSet = weakref.WeakSet()


def current() -> MixleCluster | None:
    """The most recently started cluster that is still running, or None."""
    return _current


def set_current(cluster: MixleCluster | None) -> None:
    """Make ``cluster`` the one that :func:`current` returns (None clears it)."""
    global _current
    _current = cluster


class RankError(RuntimeError):
    """An exception raised on a rank, with its remote traceback.

    ``errors`` lists ``(rank, ename, evalue)`` for every rank that failed in the same call.
    """

    def __init__(self, rank: int, ename: str, evalue: str, traceback_text: str,
                 errors: Sequence[tuple[int, str, str]] = ()):
        self.rank, self.ename, self.evalue = rank, ename, evalue
        self.traceback_text = traceback_text
        self.errors = list(errors) or [(rank, ename, evalue)]
        others = sorted({r for r, _, _ in self.errors} - {rank})
        also = f" (ranks {others} failed too)" if others else ""
        super().__init__(f"rank {rank} raised {ename}: {evalue}{also}\n"
                         f"--- remote traceback (rank {rank}) ---\n{traceback_text}")


class RankDiedError(RuntimeError):
    """One or more ranks' engines died; the group is broken until ``restart()``."""

    def __init__(self, ranks: Sequence[int], detail: str = ""):
        self.ranks = sorted(ranks)
        which = ", ".join(str(r) for r in self.ranks)
        super().__init__(f"rank{'s' if len(self.ranks) > 1 else ''} {which} died{detail}; the "
                         "torch.distributed group is broken: call cluster.restart()")


# ---------------------------------------------------------------- engine side


def _engine_describe() -> dict:
    """Identity of this engine; importing torch here overlaps it with other engines' startup."""
    import torch

    return {"pid": os.getpid(), "host": socket.gethostname(),
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def _loopback_interface() -> str:
    """Name of the interface that carries 127.0.0.1 (``lo`` on Linux)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addrs):
            return name
    raise RuntimeError("no network interface has 127.0.0.1; cannot pin gloo to loopback")


def _engine_rendezvous_address(peer_host: str) -> tuple[str, int]:
    """(address this host uses to reach ``peer_host``, a free TCP port on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect((peer_host, 9))  # UDP connect sends nothing; it only picks the route
        address = udp.getsockname()[0]
    with socket.socket() as probe:
        probe.bind((address, 0))
        return address, probe.getsockname()[1]


def _engine_setup(rank: int, world: int, backend: str, timeout_s: float, threads: int,
                  store_path: str | None = None, master: tuple[str, int] | None = None,
                  device: int | None = None) -> dict:
    """Join the cluster's process group: a FileStore on one host, else a TCPStore at ``master``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    timeout = timedelta(seconds=timeout_s)
    if store_path is not None:
        # torch reads GLOO_SOCKET_IFNAME when it creates the gloo device, i.e. just below
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()
        store = dist.FileStore(store_path, world)
    else:
        host, port = master
        store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
    if device is not None:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": backend}


def _engine_teardown() -> None:
    """Leave the process group, if this engine is in one."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- status


@dataclass(frozen=True)
class RankStatus:
    """One rank as :meth:`MixleCluster.status` sees it (``rss_bytes`` is None for remote hosts)."""

    engine_id: int
    rank: int
    pid: int
    host: str
    alive: bool
    in_group: bool
    rss_bytes: int | None
    last_call_s: float | None


class ClusterStatus(list):
    """A list of :class:`RankStatus` rows that renders as a table."""

    _COLUMNS = ("engine_id", "rank", "pid", "host", "alive", "in_group", "rss_MiB", "last_call_s")

    def _cells(self, row: RankStatus) -> list[str]:
        rss = "-" if row.rss_bytes is None else f"{row.rss_bytes / 2**20:.0f}"
        last = "-" if row.last_call_s is None else f"{row.last_call_s:.3f}"
        return [str(row.engine_id), str(row.rank), str(row.pid), row.host, str(row.alive),
                str(row.in_group), rss, last]

    def __str__(self) -> str:
        rows = [list(self._COLUMNS)] + [self._cells(r) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._COLUMNS))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self._COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(r))
                       + "</tr>" for r in self)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------- calls


class RankCall:
    """A call running on some ranks: awaitable, pollable, interruptible.

    ``data`` maps rank -> the latest dict that rank published with
    ``ipyparallel.datapub.publish_data`` while the call runs.
    """

    def __init__(self, cluster: MixleCluster, ranks: list[int], async_result):
        self.cluster, self.ranks, self._ar = cluster, ranks, async_result
        self._cancelled = False

    def done(self) -> bool:
        """True once every rank has answered."""
        return self._ar.ready()

    def ranks_done(self) -> list[int]:
        """Ranks that have answered (successfully or not)."""
        return [r for r, t in zip(self.ranks, self._ar["completed"]) if t is not None]

    @property
    def data(self) -> dict[int, dict]:
        return {r: d for r, d in zip(self.ranks, self._ar["data"]) if d}

    @property
    def stdout(self) -> dict[int, str]:
        """rank -> everything the rank has printed in this call so far."""
        return dict(zip(self.ranks, self._ar["stdout"]))

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Interrupt the ranks still running this call (SIGINT, i.e. KeyboardInterrupt there)."""
        self._cancelled = True
        pending = sorted(set(self.ranks) - set(self.ranks_done()))
        self.cluster._interrupt(pending)

    def result(self, timeout: float | None = None) -> list:
        """Per-rank results in rank order; raises RankError, RankDiedError or TimeoutError.

        A KeyboardInterrupt while waiting interrupts the ranks, then re-raises; if they do not
        all stop within the grace period the cluster is marked as needing ``restart()``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._ar.wait(_POLL_S):
                self.cluster._raise_if_dead(self.ranks)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"ranks {self.pending()} still running after {timeout} s")
        except KeyboardInterrupt:
            self.cluster._after_client_interrupt(self)
            raise
        return self._collect()

    def pending(self) -> list[int]:
        return sorted(set(self.ranks) - set(self.ranks_done()))

    def __await__(self):
        return self._wait_async().__await__()

    async def _wait_async(self) -> list:
        while not self._ar.ready():
            self.cluster._raise_if_dead(self.ranks)
            await asyncio.sleep(_POLL_S)
        return self._collect()

    def _collect(self) -> list:
        from ipyparallel.error import RemoteError

        results = self._ar.get(0, return_exceptions=True)
        results = results if isinstance(results, list) else [results]
        self.cluster._remember_call(self)
        failed = [(r, e) for r, e in zip(self.ranks, results) if isinstance(e, RemoteError)]
        if not failed:
            return results
        dead = [r for r, e in failed if e.ename == "EngineError"]
        if dead:
            self.cluster._mark_broken(dead)
            raise RankDiedError(dead)
        rank, first = failed[0]
        raise RankError(rank, first.ename, first.evalue, _plain_traceback(first.traceback),
                        [(r, e.ename, e.evalue) for r, e in failed])


def _plain_traceback(traceback) -> str:
    """The engine's traceback (a string or a list of lines) without terminal colour codes."""
    text = traceback if isinstance(traceback, str) else "\n".join(traceback or ())
    return _ANSI.sub("", text)


# ---------------------------------------------------------------- the cluster


@dataclass
class _Rank:
    pid: int
    host: str
    gpus: int
    process: psutil.Process | None = None  # set for engines on this host


def _validate(n, backend, timeout, threads) -> None:
    if isinstance(n, bool) or not isinstance(n, Integral):
        raise TypeError(f"n must be an integer number of engines, got {n!r}")
    if not 1 <= n <= MAX_ENGINES:
        raise ValueError(f"n must be between 1 and {MAX_ENGINES} engines, got {n}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if isinstance(timeout, bool) or not isinstance(timeout, Real) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(threads, bool) or not isinstance(threads, Integral) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")


class MixleCluster:
    """``n`` ipyparallel engines forming one torch.distributed group (rank = engine id).

    ``launcher`` names an ipyparallel engine launcher ("local", "mpi", "ssh", "slurm", ...);
    ``ipyparallel_options`` go to ``ipyparallel.Cluster``. ``%px`` is not activated here:
    the magics call ``cluster.view.activate()``.

    Example::

        with MixleCluster(2) as c:
            c.run(lambda: torch.distributed.get_rank())   # [0, 1]
    """

    def __init__(self, n: int, *, backend: str = "auto", timeout: float = 60.0,
                 launcher: str = "local", threads: int = 1, **ipyparallel_options):
        _validate(n, backend, timeout, threads)
        if backend == "nccl" and launcher == "local":
            import torch  # only this check needs torch in the client

            if not torch.cuda.is_available():
                raise ValueError("backend='nccl' needs GPUs, and this host has none; "
                                 "use backend='gloo' or 'auto'")
        self.n, self.backend, self.timeout, self.threads = n, backend, float(timeout), threads
        self.launcher = launcher
        self._options = ipyparallel_options
        self.state = "new"  # new | starting | running | broken | stopped
        self.broken_reason = ""
        self.client = self.view = None
        self._ipp = self._store_dir = None
        self._ranks: dict[int, _Rank] = {}
        # psutil handles, not bare pids: signalling one checks its pid was not recycled
        self._procs: dict[int, psutil.Process] = {}
        self._views: dict[tuple[int, ...], Any] = {}
        self._last_call: dict[int, RankCall] = {}
        self._here = socket.gethostname()
        self.group_backend: str | None = None
        _live.add(self)

    def __repr__(self) -> str:
        return f"<MixleCluster n={self.n} {self.state} backend={self.group_backend or self.backend}>"

    # ---- lifecycle

    def start(self, progress: Callable[[str], None] | None = None) -> MixleCluster:
        """Launch controller and engines, then form the group; ``progress`` gets short messages."""
        if self.state in ("running", "broken"):
            raise RuntimeError(f"cluster is already {self.state}; call stop() or restart()")
        report = progress or (lambda message: None)
        self.state, self.broken_reason = "starting", ""
        try:
            self._launch(report)
            self._form_group(report)
        except BaseException:
            self._teardown()
            self.state = "stopped"
            raise
        self.state = "running"
        set_current(self)
        return self

    def stop(self) -> None:
        """Destroy the group, stop engines and controller, and wait until their processes exit."""
        if self.state in ("new", "stopped"):
            return
        self._teardown()
        self.state = "stopped"

    def restart(self, progress: Callable[[str], None] | None = None) -> MixleCluster:
        """Stop every process and start a fresh cluster with the same settings."""
        self.stop()
        return self.start(progress)

    def __enter__(self) -> MixleCluster:
        return self.start() if self.state in ("new", "stopped") else self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    def _launch(self, report) -> None:
        import ipyparallel as ipp

        options = dict(self._options)
        # ours first: later command-line flags win, so the caller can still override them
        controller_args = [f"--HeartMonitor.period={_HEARTBEAT_MS}"]
        controller_args += list(options.pop("controller_args", []))
        options.setdefault("log_level", logging.WARNING)
        self._ipp = ipp.Cluster(engines=self.launcher, controller_args=controller_args, **options)
        self._ipp.start_controller_sync()
        self._own(self._ipp.controller.pid)
        report("controller started")
        thread_env = {k: str(self.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        self._ipp.start_engines_sync(self.n, environment=thread_env)
        self._record_launcher_pids()
        self.client = self._ipp.connect_client_sync()
        self._await_engines(report)

    def _await_engines(self, report) -> None:
        """Wait for all engines, asking each to describe itself as soon as it registers."""
        deadline = time.monotonic() + self._ipp.engine_timeout
        asked: dict[int, Any] = {}
        while len(asked) < self.n:
            for eid in sorted(set(self.client.ids) - set(asked)):
                asked[eid] = self.client[eid].apply_async(_engine_describe)
                report(f"{len(asked)}/{self.n} engines registered")
            self._raise_if_engines_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(asked)} of {self.n} engines registered within "
                                   f"{self._ipp.engine_timeout} s; see the engine logs in "
                                   f"{self._ipp.profile_dir}/log")
            time.sleep(_POLL_S)
        if sorted(asked) != list(range(self.n)):
            raise RuntimeError(f"engine ids {sorted(asked)} are not 0..{self.n - 1}; "
                               "the controller must be fresh (do not reuse its profile's engines)")
        for eid, ar in asked.items():
            info = ar.get(self._ipp.engine_timeout)
            self._ranks[eid] = rank = _Rank(info["pid"], info["host"], info["gpus"])
            if rank.host == self._here:  # a pid from another host means nothing here
                self._own(rank.pid)
                rank.process = self._procs.get(rank.pid)
        self._record_child_pids()

    def _raise_if_engines_exited(self) -> None:
        stopped = getattr(self._ipp.engine_set, "stop_data", None) or {}
        if stopped.get("engines"):
            output = self._ipp.engine_set.get_output()
            raise RuntimeError(f"engines exited during start: {stopped['engines']}\n{output}")

    def _form_group(self, report) -> None:
        backend = self._choose_backend()
        world = self.n
        setup = {"world": world, "backend": backend, "timeout_s": self.timeout,
                 "threads": self.threads}
        if self._single_host():
            self._store_dir = tempfile.mkdtemp(prefix="mixle-rendezvous-")  # mode 0700
            setup["store_path"] = os.path.join(self._store_dir, "store")
        else:
            peer = socket.gethostbyname(socket.gethostname())
            setup["master"] = self._view_on([0]).apply_sync(_engine_rendezvous_address, peer)[0]
        devices = self._local_devices() if backend == "nccl" else {}
        calls = [RankCall(self, [r], self._view_on([r]).apply_async(
            _engine_setup, rank=r, device=devices.get(r), **setup)) for r in range(world)]
        for call in calls:
            call.result(timeout=self.timeout + 30)  # + time for engines to finish importing torch
        self.group_backend = backend
        self.view = self.client[:]
        self.view.block = True
        report(f"torch.distributed group formed ({backend}, world {world})")

    def _choose_backend(self) -> str:
        no_gpu = [r for r, info in self._ranks.items() if info.gpus == 0]
        if self.backend == "nccl" and no_gpu:
            raise ValueError(f"backend='nccl' needs a GPU on every engine; ranks {no_gpu} have "
                             "none: use backend='gloo' or 'auto'")
        if self.backend == "auto":
            return "gloo" if no_gpu else "nccl"
        return self.backend

    def _local_devices(self) -> dict[int, int]:
        """One GPU per local rank: the i-th rank on a host gets that host's device i."""
        devices, seen = {}, {}
        for r in sorted(self._ranks):
            info = self._ranks[r]
            devices[r] = local = seen.get(info.host, 0)
            seen[info.host] = local + 1
            if local >= info.gpus:
                raise ValueError(f"host {info.host} runs {local + 1}+ ranks but has {info.gpus} "
                                 "GPUs; nccl needs one GPU per rank: start fewer engines there")
        return devices

    def _single_host(self) -> bool:
        return all(info.host == self._here for info in self._ranks.values())

    def _record_launcher_pids(self) -> None:
        for launcher in getattr(self._ipp.engine_set, "launchers", {}).values():
            self._own(launcher.pid)

    def _record_child_pids(self) -> None:
        """Remember schedulers and nannies too, so stop() can wait for every one of them."""
        for proc in list(self._procs.values()):
            try:
                for child in proc.children(recursive=True):
                    self._procs.setdefault(child.pid, child)
            except psutil.Error:
                pass

    def _own(self, pid: int) -> None:
        if pid not in self._procs:
            try:
                self._procs[pid] = psutil.Process(pid)
            except psutil.Error:  # already gone: nothing to clean up
                pass

    def _teardown(self) -> None:
        if _current is self:
            set_current(None)
        try:
            if self._ipp is not None:
                self._stop_ipyparallel()
        finally:
            self._reap()  # whatever went wrong above, no process of ours outlives stop()
            if self._store_dir:
                shutil.rmtree(self._store_dir, ignore_errors=True)
            self.client = self.view = self._ipp = self._store_dir = None
            self._ranks, self._views, self._procs, self._last_call = {}, {}, {}, {}

    def _stop_ipyparallel(self) -> None:
        self._record_child_pids()
        if self.state == "running" and self.view is not None:
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
            self.view.apply_async(_engine_teardown).get(min(self.timeout, 10.0))
        except Exception:  # a failed goodbye must not keep processes alive
            self._kill_engines()

    def _kill_engines(self) -> None:
        """SIGKILL every engine: a rank blocked in a collective ignores SIGTERM until it times out."""
        for engine_set in self._ipp.engines.values():
            for launcher in list(getattr(engine_set, "launchers", {}).values()) or [engine_set]:
                try:
                    launcher.signal(signal.SIGKILL)
                except Exception:  # already gone
                    pass

    def _reap(self) -> None:
        """End every recorded local process still alive: SIGTERM, then SIGKILL after a grace.

        ipyparallel has stopped engines and controller by now; what remains are engine nannies,
        which otherwise poll for their engine's exit for seconds, or leftovers of a failed start.
        """
        procs = list(self._procs.values())
        for signal_name in ("terminate", "kill"):
            for proc in procs:
                try:
                    getattr(proc, signal_name)()
                except psutil.Error:
                    pass
            _, procs = psutil.wait_procs(procs, timeout=_STOP_GRACE_S)
            if not procs:
                return

    # ---- liveness

    def _dead_ranks(self, ranks) -> list[int]:
        registered = set(self.client.ids)
        return [r for r in ranks if r not in registered or not self._process_alive(self._ranks[r])]

    @staticmethod
    def _process_alive(info: _Rank) -> bool:
        if info.process is None:  # another host: the controller's view (nanny, heartbeat) decides
            return True
        try:
            # is_running() rejects a recycled pid; a killed child lingers as a zombie until reaped
            with info.process.oneshot():  # one read of /proc/<pid>/stat for both checks
                return info.process.status() != psutil.STATUS_ZOMBIE and info.process.is_running()
        except psutil.Error:
            return False

    def _raise_if_dead(self, ranks) -> None:
        dead = self._dead_ranks(ranks)
        if dead:
            self._mark_broken(dead)
            raise RankDiedError(dead)

    def _mark_broken(self, dead: Sequence[int] = (), reason: str = "") -> None:
        self.state = "broken"
        self.broken_reason = reason or f"ranks {sorted(dead)} died"

    def _require_usable(self, ranks) -> None:
        if self.state == "broken":
            dead = self._dead_ranks(range(self.n))
            if dead:
                raise RankDiedError(dead)
            raise RuntimeError(f"cluster needs restart(): {self.broken_reason}")
        if self.state != "running":
            raise RuntimeError(f"cluster is {self.state}; call start() first")
        self._raise_if_dead(ranks)

    # ---- interrupts

    def _interrupt(self, ranks: Sequence[int]) -> None:
        """Send SIGINT to ``ranks``: by pid on this host, through the engines' nannies elsewhere."""
        remote = []
        for r in ranks:
            info = self._ranks[r]
            if info.process is not None:
                try:
                    info.process.send_signal(signal.SIGINT)  # checks the pid was not recycled
                except psutil.Error:
                    pass
            else:
                remote.append(r)
        if remote:
            self.client.send_signal("SIGINT", targets=remote, block=False)

    def _after_client_interrupt(self, call: RankCall) -> None:
        """Interrupt the call's ranks; if they do not all answer promptly, mark the cluster broken."""
        self._interrupt(call.pending())
        grace = min(self.timeout, 10.0)
        if not call._ar.wait(grace):
            self._mark_broken(reason=f"ranks {call.pending()} did not stop within {grace} s "
                                     "of KeyboardInterrupt")
            return
        from ipyparallel.error import RemoteError

        results = call._ar.get(0, return_exceptions=True)
        results = results if isinstance(results, list) else [results]
        # a rank that failed with anything but KeyboardInterrupt may have left a collective
        # half-done on its peers; the group cannot be trusted afterwards
        if any(isinstance(e, RemoteError) and e.ename != "KeyboardInterrupt" for e in results):
            self._mark_broken(reason="a rank failed while being interrupted")

    # ---- working with ranks

    def _targets(self, targets) -> list[int]:
        if targets is None:
            return list(range(self.n))
        ranks = [targets] if isinstance(targets, Integral) else list(targets)
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, Integral)
               or not 0 <= r < self.n]
        if bad or not ranks:
            raise ValueError(f"targets must be ranks in 0..{self.n - 1}, got {targets!r}")
        return ranks

    def _view_on(self, ranks: list[int]):
        key = tuple(ranks)
        if key not in self._views:
            self._views[key] = self.client[list(ranks)]
        return self._views[key]

    def run_async(self, fn: Callable, *args, targets=None, **kwargs) -> RankCall:
        """Start ``fn(*args, **kwargs)`` on every rank (or on ``targets``); returns a RankCall."""
        ranks = self._targets(targets)
        self._require_usable(ranks)
        return RankCall(self, ranks, self._view_on(ranks).apply_async(fn, *args, **kwargs))

    def execute_async(self, code: str, targets=None) -> RankCall:
        """Start running ``code`` in every rank's namespace (or ``targets``'); its output is in
        ``RankCall.stdout`` while it runs."""
        ranks = self._targets(targets)
        self._require_usable(ranks)
        return RankCall(self, ranks, self._view_on(ranks).execute(code, silent=False, block=False))

    def run(self, fn: Callable, *args, targets=None, **kwargs) -> list:
        """``fn(*args, **kwargs)`` on every rank (or on ``targets``); per-rank results."""
        return self.run_async(fn, *args, targets=targets, **kwargs).result()

    def push(self, targets=None, **values) -> None:
        """Bind ``values`` as globals on every rank (or on ``targets``)."""
        ranks = self._targets(targets)
        self._require_usable(ranks)
        RankCall(self, ranks, self._view_on(ranks).push(values, block=False)).result()

    def pull(self, name: str, rank: int | str = 0):
        """The global ``name`` from ``rank``, or a per-rank list for ``rank="all"``."""
        ranks = list(range(self.n)) if rank == "all" else self._targets(rank)
        self._require_usable(ranks)
        values = RankCall(self, ranks, self._view_on(ranks).pull(name, block=False)).result()
        return values if rank == "all" else values[0]

    def scatter(self, name: str, sequence: Sequence) -> None:
        """Bind ``name`` on rank r to ``sequence[r::n]``."""
        ranks = list(range(self.n))
        self._require_usable(ranks)
        calls = [RankCall(self, [r], self._view_on([r]).push({name: sequence[r::self.n]},
                                                               block=False)) for r in ranks]
        for call in calls:
            call.result()

    def _remember_call(self, call: RankCall) -> None:
        # durations come from engine timestamps, parsed only when status() asks for them
        for r in call.ranks:
            self._last_call[r] = call

    def _last_call_s(self, rank: int) -> float | None:
        call = self._last_call.get(rank)
        if call is None:
            return None
        i = call.ranks.index(rank)
        t0, t1 = call._ar["started"][i], call._ar["completed"][i]
        return None if t0 is None or t1 is None else (t1 - t0).total_seconds()

    # ---- status

    def status(self) -> ClusterStatus:
        """One row per rank: pid, host, liveness, group membership, memory, last call time."""
        rows = ClusterStatus()
        if not self._ranks:
            return rows
        dead = set(self._dead_ranks(range(self.n)))
        for r, info in sorted(self._ranks.items()):
            rss = None
            if info.process is not None and r not in dead:
                try:
                    rss = info.process.memory_info().rss
                except psutil.Error:
                    pass
            rows.append(RankStatus(r, r, info.pid, info.host, r not in dead,
                                   self.state == "running" and r not in dead, rss,
                                   self._last_call_s(r)))
        return rows

    @property
    def pids(self) -> set[int]:
        """Local pids of every process this cluster launched (controller, schedulers, engines)."""
        return set(self._procs)


@atexit.register
def _stop_all_at_exit() -> None:
    for cluster in list(_live):
        try:
            cluster.stop()
        except Exception:
            pass

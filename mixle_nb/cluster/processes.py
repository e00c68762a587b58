"""Process ownership: every local process a cluster launched, its ranks' liveness, signals, reaping.

Processes are held as ``psutil.Process`` handles, not bare pids: signalling one checks that its
pid was not recycled by an unrelated process.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from .lifeline import Lifeline

STOP_GRACE_S = 5.0  # SIGTERM -> SIGKILL


@dataclass
class RankProcess:
    """The engine behind one rank; ``process`` is set only for engines on this host."""

    pid: int
    host: str
    gpus: int
    process: psutil.Process | None = None

    @property
    def local(self) -> bool:
        return self.process is not None

    def alive(self) -> bool:
        """False once the engine exited; an engine on another host counts as alive (the
        controller's heartbeat decides there)."""
        if self.process is None:
            return True
        try:
            # is_running() rejects a recycled pid; a killed child lingers as a zombie until reaped
            with self.process.oneshot():  # one read of /proc/<pid>/stat for both checks
                return self.process.status() != psutil.STATUS_ZOMBIE and self.process.is_running()
        except psutil.Error:
            return False

    def rss_bytes(self) -> int | None:
        """The engine's resident memory; None for an engine on another host or one that exited."""
        if self.process is None:
            return None
        try:
            return int(self.process.memory_info().rss)
        except psutil.Error:
            return None

    def interrupt(self) -> None:
        """SIGINT (KeyboardInterrupt in the engine's running task); local engines only."""
        if self.process is None:
            return
        try:
            self.process.send_signal(signal.SIGINT)
        except psutil.Error:  # already gone
            pass


class OwnedProcesses:
    """The local processes one cluster started (controller, schedulers, engines, nannies)."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self.lifeline: Lifeline | None = None  # a Lifeline told of every process owned, while the cluster has one

    @property
    def pids(self) -> set[int]:
        return set(self._procs)

    def get(self, pid: int) -> psutil.Process | None:
        return self._procs.get(pid)

    def own(self, pid: int) -> None:
        if pid not in self._procs:
            try:
                self._add(psutil.Process(pid))
            except psutil.Error:  # already gone: nothing to clean up
                pass

    def _add(self, proc: psutil.Process) -> None:
        self._procs[proc.pid] = proc
        if self.lifeline is not None:
            self.lifeline.watch(proc.pid, proc.create_time())

    def own_children(self) -> None:
        """Own the owned processes' descendants too (schedulers, nannies)."""
        for proc in list(self._procs.values()):
            try:
                for child in proc.children(recursive=True):
                    if child.pid not in self._procs:
                        self._add(child)
            except psutil.Error:
                pass

    def reap(self) -> None:
        """End every owned process still alive: SIGTERM, then SIGKILL after a grace; forget them.

        Called after ipyparallel stopped what it knows of; what remains are engine nannies,
        which otherwise poll for their engine's exit for seconds, or leftovers of a failed start.
        """
        procs = list(self._procs.values())
        for signal_name in ("terminate", "kill"):
            for proc in procs:
                try:
                    getattr(proc, signal_name)()
                except psutil.Error:
                    pass
            _, procs = psutil.wait_procs(procs, timeout=STOP_GRACE_S)
            if not procs:
                break
        self._procs = {}

"""The lifeline: a cluster's local processes and files end when the process that started it dies.

:class:`Lifeline` starts one small watcher process per cluster, in a session of its own (so a
kill of the kernel's process group, which is how ``jupyter_client`` restarts a kernel, spares
it). The owner keeps the write end of the watcher's stdin open and tells it, one JSON line at a
time, which processes and files are the cluster's. When the owner dies, by any signal, the
kernel closes that pipe: the watcher reads end-of-file at once, sends SIGTERM to every process
it was told about and their descendants, SIGKILL :data:`TERM_GRACE_S` later to what is left,
and removes the files. A watcher whose parent changed (the owner died while a forked child
still holds the pipe) does the same, within :data:`POLL_S`.

``close()`` (a normal ``stop()``: the owner ended everything itself) and ``release()`` (a
detached cluster, which must outlive its owner) end the watcher without touching anything.

Engines on other hosts are not reachable from here; they watch their controller instead
(:mod:`mixle_nb.cluster.controller_watch`), which this watcher ends.
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psutil

TERM_GRACE_S = 1.0  # SIGTERM -> SIGKILL: the controller removes its connection files on SIGTERM
POLL_S = 0.5  # how often the watcher also checks that its parent is still the owner


class Lifeline:
    """The owner's end of one cluster's watcher process."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, **message: Any) -> None:
        if self._proc.poll() is None and self._proc.stdin is not None:
            try:
                self._proc.stdin.write((json.dumps(message) + "\n").encode())
                self._proc.stdin.flush()
            except BrokenPipeError:  # the watcher was killed: nothing is watched any more
                pass

    def watch(self, pid: int, create_time: float) -> None:
        """End process ``pid`` (and its descendants) if the owner dies; ``create_time`` (psutil's)
        tells it from a later process that reuses the pid."""
        self._send(pid=pid, created=create_time)

    def remove(self, pattern: str) -> None:
        """Remove the files or directories matching the glob ``pattern`` if the owner dies."""
        self._send(remove=pattern)

    def run(self, argv: list[str]) -> None:
        """Run the command ``argv`` if the owner dies, after ending the processes (a batch
        job's ``scancel``: its engines are on other hosts)."""
        self._send(run=argv)

    def close(self) -> None:
        """End the watcher, touching nothing (the owner stopped the cluster itself)."""
        self._finish("close")

    def cut(self, wait_s: float = 0.0) -> None:
        """End the cluster now, as the owner's death would: the watcher ends every process and
        file it was told of, without the owner waiting for them (at exit: no polite goodbye
        that could outlast the kernel's grace period). Waits up to ``wait_s`` for it to finish."""
        if self._proc.stdin is None:
            return
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        self._proc.stdin = None
        try:
            self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass

    def release(self) -> None:
        """End the watcher, touching nothing: the cluster is detached and outlives its owner."""
        self._finish("release")

    def _finish(self, word: str) -> None:
        if self._proc.stdin is None:
            return
        try:
            self._send(end=word)
            self._proc.stdin.close()
        except OSError:  # the watcher is gone already
            pass
        self._proc.stdin = None
        try:
            self._proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# ---- the watcher process


def _tree(watched: list[psutil.Process]) -> list[psutil.Process]:
    """The watched processes still running as themselves, and all their descendants."""
    found: dict[int, psutil.Process] = {}
    for proc in watched:
        try:
            if not proc.is_running():  # gone, or the pid now names another process
                continue
            found.setdefault(proc.pid, proc)
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.Error:
            pass
    return list(found.values())


def end_everything(watched: list[psutil.Process], patterns: list[str], commands: Sequence[Sequence[str]] = ()) -> None:
    """SIGTERM, then SIGKILL after :data:`TERM_GRACE_S`, every watched process and descendant;
    then run the commands and remove the files."""
    procs = _tree(watched)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=TERM_GRACE_S)
    for proc in alive + _tree(watched):  # and whatever was forked meanwhile
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=TERM_GRACE_S)
    for argv in commands:
        try:
            subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
    for pattern in patterns:
        for path in glob.glob(pattern):
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.remove(path)
                except OSError:
                    pass


def _process(pid: int, created: float) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None
    return proc if abs(proc.create_time() - created) < 0.01 else None


def watch(owner: int) -> None:
    """The watcher's loop: read instructions until end-of-file, then end the cluster unless
    told to close or release."""
    watched: list[psutil.Process] = []
    patterns: list[str] = []
    commands: list[list[str]] = []
    stdin = sys.stdin.buffer
    pending = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if not ready:
            if os.getppid() != owner:
                break
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "end" in message:
                return
            if "pid" in message:
                proc = _process(message["pid"], message["created"])
                if proc is not None:
                    watched.append(proc)
            if "remove" in message:
                patterns.append(message["remove"])
            if "run" in message:
                commands.append(message["run"])
    end_everything(watched, patterns, commands)


if __name__ == "__main__":
    watch(int(sys.argv[1]))

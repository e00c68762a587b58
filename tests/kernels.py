"""Real Jupyter kernels for the nothing-lost tests: start one under ``jupyter_client``, run code
in it, kill it as a front end does (``restart_kernel(now=True)``), and find what outlived it.

Every process the kernel starts inherits :data:`TAG` in its environment, so leftovers are
found by the tag, whatever their parent became.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager

import psutil

TAG = "MIXLE_NOTHING_LOST_TEST"


def new_tag() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``tag``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def alive(procs) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def wait_gone(procs, timeout: float) -> tuple[list[psutil.Process], float]:
    """(the processes still alive after at most ``timeout``, seconds waited)."""
    t0 = time.monotonic()
    while (left := alive(procs)) and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    return left, time.monotonic() - t0


def kill(procs) -> None:
    """SIGKILL ``procs`` (psutil handles: a recycled pid is never hit)."""
    for proc in alive(procs):
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


@contextmanager
def kernel(tag: str):
    """A started kernel and its client, the tag in its environment. On exit the kernel is shut
    down and every process carrying the tag is killed, so a failing test leaks nothing."""
    from jupyter_client import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env={**os.environ, TAG: tag})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield manager, client
    finally:
        client.stop_channels()
        try:
            manager.shutdown_kernel(now=True)
        finally:
            kill(tagged(tag))


def run(client, code: str, timeout: float = 120) -> str:
    """Run ``code`` in the kernel; its stdout. Raises with the traceback if it failed."""
    out: list[str] = []
    errors: list[str] = []

    def hook(msg):
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            out.append(content["text"])
        elif kind == "error":
            errors.append("\n".join(content["traceback"]))

    reply = client.execute_interactive(code, output_hook=hook, timeout=timeout)
    if reply["content"]["status"] != "ok" or errors:
        raise RuntimeError(f"kernel code failed:\n{code}\n" + "\n".join(errors))
    return "".join(out)

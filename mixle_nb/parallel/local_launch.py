"""Run a function on N local processes that can form one gloo group on loopback, as under
``torchrun``: for tests, benchmarks and quick experiments without a launcher."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import random
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

PORTS = range(20000, 32768)  # below Linux's ephemeral range, so no outgoing connection holds one


def free_port() -> int:
    """A loopback port free now, outside the ephemeral range: a port the kernel hands out for
    port 0 can be taken meanwhile as the source port of any outgoing connection (a TCPStore
    client can even connect to itself on it)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {PORTS.start}-{PORTS.stop - 1}")


def _child(
    fn: Callable[..., Any], rank: int, world: int, port: int, out_path: str, kwargs: dict, stacks_at: float
) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    stacks = open(out_path + ".stacks", "w")  # where this rank was, if it is about to be killed
    faulthandler.dump_traceback_later(max(0.5, stacks_at - time.time()), file=stacks)
    import torch

    torch.set_num_threads(1)
    try:
        result = ("ok", fn(rank, world, **kwargs))
    except BaseException:  # report anything, including a failed collective, to the parent
        result = ("error", traceback.format_exc())
    with open(out_path, "wb") as f:
        pickle.dump(result, f)


def run_local(fn: Callable[..., Any], world: int, timeout: float = 180.0, **kwargs: Any) -> list:
    """``fn(rank, world, **kwargs)`` on ``world`` spawned processes; returns the per-rank results.

    ``fn`` must be importable (defined at module level). The launcher variables are set as
    torchrun sets them, so ``fn`` may let a handle create the group. Every child is joined,
    or killed once ``timeout`` seconds have passed, before this returns; if any rank failed or
    was killed, the error names every such rank, with the tracebacks.
    """
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"rank{r}.pkl") for r in range(world)]
        stacks_at = time.time() + max(1.0, timeout - 2.0)  # wall clock: the children start seconds later
        procs = [
            ctx.Process(target=_child, args=(fn, r, world, port, paths[r], kwargs, stacks_at)) for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            killed = [rank for rank, p in enumerate(procs) if p.is_alive()]
            for rank in killed:
                procs[rank].kill()
                procs[rank].join()
        results, problems = [], []
        for rank, path in enumerate(paths):
            if not os.path.exists(path):
                why = (
                    f"killed after the {timeout:g} s timeout" if rank in killed else f"exit code {procs[rank].exitcode}"
                )
                problems.append(f"rank {rank} produced no result ({why})" + _stacks(paths[rank]))
                continue
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                problems.append(f"rank {rank} failed:\n{value}")
            results.append(value)
        if problems:  # every rank's story: a hang on one rank is usually an error on another
            raise RuntimeError("\n".join(problems))
        return results


def _stacks(path: str) -> str:
    """The stacks a rank dumped just before its timeout, if it got that far."""
    try:
        with open(path + ".stacks") as f:
            text = f.read().strip()
    except OSError:
        return ""
    return f"; its threads 2 s before:\n{text}" if text else ""

"""Run a function on N local processes that can form one gloo group on loopback, as under
``torchrun``: for tests, benchmarks and quick experiments without a launcher."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import tempfile
import time
import traceback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank: int, world: int, port: int, out_path: str, kwargs: dict) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        result = ("ok", fn(rank, world, **kwargs))
    except BaseException:  # report anything, including a failed collective, to the parent
        result = ("error", traceback.format_exc())
    with open(out_path, "wb") as f:
        pickle.dump(result, f)


def run_local(fn, world: int, timeout: float = 180.0, **kwargs) -> list:
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
        procs = [ctx.Process(target=_child, args=(fn, r, world, port, paths[r], kwargs)) for r in range(world)]
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
                why = f"killed after the {timeout:g} s timeout" if rank in killed else f"exit code {procs[rank].exitcode}"
                problems.append(f"rank {rank} produced no result ({why})")
                continue
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                problems.append(f"rank {rank} failed:\n{value}")
            results.append(value)
        if problems:  # every rank's story: a hang on one rank is usually an error on another
            raise RuntimeError("\n".join(problems))
        return results

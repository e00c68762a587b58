"""A task of a Slurm step (``srun python script.py``): its rank, world, store address and device.

Slurm tells each task who it is (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``) and where
the step runs (``SLURM_STEP_NODELIST``, or the job's ``SLURM_JOB_NODELIST``). :func:`launcher_variables`
turns that into torch's env:// variables, so a handle joins the group exactly as under
``torchrun``: rank 0 (on the first node of the list, Slurm's block distribution) serves the
store at a port chosen from the job id. Variables already set win (a ``torchrun`` inside a
Slurm job, or ``MASTER_PORT`` given by hand).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

PORT_BASE, PORT_SPAN = 15000, 20000  # the store's port: PORT_BASE + job id mod PORT_SPAN
_BRACKETS = re.compile(r"^([^\[,]*)\[([^\]]+)\]")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``node[07-09,12],gpu1`` -> ``node07``."""
    nodelist = nodelist.strip()
    match = _BRACKETS.match(nodelist)
    if match is None:
        return nodelist.split(",")[0]
    prefix, ranges = match.groups()
    return prefix + ranges.split(",")[0].split("-")[0]  # keeps the zero padding


def in_slurm_step(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a task of a Slurm step with a world to join."""
    return all(v in env for v in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")) and (
        "SLURM_STEP_NODELIST" in env or "SLURM_JOB_NODELIST" in env
    )


def launcher_variables(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` of this Slurm
    task (those already in ``env`` kept); empty outside a Slurm step."""
    if not in_slurm_step(env):
        return {}
    nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
    derived = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": first_host(nodelist),
        "MASTER_PORT": str(PORT_BASE + int(env["SLURM_JOB_ID"]) % PORT_SPAN),
    }
    return {k: env.get(k, v) for k, v in derived.items()}


def task_device(env: Mapping[str, str] = os.environ, device_count: int | None = None) -> int:
    """The CUDA device index this task uses. Under ``--gpus-per-task=1`` (or any binding that
    leaves one visible GPU) it is 0, the task's only GPU; with several visible GPUs shared by
    the node's tasks, the task's ``SLURM_LOCALID``. ``device_count`` defaults to torch's."""
    local = int(env.get("SLURM_LOCALID", env.get("LOCAL_RANK", "0")))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
    elif device_count is not None:
        count = device_count
    else:
        import torch

        count = torch.cuda.device_count()
    if count == 1:
        return 0
    if local < count:
        return local
    raise ValueError(
        f"task {env.get('SLURM_PROCID', '?')} (local rank {local}) sees {count} GPUs: "
        "nccl needs one GPU per task; ask for --gpus-per-task=1 or fewer tasks per node"
    )

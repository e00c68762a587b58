"""The notebook's cluster: ipyparallel engines that form one torch.distributed group.

Modules, one concept each: ``mixle_cluster`` (the lifecycle, forming the group, detach and
attach), ``rank_calls`` (the data API it inherits), ``supervision`` (liveness, interrupts,
stopping calls, repairing the group), ``launch`` (the launcher's options, checked),
``engine_processes`` (the controller, engines, Slurm job and lifeline of one cluster),
``detached`` (a detached cluster's record), ``calls`` (a call on the ranks and its errors),
``processes`` (process ownership, liveness, reaping), ``engine`` (what the cluster runs on its
engines), ``rank_side`` (what the panels run on the ranks), ``step_calls`` (EM steps in
pipelined calls, both halves), ``status`` (the status table), ``state`` (the lifecycle states).
This module keeps the current cluster.
"""

from __future__ import annotations

from .calls import RankCall, RankDiedError, RankError
from .detached import DetachedRecord
from .mixle_cluster import BACKENDS, MAX_ENGINES, MixleCluster
from .state import ClusterState
from .status import ClusterStatus, RankStatus

_current = None  # the most recently started cluster that is still running


def current() -> MixleCluster | None:
    """The most recently started cluster that is still running, or None."""
    return _current


def set_current(cluster: MixleCluster | None) -> None:
    """Make ``cluster`` the one that :func:`current` returns (None clears it)."""
    global _current
    _current = cluster


__all__ = [
    "BACKENDS",
    "MAX_ENGINES",
    "ClusterState",
    "ClusterStatus",
    "DetachedRecord",
    "MixleCluster",
    "RankCall",
    "RankDiedError",
    "RankError",
    "RankStatus",
    "current",
    "set_current",
]

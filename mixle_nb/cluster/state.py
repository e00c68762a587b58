"""The states a :class:`~mixle_nb.cluster.MixleCluster` moves through."""

from __future__ import annotations

from enum import Enum


class ClusterState(str, Enum):
    """``new`` -> ``starting`` -> ``running`` -> ``stopped``; ``broken`` until ``restart()``.

    A ``str`` enum, so ``cluster.state == "running"`` keeps reading naturally.
    """

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    BROKEN = "broken"  # a rank died, or an interrupt left a rank running: restart() recovers
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value

    @property
    def has_processes(self) -> bool:
        """Whether engines exist that ``stop()`` must end."""
        return self in (ClusterState.RUNNING, ClusterState.BROKEN)

"""The states a :class:`~mixle_nb.cluster.MixleCluster` moves through."""

from __future__ import annotations

from enum import Enum


class ClusterState(str, Enum):
    """The states a :class:`~mixle_nb.cluster.MixleCluster` moves through.

    ``new`` -> ``starting`` -> ``running`` -> ``stopped``; ``broken`` until ``restart()``. A
    ``str`` enum, so ``cluster.state == "running"`` keeps reading naturally.

    Attributes
    ----------
    NEW : str
        Built, nothing started yet.
    STARTING : str
        :meth:`~mixle_nb.cluster.MixleCluster.start` is launching the processes.
    RUNNING : str
        The engines run and form one group.
    BROKEN : str
        A rank died, or an interrupt left a rank running: ``restart()`` recovers.
    STOPPED : str
        Every process has ended.

    Examples
    --------
    >>> from mixle_nb.cluster import ClusterState, MixleCluster
    >>> MixleCluster(2).state == "new"
    True
    >>> ClusterState.BROKEN.has_processes
    True
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

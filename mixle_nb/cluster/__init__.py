"""The notebook's cluster: ipyparallel engines that form one torch.distributed group.

Modules, one concept each: ``mixle_cluster`` (the lifecycle, forming the group, detach and
attach), ``rank_calls`` (the data API it inherits), ``supervision`` (liveness, interrupts,
stopping calls, repairing the group), ``launch`` (the launcher's options, checked),
``engine_processes`` (the controller, engines, Slurm job and lifeline of one cluster),
``detached`` (a detached cluster's record), ``calls`` (a call on the ranks and its errors),
``processes`` (process ownership, liveness, reaping), ``engine`` (what the cluster runs on its
engines), ``rank_side`` (what the panels run on the ranks), ``step_calls`` (EM steps in
pipelined calls, both halves), ``status`` (the status table), ``state`` (the lifecycle states).
This module keeps the current cluster. Its other public names are imported on first use
(a module ``__getattr__``): an engine imports only what it runs (``engine``, ``rank_side``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import lazy_names

if TYPE_CHECKING:
    from .calls import RankCall, RankDiedError, RankError
    from .detached import DetachedRecord
    from .mixle_cluster import BACKENDS, MAX_ENGINES, MixleCluster
    from .state import ClusterState
    from .status import ClusterStatus, RankStatus

# each public name but the two below and the module (in this package) that defines it
_HOMES = {
    "BACKENDS": ".mixle_cluster",
    "MAX_ENGINES": ".mixle_cluster",
    "ClusterState": ".state",
    "ClusterStatus": ".status",
    "DetachedRecord": ".detached",
    "MixleCluster": ".mixle_cluster",
    "RankCall": ".calls",
    "RankDiedError": ".calls",
    "RankError": ".calls",
    "RankStatus": ".status",
}

_current = None  # the most recently started cluster that is still running


def current() -> MixleCluster | None:
    """The most recently started cluster that is still running.

    The magics, the panels and the scikit-learn face use it when no cluster is named.

    Returns
    -------
    MixleCluster or None
        The current cluster, or ``None`` when none runs.

    See Also
    --------
    set_current : Change it.

    Examples
    --------
    >>> from mixle_nb import cluster
    >>> cluster.current() is None  # nothing started in this process
    True
    """
    return _current


def set_current(cluster: MixleCluster | None) -> None:
    """Make ``cluster`` the one that :func:`current` returns.

    :meth:`MixleCluster.start` and :meth:`MixleCluster.attach` call it; ``stop()`` clears it.

    Parameters
    ----------
    cluster : MixleCluster or None
        The cluster to make current; ``None`` clears it.

    Examples
    --------
    >>> from mixle_nb import cluster
    >>> c = cluster.MixleCluster(2)
    >>> cluster.set_current(c)
    >>> cluster.current() is c
    True
    >>> cluster.set_current(None)
    >>> cluster.current() is None
    True
    """
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


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

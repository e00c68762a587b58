"""Detached clusters: what a new kernel needs to attach to a cluster that outlived its owner.

A detached cluster's ipyparallel connection files stay in its profile's ``security`` folder
(``cluster-<id>.json``, ``ipcontroller-<id>-client.json``); beside them this module keeps
``mixle-<id>.json``, a :class:`DetachedRecord`: the cluster's settings, its ranks and its group
(backend, rendezvous folder, generation), which the cluster writes and rebuilds itself from.
The profile lives in the user's home, so :func:`detached_clusters` lists this user's. An entry
whose controller has exited is stale and removed when listed.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

import psutil

PREFIX = "mixle-"


def record_path(profile_dir: str, cluster_id: str) -> str:
    """Where the record of cluster ``cluster_id`` of the profile ``profile_dir`` is kept."""
    return os.path.join(profile_dir, "security", f"{PREFIX}{cluster_id}.json")


@dataclass(frozen=True)
class RankRecord:
    """The engine behind one rank, as detached: its pid, its host and how many GPUs it sees."""

    pid: int
    host: str
    gpus: int


@dataclass(frozen=True)
class DetachedRecord:
    """What a new process needs to attach to a detached cluster.

    :class:`~mixle_nb.cluster.MixleCluster` produces it when detached and rebuilds itself from
    it in :meth:`~mixle_nb.cluster.MixleCluster.attach`; here it is only written, read, listed
    and chosen. Its JSON form (:meth:`as_dict`) is what :meth:`MixleCluster.list_detached`
    returns.

    Parameters
    ----------
    cluster_id, profile_dir : str
        The ipyparallel cluster and the profile whose ``security`` folder holds its files.
    n : int
        The number of ranks.
    backend : str
        The backend asked for (:class:`~mixle_nb.cluster.MixleCluster`'s ``backend``).
    timeout : float
        The cluster's collective timeout, in seconds.
    threads : int
        The threads of each engine.
    launcher : str
        The ipyparallel launcher that started the engines.
    group_backend : str or None
        The backend its group formed with.
    store_dir : str or None
        The ``FileStore`` rendezvous folder (single host), else None.
    group_generation : int
        How many times the group formed (each forming uses a fresh store file).
    controller_pid : int
        The controller's pid, on ``host``.
    host : str
        The host the cluster was started from.
    ranks : tuple of RankRecord
        Rank r's engine is ``ranks[r]``: its pid, host and number of GPUs.
    detached_at : float
        When it was detached (epoch seconds).
    detached_by : int
        The pid of the process that detached it.

    See Also
    --------
    MixleCluster.detach, MixleCluster.attach, MixleCluster.list_detached

    Examples
    --------
    A record survives its JSON form:

    >>> from mixle_nb.cluster import DetachedRecord
    >>> from mixle_nb.cluster.detached import RankRecord
    >>> record = DetachedRecord(
    ...     cluster_id="1700000000-abcd", profile_dir="/tmp/profile_mixle", n=2, backend="auto",
    ...     timeout=60.0, threads=1, launcher="local", group_backend="gloo", store_dir=None,
    ...     group_generation=1, controller_pid=4242, host="node1",
    ...     ranks=(RankRecord(4243, "node1", 0), RankRecord(4244, "node1", 0)),
    ...     detached_at=1700000000.0, detached_by=4241,
    ... )
    >>> record.as_dict()["ranks"]
    [[4243, 'node1', 0], [4244, 'node1', 0]]
    >>> DetachedRecord.from_dict(record.as_dict()) == record
    True
    """

    cluster_id: str
    profile_dir: str
    n: int
    backend: str
    timeout: float
    threads: int
    launcher: str
    group_backend: str | None
    store_dir: str | None
    group_generation: int
    controller_pid: int
    host: str
    ranks: tuple[RankRecord, ...]
    detached_at: float
    detached_by: int

    @property
    def path(self) -> str:
        """The record's file."""
        return record_path(self.profile_dir, self.cluster_id)

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON values.

        Returns
        -------
        dict
            One entry per field; ``ranks`` as ``[pid, host, gpus]`` lists.
        """
        values = asdict(self)
        values["ranks"] = [[r.pid, r.host, r.gpus] for r in self.ranks]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DetachedRecord:
        """The record of :meth:`as_dict`'s values.

        Parameters
        ----------
        values : dict
            JSON values, as :meth:`as_dict` gives them.

        Returns
        -------
        DetachedRecord
            The record.

        Raises
        ------
        ValueError
            A field missing, unknown, or of the wrong type.
        """
        names = {f.name for f in fields(cls)}
        if set(values) != names:
            raise ValueError(
                f"not a detached cluster's record: missing {sorted(names - set(values))}, "
                f"unknown {sorted(set(values) - names)}"
            )
        try:
            ranks = tuple(RankRecord(int(pid), str(host), int(gpus)) for pid, host, gpus in values["ranks"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a detached cluster's ranks must be [pid, host, gpus] lists ({exc})") from None
        record = cls(**{**values, "ranks": ranks})
        for f in fields(cls):
            kinds = _FIELD_TYPES.get(f.name)
            if kinds is not None and not isinstance(getattr(record, f.name), kinds):
                raise ValueError(f"a detached cluster's {f.name} must be {kinds}; got {getattr(record, f.name)!r}")
        return record

    def write(self) -> str:
        """Write the record atomically (a reader never sees half of it).

        Returns
        -------
        str
            The path written, :attr:`path`.
        """
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump(self.as_dict(), f)
        os.replace(temporary, self.path)
        return self.path

    @classmethod
    def read(cls, path: str) -> DetachedRecord:
        """The record in a file.

        Parameters
        ----------
        path : str
            A file :meth:`write` wrote.

        Returns
        -------
        DetachedRecord
            The record.

        Raises
        ------
        OSError
            The file cannot be read.
        ValueError
            It holds no valid record.
        """
        with open(path) as f:
            values = json.load(f)
        if not isinstance(values, dict):
            raise ValueError(f"{path} holds no detached cluster's record")
        return cls.from_dict(values)

    def controller_alive(self) -> bool:
        """Whether its controller still runs (on this host).

        Returns
        -------
        bool
            False once the controller's process has ended (or is a zombie).
        """
        try:
            return psutil.Process(self.controller_pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "cluster_id": str,
    "profile_dir": str,
    "n": int,
    "backend": str,
    "timeout": (int, float),
    "threads": int,
    "launcher": str,
    "group_backend": (str, type(None)),
    "store_dir": (str, type(None)),
    "group_generation": int,
    "controller_pid": int,
    "host": str,
    "detached_at": (int, float),
    "detached_by": int,
}


def detached_clusters(profile_dir: str | None = None) -> list[DetachedRecord]:
    """The records of this user's detached clusters whose controller still runs, oldest first
    (``profile_dir``: ipyparallel's default profile unless given). A record whose controller
    has exited is removed; an unreadable file is skipped."""
    if profile_dir is None:
        from IPython.paths import get_ipython_dir

        profile_dir = os.path.join(get_ipython_dir(), "profile_default")
    records = []
    for path in glob.glob(os.path.join(profile_dir, "security", f"{PREFIX}*.json")):
        try:
            record = DetachedRecord.read(path)
        except (OSError, ValueError):
            continue
        if record.controller_alive():
            records.append(record)
        else:  # its controller is gone: nothing to attach to
            try:
                os.remove(path)
            except OSError:
                pass
    return sorted(records, key=lambda r: r.detached_at)


def choose(records: list[DetachedRecord], cluster_id: str | None) -> DetachedRecord:
    """The record to attach to: ``cluster_id``'s, or the only one.

    Raises
    ------
    LookupError
        No record has ``cluster_id``; or, without one, none or several run.
    """
    if cluster_id is not None:
        chosen = [r for r in records if r.cluster_id == cluster_id]
        if not chosen:
            raise LookupError(
                f"no detached mixle cluster has id {cluster_id!r}; running ones: "
                f"{[r.cluster_id for r in records] or 'none'}"
            )
        return chosen[0]
    if not records:
        raise LookupError(
            "no detached mixle cluster is running (start one with detached=True, or %mixle_cluster start N --detach)"
        )
    if len(records) > 1:
        raise LookupError(
            f"{len(records)} detached mixle clusters run; say which: cluster_id= one of "
            f"{[r.cluster_id for r in records]}"
        )
    return records[0]

"""Detached clusters: what a new kernel needs to attach to a cluster that outlived its owner.

A detached cluster's ipyparallel connection files stay in its profile's ``security`` folder
(``cluster-<id>.json``, ``ipcontroller-<id>-client.json``); beside them this module keeps
``mixle-<id>.json``: the cluster's settings, its ranks and its group (backend, rendezvous
folder, generation). The profile lives in the user's home, so :func:`detached_clusters` lists
this user's. An entry whose controller has exited is stale and removed when listed.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time

import psutil

from . import engine
from .processes import RankProcess

PREFIX = "mixle-"


def record_path(profile_dir: str, cluster_id: str) -> str:
    return os.path.join(profile_dir, "security", f"{PREFIX}{cluster_id}.json")


def write_record(cluster) -> str:
    """Write ``cluster``'s record (it is being detached); its path."""
    ipp = cluster._ipp
    record = {
        "cluster_id": ipp.cluster_id,
        "profile_dir": ipp.profile_dir,
        "n": cluster.n,
        "backend": cluster.backend,
        "timeout": cluster.timeout,
        "threads": cluster.threads,
        "launcher": cluster.launcher,
        "group_backend": cluster.group_backend,
        "store_dir": cluster._store_dir,
        "group_generation": cluster._group_generation,
        "controller_pid": ipp.controller.pid,
        "host": cluster._here,
        "ranks": [[r.pid, r.host, r.gpus] for _, r in sorted(cluster._ranks.items())],
        "detached_at": time.time(),
        "detached_by": os.getpid(),
    }
    path = record_path(ipp.profile_dir, ipp.cluster_id)
    with open(path, "w") as f:
        json.dump(record, f)
    return path


def _controller_alive(record: dict) -> bool:
    try:
        return psutil.Process(record["controller_pid"]).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def detached_clusters(profile_dir: str | None = None) -> list[dict]:
    """The records of this user's detached clusters whose controller still runs, oldest first
    (``profile_dir``: ipyparallel's default profile unless given)."""
    if profile_dir is None:
        from IPython.paths import get_ipython_dir

        profile_dir = os.path.join(get_ipython_dir(), "profile_default")
    records = []
    for path in glob.glob(os.path.join(profile_dir, "security", f"{PREFIX}*.json")):
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if _controller_alive(record):
            records.append(record)
        else:  # its controller is gone: nothing to attach to
            try:
                os.remove(path)
            except OSError:
                pass
    return sorted(records, key=lambda r: r["detached_at"])


def choose(records: list[dict], cluster_id: str | None) -> dict:
    """The record to attach to: ``cluster_id``'s, or the only one."""
    if cluster_id is not None:
        chosen = [r for r in records if r["cluster_id"] == cluster_id]
        if not chosen:
            raise LookupError(
                f"no detached mixle cluster has id {cluster_id!r}; running ones: "
                f"{[r['cluster_id'] for r in records] or 'none'}"
            )
        return chosen[0]
    if not records:
        raise LookupError(
            "no detached mixle cluster is running (start one with detached=True, or %mixle_cluster start N --detach)"
        )
    if len(records) > 1:
        raise LookupError(
            f"{len(records)} detached mixle clusters run; say which: cluster_id= one of "
            f"{[r['cluster_id'] for r in records]}"
        )
    return records[0]


def reconnect(cluster, record: dict) -> None:
    """Give the new ``cluster`` object the detached cluster of ``record``: its ipyparallel
    cluster and client, its ranks (checked to be the engines detached), its local processes and
    its group's settings."""
    import ipyparallel as ipp

    cluster._ipp = ipp.Cluster.from_file(
        cluster_id=record["cluster_id"],
        profile_dir=record["profile_dir"],
        log_level=logging.WARNING,
        shutdown_atexit=False,
    )
    cluster.client = cluster._ipp.connect_client_sync()
    cluster.client.wait_for_engines(cluster.n, timeout=cluster._ipp.engine_timeout)
    ranks = {r: RankProcess(pid, host, gpus) for r, (pid, host, gpus) in enumerate(record["ranks"])}
    described = cluster.client[list(range(cluster.n))].apply_sync(engine.describe)
    for r, info in enumerate(described):
        rank = ranks[r]
        if (rank.pid, rank.host) != (info["pid"], info["host"]):
            raise RuntimeError(
                f"engine {r} is pid {info['pid']} on {info['host']}, not the rank "
                f"detached ({rank.pid} on {rank.host}): the cluster was changed since"
            )
        if rank.host == cluster._here:
            cluster._processes.own(rank.pid)
            rank.process = cluster._processes.get(rank.pid)
    cluster._processes.own(record["controller_pid"])
    cluster._processes.own_children()
    cluster._ranks = ranks
    cluster._store_dir, cluster.group_backend = record["store_dir"], record["group_backend"]
    cluster._group_generation = record["group_generation"]
    cluster._record = record_path(record["profile_dir"], record["cluster_id"])

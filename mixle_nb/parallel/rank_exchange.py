"""What the stats-level starts and per-observation scores need from a TorchRunEncodedData's
group: sums and gathers over its ranks, its statistics fold, and whole arrays put back in the
original observation order (rank ``r`` holds observations ``r, r + world, ...``)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..stats.base import Estimator
from .fail_together import raise_together


class HandleExchange:
    """The :class:`mixle_nb.stats.kmeans.Exchange` of a TorchRunEncodedData's ranks, plus a
    gather (its own collectives, so timeouts and the small-vector fast path are the handle's)."""

    def __init__(self, handle: Any):
        self._handle = handle
        self.rank, self.world = handle.rank, handle.world

    def sum(self, numbers: Any) -> np.ndarray:
        return self._handle._sum_across_ranks(numbers)

    def gather(self, obj: Any) -> list:
        """Every rank's ``obj`` in rank order, on every rank."""
        return self._handle._all_gather(obj)

    def fold(self, estimator: Estimator, count: float, acc: Any) -> float:
        return self._handle._fold(estimator, count, acc, float("nan"))[0]


def in_order(parts: list, interleaved: bool) -> np.ndarray:
    """Every rank's rows in the original order: interleaved (rank ``r``'s at ``r, r + world,
    ...``) or, for shards of consecutive blocks, concatenated in rank order."""
    return interleave(parts) if interleaved else np.concatenate([np.asarray(p) for p in parts])


def interleave(parts: list) -> np.ndarray:
    """Rank ``r``'s rows at positions ``r, r + world, ...``: the original order of data that
    was sharded as ``data[rank::world]``."""
    parts = [np.asarray(p) for p in parts]
    out = np.empty((sum(len(p) for p in parts),) + parts[0].shape[1:], dtype=np.result_type(*parts))
    for rank, part in enumerate(parts):
        out[rank :: len(parts)] = part
    return out


def map_shard(handle: Any, function: Callable[[Any], np.ndarray], gather: bool = False) -> np.ndarray:
    """``function(enc)`` over the rank's encoded chunks, concatenated in shard order.

    ``gather=True`` returns every rank's rows in the original observation order, on every
    rank; a rank whose ``function`` raised sends its error in that gather instead, and every
    rank raises together (the failed rank its own error, the others PeerRankError)."""
    if not gather:
        return np.concatenate([np.asarray(function(enc)) for enc in handle.chunks])
    try:
        local, error = np.concatenate([np.asarray(function(enc)) for enc in handle.chunks]), None
    except Exception as exc:  # carried in the gather, so no peer waits for this rank
        local, error = None, exc
    exchange = HandleExchange(handle)
    parts = exchange.gather(None if error is not None else local)
    if error is not None or any(p is None for p in parts):
        raise_together(error, handle.group, handle.world, "scoring the shards")
    return in_order(parts, getattr(handle, "interleaved", True))

"""Per-observation results of a TorchRunEncodedData, put back in the original observation order
(logical shard ``s`` of ``S`` holds observations ``s, s + S, ...``; on in-memory data shard ``s``
is rank ``s``'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .exchange import StatusCheck


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
    rank raises together (the failed rank its own error, the others PeerRankError).
    Interleaved handles send each logical shard's rows, put back in shard order whichever rank
    holds which shard; others (``interleaved=False``) each chunk's, put back at its origin
    (``chunk_origins``: a shard's block, a file's part), empty chunks left out."""
    if not gather:
        return np.concatenate([np.asarray(function(enc)) for enc in handle.chunks])
    interleaved = getattr(handle, "interleaved", True)
    try:
        if interleaved:
            local = [
                (shard, np.concatenate([np.asarray(function(enc)) for enc in handle.chunks[first:end]]))
                for shard, first, end in handle.shard_chunks
                if end > first
            ]
        else:
            local = [
                (origin, np.asarray(function(enc)))
                for enc, origin in zip(handle.chunks, handle.chunk_origins)
                if origin is not None
            ]
        error = None
    except Exception as exc:  # carried in the gather, so no peer waits for this rank
        local, error = None, exc
    parts = handle.exchange.gather(None if error is not None else local)
    if error is not None or any(p is None for p in parts):
        handle.exchange.settle(StatusCheck("scoring the shards"), error)
    rows = [rows for _, rows in sorted((pair for held in parts for pair in held), key=lambda pair: pair[0])]
    return interleave(rows) if interleaved else np.concatenate(rows)
